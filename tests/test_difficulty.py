"""The difficulty filter between GRPO rounds (tasks/difficulty.py): the keep rule, the stage on a real tiny model,
its key, its errors, and the flow that trains round 2 on what it keeps.

The stage tests score real samples of a micro model with test rewards whose pass rates are known: `planted` makes
the first `planted` samples of each prompt correct whatever the model wrote (the expected kept set is exact), and
`coin` calls a sample correct when a hash of its text is even, on a quarter of the prompts always (pass rates that
depend on what was sampled, for the determinism check and for the flow, where a micro model would solve nothing with
the real `correctness`).
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections import Counter
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from mlflow import MlflowClient

from grpo_pipeline.configs.sampling import Sampling
from grpo_pipeline.configs.schema import (
    ConfigError,
    DifficultyFilterConfig,
    ModelConfig,
    RewardSpec,
    TinyModelConfig,
    load_config,
)
from grpo_pipeline.tasks.core.common import Checkpoint, Ref, fingerprint_path
from grpo_pipeline.tasks.core.stage import RunContext
from grpo_pipeline.tasks.difficulty import (
    DifficultyFilterError,
    check_enough,
    filter_by_difficulty,
    filters_round,
    keep_mask,
)
from grpo_pipeline.tasks.grpo import GRPORound, grpo_train
from grpo_pipeline.tasks.model import prepare_base_model
from grpo_pipeline.tasks.scoring.rollouts import Rollouts
from tests.helpers import ROOT, cli_env, micro_overrides, run_cli

N = 8
# planted correct samples (of N) per prompt -> pass rates 0, 1/8, 2/8, 3/8, 4/8, 6/8, 7/8, 1
PLANTED = [0, 1, 2, 3, 4, 6, 7, 8]


def planted(prompts: list[str], completions: list[str], planted: list[int], **_: object) -> list[float]:
    """Correct for the first `planted` samples of each prompt, whatever the model wrote."""
    seen: Counter[str] = Counter()
    scores = []
    for prompt, k in zip(prompts, planted, strict=True):
        scores.append(1.0 if seen[prompt] < k else 0.0)
        seen[prompt] += 1
    return scores


def coin(prompts: list[str], completions: list[str], **_: object) -> list[float]:
    """About a quarter of the prompts always correct (too easy: dropped), the others correct when a hash of the
    sampled text is even (kept unless all of its samples agree)."""

    def byte(text: str) -> int:
        return hashlib.sha256(text.encode()).digest()[0]

    return [
        1.0 if byte(p) % 4 == 0 else float(byte(f"{p}\0{c}") % 2 == 0)
        for p, c in zip(prompts, completions, strict=True)
    ]


# ----------------------------------------------------------------------------- pure rules


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        (0.0, 1.0, [False, True, True, True, True, True, True, False]),  # DAPO: neither all wrong nor all right
        (0.25, 0.75, [False, False, False, True, True, False, False, False]),  # bounds are exclusive
        (0.0, 0.5, [False, True, True, True, False, False, False, False]),
    ],
)
def test_keep_rule_is_strictly_between_the_bounds(low: float, high: float, expected: list[bool]) -> None:
    assert keep_mask([k / N for k in PLANTED], low, high) == expected


def test_rounds_filtered() -> None:
    off, on = DifficultyFilterConfig(), DifficultyFilterConfig(enabled=True)
    first = DifficultyFilterConfig(enabled=True, before_first_round=True)
    assert [filters_round(c, r) for c in (off, on, first) for r in (1, 2, 3)] == [
        *(False, False, False),
        *(False, True, True),
        *(True, True, True),
    ]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["min_pass_rate=0.5", "max_pass_rate=0.5"], "must be below max_pass_rate"),
        (["min_pass_rate=0.6", "max_pass_rate=0.2"], "must be below max_pass_rate"),
        # with 2 samples the pass rates are 0, 0.5, 1: none strictly inside (0.5, 1)
        (["samples_per_prompt=2", "min_pass_rate=0.5"], "no pass rate c/2 lies strictly between"),
        (["max_pass_rate=1.5"], "less than or equal to 1"),
    ],
)
def test_config_rejects_bounds_that_keep_nothing(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=r"grpo\.difficulty_filter") as err:
        load_config(None, [f"grpo.difficulty_filter.{o}" for o in overrides])
    assert message in str(err.value)


def test_switching_the_filter_on_for_later_rounds_keeps_round_one_cached() -> None:
    """The filter reaches a round through the split it writes (keyed by fingerprint), not through its settings."""

    def round_one_key(overrides: list[str]) -> str:
        cfg = load_config(ROOT / "configs/tiny-arith.yaml", ["run_dir=/tmp/runs", *overrides])
        start, train = Checkpoint(path="sft", fingerprint="sft"), Ref(path="train", fingerprint="train")
        spec = GRPORound(start=start, train=train, cfg=cfg.grpo, model_cfg=cfg.model, round_index=1,
                         ctx=RunContext.of(cfg), correctness_reward=RewardSpec(name="correctness"))  # fmt: skip
        return grpo_train.stage.key({"spec": spec})

    base = round_one_key([])
    assert round_one_key(["grpo.difficulty_filter.enabled=true", "grpo.difficulty_filter.max_prompts=100"]) == base
    assert round_one_key(["grpo.learning_rate=3e-4"]) != base  # the key still sees the rest of the section


# ----------------------------------------------------------------------------- the stage on a real tiny model


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("difficulty")


@pytest.fixture(scope="module")
def policy(run_dir: Path) -> Checkpoint:
    return micro_policy(run_dir)


@pytest.fixture(scope="module")
def train(run_dir: Path) -> Ref:
    return planted_rows(run_dir, PLANTED)


def micro_policy(run_dir: Path) -> Checkpoint:
    """A micro model that solves nothing: what it samples is noise, which the test rewards judge."""
    tiny = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_positions=32)
    return prepare_base_model(ModelConfig(tiny=tiny), str(run_dir), 0)


def planted_rows(run_dir: Path, planted: list[int]) -> Ref:
    """Addition rows, one per entry of `planted`: how many of a prompt's samples the `planted` reward calls right."""
    path = run_dir / "train.parquet"
    rows = pd.DataFrame(
        {
            "prompt": [f"{10 + i}+{20 + 3 * i}=" for i in range(len(planted))],
            "answer": [str(30 + 4 * i) for i in range(len(planted))],
            "completion": [str(30 + 4 * i) for i in range(len(planted))],
            "planted": planted,
        }
    )
    rows.to_parquet(path, index=False)
    return Ref(path=str(path), fingerprint=fingerprint_path(path))


