"""One key per stage: which edit (config field, project code, user code) reruns which stages.

The table test chains the stages' real keys the way the flow does: each stage's output fingerprint is taken to
change exactly when its key does (a rerun writes a new result), so an edit reruns its stage and everything
downstream of it, and nothing else.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from grpo_pipeline.configs.schema import HELDOUT, EvalConfig, load_config
from grpo_pipeline.flows.inputs import sft_bar
from grpo_pipeline.tasks.core import stage as stage_mod
from grpo_pipeline.tasks.core.common import Checkpoint, DatasetRefs, Ref
from grpo_pipeline.tasks.core.stage import RunContext, code_version, module_closure, user_code
from grpo_pipeline.tasks.data import prepare_data
from grpo_pipeline.tasks.evaluate import evaluate
from grpo_pipeline.tasks.grpo import GRPORound, grpo_train
from grpo_pipeline.tasks.model import prepare_base_model
from grpo_pipeline.tasks.register import register_policy
from grpo_pipeline.tasks.scoring.results import EvalResult
from grpo_pipeline.tasks.sft import sft_warmup
from grpo_pipeline.tasks.validate import validate_data

ROOT = Path(__file__).resolve().parents[1]
ALL = ["data", "validate", "base", "sft", "eval-sft", "grpo-r1", "eval-r1", "register-r1"]
NOT_BASE = [s for s in ALL if s != "base"]  # the base model does not depend on the data


def stage_keys(overrides: list[str], run_dir: str = "/tmp/runs") -> dict[str, str]:
    """Every stage's key for a config, with each output's fingerprint derived from its stage's key."""
    cfg = load_config(ROOT / "configs/tiny-arith.yaml", [f"run_dir={run_dir}", "grpo.rounds=1", *overrides])
    ctx = RunContext.of(cfg)
    keys: dict[str, str] = {}

    def key(name: str, fn, /, *args, **kwargs) -> str:
        params = fn.__signature__.bind(*args, **kwargs)
        params.apply_defaults()
        keys[name] = fn.stage.key(params.arguments)
        return keys[name]

    k = key("data", prepare_data, cfg.data, cfg.run_dir)
    data = DatasetRefs(
        train=Ref(path="train", fingerprint=f"train-{k}"), eval=Ref(path="eval", fingerprint=f"eval-{k}")
    )
    key("validate", validate_data, data, cfg.data)
    base = Checkpoint(path="base", fingerprint=key("base", prepare_base_model, cfg.model, cfg.run_dir, cfg.seed))
    bar = sft_bar(cfg, data)  # what SFT's probe reads, with sft.stop_at_accuracy
    sft = Checkpoint(path="sft", fingerprint=key("sft", sft_warmup, base, data.train, cfg.sft, cfg.model, ctx, **bar))

    def evaluated(label: str, policy: Checkpoint) -> EvalResult:
        suite = cfg.eval.for_suite(HELDOUT)
        return fake_result(
            key(f"eval-{label}", evaluate, policy, data.eval, suite, ctx, label=label, rewards=cfg.grpo.rewards)
        )

    baseline = evaluated("sft", sft)
    policy = Checkpoint(
        path="r1",
        fingerprint=key(
            "grpo-r1",
            grpo_train,
            GRPORound(
                start=sft,
                train=data.train,
                cfg=cfg.grpo,
                model_cfg=cfg.model,
                round_index=1,
                ctx=ctx,
                held_out=data.eval,
                correctness_reward=cfg.eval.correctness_reward,
            ),
        ),
        run_id="run",
    )
    result = evaluated("r1", policy)
    key("register-r1", register_policy, policy, result, baseline, cfg.registry, ctx, cfg.to_yaml(), {"t": cfg.name})
    return keys