@pytest.fixture(autouse=True)
def _own_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the run directory's own SQLite store


def rollouts(reward: str) -> Rollouts:
    return Rollouts(
        sampling=Sampling(temperature=1.0, max_new_tokens=4), batch_size=64, correctness_reward=RewardSpec(name=reward)
    )


PLANTED_REWARD = f"{__name__}:planted"
COIN_REWARD = f"{__name__}:coin"


def ctx(run_dir: Path, seed: int = 0) -> RunContext:
    return RunContext(run_dir=str(run_dir), experiment="difficulty", recipe="t", seed=seed)


def stage_params(policy: Checkpoint, train: Ref, cfg: DifficultyFilterConfig, reward: str, run_dir: Path) -> dict:
    """The stage's arguments as its key sees them."""
    return {"policy": policy, "train": train, "cfg": cfg, "rollouts": rollouts(reward), "ctx": ctx(run_dir),
            "label": "r2", "min_kept": 1}  # fmt: skip


def test_stage_keeps_exactly_the_prompts_strictly_between_the_bounds(run_dir, policy, train) -> None:
    cfg = DifficultyFilterConfig(enabled=True, samples_per_prompt=N, min_pass_rate=0.25, max_pass_rate=0.75)
    result = filter_by_difficulty(policy, train, cfg, rollouts(PLANTED_REWARD), ctx(run_dir), "r2")

    rows = pd.read_parquet(train.path)
    expected = rows[[0.25 < k / N < 0.75 for k in PLANTED]]  # 3/8 and 4/8
    kept = pd.read_parquet(result.train.path)
    assert kept.to_dict("records") == expected.reset_index(drop=True).to_dict("records")
    assert (result.scored, result.kept, result.too_hard, result.too_easy) == (8, 2, 3, 3)
    assert result.kept_fraction == 0.25
    assert result.train.fingerprint == fingerprint_path(result.train.path)
    assert Path(result.train.path).parent == filter_by_difficulty.stage.out_dir(
        stage_params(policy, train, cfg, PLANTED_REWARD, run_dir)
    )
    lines = [json.loads(line) for line in Path(result.pass_rates_path).read_text().splitlines()]
    assert [(line["correct"], line["kept"]) for line in lines] == [(k, 0.25 < k / N < 0.75) for k in PLANTED]
    # the kept fraction is tracked in MLflow, in a run of its own
    run = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}").get_run(result.run_id)
    assert run.data.metrics["difficulty/kept_fraction"] == 0.25
    assert (run.data.tags["stage"], run.data.tags["data_fingerprint"]) == ("difficulty", train.fingerprint)


def test_stage_is_deterministic_and_depends_on_the_samples(run_dir, policy, train) -> None:
    cfg = DifficultyFilterConfig(enabled=True, samples_per_prompt=N)

    def correct_counts(label: str, seed: int = 0) -> tuple[list[int], str]:
        result = filter_by_difficulty(policy, train, cfg, rollouts(COIN_REWARD), ctx(run_dir, seed), label)
        lines = Path(result.pass_rates_path).read_text().splitlines()
        return [json.loads(line)["correct"] for line in lines], result.train.fingerprint

    first = correct_counts("a")
    assert correct_counts("b") == first  # another output directory, the same samples
    assert len(set(first[0])) > 1  # pass rates spread: the reward saw different samples
    assert correct_counts("c", seed=1)[0] != first[0]  # and the samples come from the seeded sampler


def test_stage_is_keyed_by_the_policy_and_the_data(run_dir, policy, train) -> None:
    cfg = DifficultyFilterConfig(enabled=True)

    def key(p: Checkpoint, t: Ref) -> str:
        return filter_by_difficulty.stage.key(stage_params(p, t, cfg, "correctness", run_dir))

    other_policy = policy.model_copy(update={"fingerprint": "0" * 64})  # the same path, other weights
    other_data = train.model_copy(update={"fingerprint": "1" * 64})
    assert key(policy, train) == key(policy, train)
    assert len({key(policy, train), key(other_policy, train), key(policy, other_data)}) == 3
    out = filter_by_difficulty.stage.out_dir
    assert out(stage_params(policy, train, cfg, "correctness", run_dir)) != out(
        stage_params(other_policy, train, cfg, "correctness", run_dir)
    )


@pytest.mark.parametrize(
    ("planted_counts", "cfg", "min_kept", "names"),
    [
        ([N] * 8, DifficultyFilterConfig(samples_per_prompt=N), 1, ["8 at or above", "samples_per_prompt"]),
        (
            [0, 0, N, N, 4, 4, 4, 4],
            DifficultyFilterConfig(samples_per_prompt=N, min_pass_rate=0.5, max_pass_rate=0.75),
            1,
            ["min_pass_rate=0.5", "lower grpo.difficulty_filter.min_pass_rate", "enabled=false"],
        ),
        (PLANTED, DifficultyFilterConfig(samples_per_prompt=N, min_pass_rate=0.25, max_pass_rate=0.75), 4,
         ["2 of 8", "at least 4 (grpo.prompts_per_step)", "raise grpo.difficulty_filter.max_pass_rate"]),
    ],
)  # fmt: skip
def test_too_few_kept_ends_the_rounds_or_is_an_error_that_names_the_setting(
    tmp_path, policy, planted_counts, cfg, min_kept, names
) -> None:
    """The stage says that a round cannot train on what it kept, and why; by default that ends the rounds with a note
    (as a saturated probe does), and with on_too_few=fail it is an error that names the settings to change. Before,
    the stage raised whatever the recipe asked, and a nightly run whose policy had learned everything ended Failed."""
    path = tmp_path / "train.parquet"
    pd.DataFrame({"prompt": [f"{i}+1=" for i in range(8)], "answer": "1", "planted": planted_counts}).to_parquet(path)
    data = Ref(path=str(path), fingerprint=fingerprint_path(path))
    result = filter_by_difficulty(policy, data, cfg, rollouts(PLANTED_REWARD), ctx(tmp_path), "r2", min_kept=min_kept)
    assert "difficulty filter before GRPO r2" in result.too_few
    for name in names:
        assert name in result.too_few
    note = check_enough(result, cfg)
    assert note.startswith(f"the difficulty filter before r2 kept {result.kept} of 8 prompts, fewer than a GRPO step")
    assert "nothing left to learn on them, so the rounds end" in note and "on_too_few=fail" in note
    with pytest.raises(DifficultyFilterError) as err:
        check_enough(result, cfg.model_copy(update={"on_too_few": "fail"}))
    assert str(err.value) == result.too_few


def test_enough_kept_is_no_reason_to_stop(run_dir, policy, train) -> None:
    cfg = DifficultyFilterConfig(enabled=True, samples_per_prompt=N, on_too_few="fail")
    result = filter_by_difficulty(policy, train, cfg, rollouts(PLANTED_REWARD), ctx(run_dir), "r2", min_kept=6)
    assert (result.kept, result.too_few, check_enough(result, cfg)) == (6, "", "")


# ----------------------------------------------------------------------------- in the flow