def fake_result(key: str) -> EvalResult:
    return EvalResult(
        model=key,
        accuracy=0.5,
        accuracy_ci=(0.0, 1.0),
        pass_at_k={"1": 0.5},
        num_problems=1,
        n_samples=1,
        temperature=1.0,
        top_p=1.0,
        max_new_tokens=1,
        seed=0,
        eval_fingerprint="eval",
        eval_path="eval",
        config=EvalConfig(n_samples=1, k=[1]),
        items_path=key,
    )


def rerun(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return [s for s in before if before[s] != after[s]]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("data.num_train=4000", NOT_BASE),
        ("data.synthetic.teacher_carry_slip=0.25", NOT_BASE),
        ("model.dtype=bfloat16", ALL[2:]),  # once shared a directory with the float32 model
        ("model.tiny.num_layers=2", ALL[2:]),
        ("seed=1", ALL[2:]),  # data has its own seed (data.seed)
        ("sft.learning_rate=1e-3", ALL[3:]),
        ("grpo.learning_rate=3e-4", ["grpo-r1", "eval-r1", "register-r1"]),
        # the rewards' means are eval metrics too
        ("grpo.rewards=[{name: correctness}]", ["eval-sft", "grpo-r1", "eval-r1", "register-r1"]),
        ("eval.n_samples=16", ["eval-sft", "eval-r1", "register-r1"]),
        ("eval.correctness_reward=digit_match", ALL[3:]),  # SFT's bar (sft.stop_at_accuracy) and GRPO's probe
        ("registry.model_name=other", ["register-r1"]),
        ("registry.min_delta=0.01", ["register-r1"]),
        ("registry.experiment=other", ALL[3:]),  # the MLflow runs move to another experiment
        ("name=renamed", ALL[3:]),  # MLflow run names
        ("run_dir=/tmp/elsewhere", ALL),
        ("sft.save_every_steps=7", []),  # how often a stage checkpoints does not change what it computes
        ("grpo.keep_checkpoints=5", []),
    ],
)
def test_config_edit_reruns_exactly(override: str, expected: list[str]) -> None:
    assert rerun(stage_keys([]), stage_keys([override])) == expected


def test_adding_a_suite_reruns_no_other_evaluation() -> None:
    """A suite's evaluation is keyed by its own settings (EvalConfig.for_suite): adding, changing or removing another
    suite leaves the held-out evaluations, and every training stage, cached."""
    extra = "eval.suites=[{name: heldout}, {name: units, source: synthetic, synthetic: {max_digits: 1}}]"
    assert rerun(stage_keys([]), stage_keys([extra])) == []
    other = "eval.suites=[{name: heldout}, {name: units, source: synthetic, synthetic: {max_digits: 1}, n_samples: 16}]"
    assert rerun(stage_keys([extra]), stage_keys([other])) == []


@pytest.mark.parametrize(
    ("override", "reruns_sft"),
    [("eval.max_new_tokens=12", True), ("eval.tools=[calculator]", True), ("eval.temperature=0.5", False),
     ("eval.top_p=0.9", False), ("grpo.max_completion_tokens=12", False)],
)  # fmt: skip
def test_the_sft_bar_is_keyed_by_the_completions_its_probe_decodes(override: str, reruns_sft: bool) -> None:
    """With sft.stop_at_accuracy (the recipe's), SFT's probe reads evaluation's completions (eval.sampling) decoded
    greedily: their length and tools rerun SFT; pass@k's sampling settings and GRPO's rollouts do not."""
    assert (stage_keys([])["sft"] != stage_keys([override])["sft"]) is reruns_sft
    unbarred = ["sft.stop_at_accuracy=null"]
    assert stage_keys(unbarred)["sft"] == stage_keys([*unbarred, override])["sft"]  # without it, none keys SFT


def test_unchanged_config_keeps_every_key() -> None:
    assert stage_keys([]) == stage_keys([])


def test_where_the_recipe_lives_changes_no_key() -> None:
    # code_dir only says where to import the user's modules from; their source is keyed, not their location
    assert stage_keys(["code_dir=/somewhere/else"]) == stage_keys([])