@pytest.mark.integration
@pytest.mark.slow
def test_round_two_trains_on_the_filtered_split(tmp_path, prefect_api) -> None:
    """Through the CLI: round 2 is preceded by the filter and trains on what it kept (the GRPO run's data tag);
    the summary shows the kept fraction; switching the filter off again reruns round 2 only."""
    # `coin` as a user's module would hold it: in a directory of their own on PYTHONPATH (the checkout's root, where
    # this test module lives, is not an import path of the CLI)
    user_code = tmp_path / "user_code"
    user_code.mkdir()
    (user_code / "difficulty_coin.py").write_text(f"import hashlib\n\n\n{inspect.getsource(coin)}")
    common = [
        "run", "--config", "configs/tiny-arith.yaml", *micro_overrides(tmp_path / "runs"), "grpo.rounds=2",
        "eval.correctness_reward=difficulty_coin:coin", "registry.model_name=micro-difficulty",
    ]  # fmt: skip
    env = cli_env(tmp_path, PYTHONPATH=str(user_code), PREFECT_API_URL=prefect_api)
    on = run_cli([*common, "grpo.difficulty_filter.enabled=true", "--summary-json", str(tmp_path / "on.json")], env)
    assert on.returncode == 0, f"pipeline failed:\n{on.stdout[-4000:]}\n{on.stderr[-4000:]}"
    summary = json.loads((tmp_path / "on.json").read_text())
    stages = [s["stage"] for s in summary["stages"]]
    assert "difficulty_filter-r1" not in stages
    assert stages.index("difficulty_filter-r2") == stages.index("grpo-round2") - 1
    (kept,) = summary["difficulty_filters"]
    assert kept["label"] == "r2" and kept["scored"] == 200 and 100 < kept["kept"] < 190  # ~1/4 is too easy
    assert kept["kept_fraction"] == kept["kept"] / kept["scored"]
    assert len(pd.read_parquet(kept["train"]["path"])) == kept["kept"]
    assert f"Difficulty filter before r2: kept {kept['kept']} of 200 prompts" in on.stdout
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    client = MlflowClient()
    first, second = (client.get_run(r["run_id"]).data.tags for r in summary["registrations"])
    assert second["data_fingerprint"] == kept["train"]["fingerprint"] != first["data_fingerprint"]
    assert client.get_run(kept["run_id"]).data.metrics["difficulty/kept_fraction"] == kept["kept_fraction"]

    off = run_cli([*common, "grpo.difficulty_filter.enabled=false", "--summary-json", str(tmp_path / "off.json")], env)
    assert off.returncode == 0, f"pipeline failed:\n{off.stdout[-4000:]}\n{off.stderr[-4000:]}"
    cached = {s["stage"]: s["cached"] for s in json.loads((tmp_path / "off.json").read_text())["stages"]}
    assert cached["sft_warmup"] and cached["grpo-round1"] and cached["evaluate-r1"], cached
    assert not cached["grpo-round2"] and "difficulty_filter-r2" not in cached


@pytest.mark.integration
def test_a_filter_that_leaves_nothing_to_learn_ends_the_rounds_and_fails_only_when_asked(tmp_path, prefect_api) -> None:
    """A micro policy solves no prompt, so the filter before round 2 keeps none: the run ends after round 1 (trained,
    scored and registered) with a note that says why, and exits 0; with on_too_few=fail the same run fails with the
    filter's error, naming the settings, and round 1 comes from the cache. Before, every such run ended Failed."""
    common = [
        "run", "--config", "configs/tiny-arith.yaml", *micro_overrides(tmp_path / "runs"), "grpo.rounds=3",
        "grpo.difficulty_filter.enabled=true", "registry.model_name=micro-saturated",
    ]  # fmt: skip
    env = cli_env(tmp_path, PREFECT_API_URL=prefect_api)
    ended = run_cli([*common, "--summary-json", str(tmp_path / "ended.json")], env)
    assert ended.returncode == 0, f"pipeline failed:\n{ended.stdout[-4000:]}\n{ended.stderr[-4000:]}"
    summary = json.loads((tmp_path / "ended.json").read_text())
    stages = [s["stage"] for s in summary["stages"]]
    assert "grpo-round1" in stages and "difficulty_filter-r2" in stages and "grpo-round2" not in stages
    assert summary["stopped"].startswith("the difficulty filter before r2 kept 0 of 200 prompts")
    assert summary["stopped"].endswith("(1 of at most 3 rounds ran)")
    assert [r["version"] for r in summary["registrations"]] == ["1"]  # round 1 stands
    flat = " ".join(ended.stdout.split())
    assert "Rounds: the difficulty filter before r2 kept 0 of 200 prompts" in flat

    failed = run_cli([*common, "grpo.difficulty_filter.on_too_few=fail"], env)
    assert failed.returncode != 0
    out = " ".join((failed.stdout + failed.stderr).split())
    assert "difficulty filter before GRPO r2: 0 of 200 training prompts" in out
    assert "grpo.difficulty_filter.samples_per_prompt" in out