def test_output_directory_is_named_by_the_key(tmp_path: Path) -> None:
    cfg = load_config(None, [f"run_dir={tmp_path}"])
    refs = prepare_data(cfg.data, cfg.run_dir)
    key = prepare_data.stage.key({"cfg": cfg.data, "run_dir": cfg.run_dir})
    assert Path(refs.train.path).parent == tmp_path / "data" / key[:12]


# ----------------------------------------------------------------------------- project code


@pytest.mark.parametrize(
    ("stage_module", "uses", "does_not_use"),
    [
        (
            "grpo_pipeline.tasks.data",
            ["grpo_pipeline.configs.schema", "grpo_pipeline.tasks.core.common"],
            ["grpo_pipeline.rewards.format", "grpo_pipeline.tasks.training.trainer"],
        ),
        (
            "grpo_pipeline.tasks.sft",
            ["grpo_pipeline.tasks.training.trainer", "grpo_pipeline.tasks.core.tracking"],
            ["grpo_pipeline.rewards.format", "grpo_pipeline.tasks.evaluate"],
        ),
        (
            "grpo_pipeline.tasks.grpo",
            [
                "grpo_pipeline.tasks.training.trainer",
                "grpo_pipeline.rewards.format",
                "grpo_pipeline.rewards.sandbox",
                "grpo_pipeline.rewards.harness.server",
            ],
            [],
        ),
        (
            "grpo_pipeline.tasks.evaluate",
            ["grpo_pipeline.rewards.math", "grpo_pipeline.tasks.scoring.metrics"],
            # the trainer scaffold too: editing it reruns training, not every evaluation
            [
                "grpo_pipeline.tasks.sft",
                "grpo_pipeline.tasks.grpo",
                "grpo_pipeline.tasks.register",
                "grpo_pipeline.tasks.training.trainer",
            ],
        ),
    ],
)
def test_stage_code_covers_what_the_stage_imports(stage_module: str, uses: list[str], does_not_use: list[str]):
    closure = module_closure(stage_module)
    assert set(uses) <= closure, set(uses) - closure
    assert not set(does_not_use) & closure


def test_editing_a_module_changes_the_code_version_of_its_importers_only(tmp_path, monkeypatch):
    files = {
        "grpo_pipeline.tasks.a": "from grpo_pipeline.tasks import b\n",
        "grpo_pipeline.tasks.b": "from .c import helper\n",
        "grpo_pipeline.tasks.c": "def helper():\n    return 1\n",
        "grpo_pipeline.tasks.d": "import grpo_pipeline.tasks.b\n",
        "grpo_pipeline.tasks.e": "x = 1\n",
    }
    paths = {}
    for name, text in files.items():
        paths[name] = tmp_path / f"{name.rsplit('.', 1)[1]}.py"
        paths[name].write_text(text)
    monkeypatch.setattr(stage_mod, "package_modules", lambda: paths)

    def versions() -> dict[str, str]:
        code_version.cache_clear()
        return {name.rsplit(".", 1)[1]: code_version(name) for name in files}

    before = versions()
    paths["grpo_pipeline.tasks.c"].write_text("def helper():\n    return 2\n")
    after = versions()
    code_version.cache_clear()
    assert [m for m in before if before[m] != after[m]] == ["a", "b", "c", "d"]


def test_a_moved_module_still_keys_the_stages_that_import_it(tmp_path, monkeypatch):
    """Modules in subpackages (tasks/training/trainer.py) are part of the closure of the stages that import them."""
    real = stage_mod.package_modules()
    assert "grpo_pipeline.tasks.training.trainer" in real and "grpo_pipeline.tasks.core.stage" in real
    edited = tmp_path / "trainer.py"
    edited.write_text(real["grpo_pipeline.tasks.training.trainer"].read_text() + "\nEDITED = 1\n")
    stages = ["grpo_pipeline.tasks.data", "grpo_pipeline.tasks.sft", "grpo_pipeline.tasks.grpo"]
    code_version.cache_clear()
    before = {m: code_version(m) for m in stages}
    monkeypatch.setattr(stage_mod, "package_modules", lambda: {**real, "grpo_pipeline.tasks.training.trainer": edited})
    code_version.cache_clear()
    after = {m: code_version(m) for m in stages}
    code_version.cache_clear()
    assert [m.rsplit(".", 1)[1] for m in stages if before[m] != after[m]] == ["sft", "grpo"]


MODULE = '''"""A module."""

from pydantic import BaseModel, Field


class Section(BaseModel):
    """A section."""

    steps: int = Field(default=3, ge=1, description="Optimizer steps.")


def double(x: int) -> int:
    """Twice x."""
    return 2 * x  # the factor
'''


@pytest.mark.parametrize(
    ("old", "new", "reruns"),
    [
        ("# the factor", "# the factor, see the paper", False),
        ('"""Twice x."""', '"""Twice x, as in eq. 2."""', False),
        ('"""A module."""', '"""A module of the pipeline."""', False),
        ('description="Optimizer steps."', 'description="Optimizer steps " "(not micro-batches)."', False),
        ("return 2 * x", "return 3 * x", True),
        ("default=3", "default=4", True),
        ('"""Twice x."""\n    ', "", False),
    ],
)
def test_code_version_follows_code_not_prose(tmp_path, monkeypatch, old: str, new: str, reruns: bool):
    path = tmp_path / "m.py"
    monkeypatch.setattr(stage_mod, "package_modules", lambda: {"grpo_pipeline.tasks.m": path})

    def version(text: str) -> str:
        path.write_text(text)
        code_version.cache_clear()
        return code_version("grpo_pipeline.tasks.m")

    assert old in MODULE
    changed = version(MODULE) != version(MODULE.replace(old, new))
    code_version.cache_clear()
    assert changed == reruns


# ----------------------------------------------------------------------------- user code


@pytest.fixture
def user_module(tmp_path, monkeypatch) -> Path:
    """A user's own `my_rewards.py` on the import path."""
    path = tmp_path / "my_rewards.py"
    path.write_text("def score(prompts, completions, **kw):\n    return [1.0 for _ in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return path


def test_editing_a_user_reward_reruns_only_the_stages_that_call_it(user_module: Path):
    override = "grpo.rewards=[{name: 'my_rewards:score'}]"
    before = stage_keys([override])
    user_module.write_text(
        textwrap.dedent("""\
        def score(prompts, completions, **kw):
            return [0.5 for _ in completions]
    """)
    )
    # the evaluations report each training reward's mean, so they rerun too
    assert rerun(before, stage_keys([override])) == ["eval-sft", "grpo-r1", "eval-r1", "register-r1"]


def test_user_correctness_reward_keys_evaluation_too(user_module: Path):
    override = "eval.correctness_reward=my_rewards:score"
    before = stage_keys([override])
    user_module.write_text(user_module.read_text() + "\n# edited\n")
    assert rerun(before, stage_keys([override])) == ALL[3:]  # SFT's bar probe scores with it too


def test_user_code_fingerprints_only_dotted_paths(user_module: Path):
    prints = user_code(["correctness", "my_rewards:score", "missing_module_xyz:fn"])
    assert set(prints) == {"my_rewards:score", "missing_module_xyz:fn"}
    assert prints["missing_module_xyz:fn"] == "unresolved:missing_module_xyz:fn"
    assert len(prints["my_rewards:score"]) == 64


def test_a_package_user_module_is_hashed_whole(tmp_path, monkeypatch):
    pkg = tmp_path / "team_rewards"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .inner import score\n")
    (pkg / "inner.py").write_text("def score(prompts, completions, **kw):\n    return [1.0] * len(completions)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = user_code(["team_rewards:score"])
    (pkg / "inner.py").write_text("def score(prompts, completions, **kw):\n    return [0.0] * len(completions)\n")
    assert user_code(["team_rewards:score"]) != before
    sys.modules.pop("team_rewards", None)
