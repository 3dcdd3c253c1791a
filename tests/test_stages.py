"""Alignment in stages (configs/stages.py): a stage inherits the recipe and overrides what it needs, is gated on its
target suite with every earlier stage's suite guarded, and a staged run reports the stage x suite matrix."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from grpo_pipeline.configs.schema import ConfigError, load_config
from grpo_pipeline.tasks.rft import rejection_sample
from grpo_pipeline.tasks.scoring.matrix import StageRow, matrix_lines
from tests.helpers import finished, run_pipeline
from tests.test_difficulty import PLANTED, PLANTED_REWARD, N, ctx, micro_policy, planted_rows, rollouts

RECIPE = "configs/tiny-arith.yaml"
SUITES = (
    "eval.suites=[{name: heldout}, {name: sub, source: synthetic, num_problems: 24, synthetic: {operations: ['-']}}]"
)
SUB_DATA = "{synthetic: {operations: ['-'], teacher_carry_slip: 0, units_drill: 0}}"
TWO_STAGES = (
    "stages=[{name: add, target: heldout}, "
    f"{{name: sub, target: sub, data: {SUB_DATA}, grpo: {{learning_rate: 1e-3}}, rounds: 1, replay: 0.2}}]"
)


def staged(*overrides: str):
    return load_config(RECIPE, [SUITES, *overrides])


def test_a_recipe_without_stages_is_one_stage_itself() -> None:
    cfg = staged()
    assert cfg.stage_configs() == [(None, cfg)]


def test_a_stage_inherits_the_recipe_and_overrides_what_it_names() -> None:
    cfg = staged(TWO_STAGES, "grpo.rounds=3", "registry.guard=[heldout/pass_at_4]")
    (add, add_cfg), (sub, sub_cfg) = cfg.stage_configs()
    assert (add.name, sub.name) == ("add", "sub")
    assert add_cfg.data == cfg.data and add_cfg.grpo == cfg.grpo  # nothing overridden: the recipe's own
    assert sub_cfg.data.synthetic.operations == ["-"] and sub_cfg.data.num_train == cfg.data.num_train  # merged
    assert (sub_cfg.grpo.learning_rate, sub_cfg.grpo.rounds) == (1e-3, 1)
    assert sub_cfg.grpo.rewards == cfg.grpo.rewards and sub_cfg.model == cfg.model and sub_cfg.eval == cfg.eval
    assert not add_cfg.stages and not sub_cfg.stages
    # each gated on its target suite by the recipe's metric; every earlier stage's suite is guarded, the recipe's
    # own guards kept
    assert (add_cfg.registry.gating_metric, add_cfg.registry.guard) == ("heldout/accuracy", ["heldout/pass_at_4"])
    assert sub_cfg.registry.gating_metric == "sub/accuracy"
    assert sub_cfg.registry.guard == ["heldout/pass_at_4", "heldout/accuracy"]


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        ("stages=[{name: x, target: nope}]", r"stages\[0\] \(x\): target 'nope' is neither an eval suite"),
        ("stages=[{name: x, target: heldout, replay: 0.2}]", r"stages\[0\] \(x\): the first stage has no earlier"),
        (
            "stages=[{name: x, target: heldout}, {name: y, target: heldout, replay: 1}]",
            r"stages\.1\.replay: Input should be less than 1",
        ),
        ("stages=[{name: x, target: nope/accuracy}]", r"names no eval suite 'nope'"),
        ("stages=[{name: x, target: sub/pass_at_64}]", r"stages\[0\] \(x\).*64 is not in eval\.k"),
        ("stages=[{name: x, target: sub, grpo: {learning_rat: 1}}]", r"stages\[0\] \(x\).*grpo\.learning_rat: unknown"),
        # the stage's own data fails as the recipe's would, naming the stage
        (
            "stages=[{name: x, target: sub, data: {synthetic: {operations: ['-']}}}]",
            r"stages\[0\] \(x\).*teacher_carry",
        ),
        ("stages=[{name: x, target: sub, grpo: {tools: [calculator]}}]", r"a stage cannot change grpo\.tools"),
        ("stages=[{name: x, target: sub}, {name: x, target: heldout}]", r"names must differ"),
        ("stages=[{name: 'a b', target: sub}]", r"stage name 'a b'"),
    ],
)
def test_a_stage_that_cannot_run_fails_when_the_recipe_loads(stages: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        staged(stages)


def test_the_matrix_shows_what_each_stage_added_and_what_it_cost() -> None:
    rows = [
        StageRow(stage="", model="sft", values={"heldout": 0.30, "sub": 0.05}),
        StageRow(stage="add", model="grpo add round 2", values={"heldout": 0.99, "sub": 0.05}, kept=True),
        StageRow(stage="sub", model="grpo sub round 1", values={"heldout": 0.90, "sub": None}, kept=False),
    ]
    lines = matrix_lines(rows)
    assert lines[2] == "| stage | model | heldout | sub | kept |"
    assert lines[4] == "| start | sft | 0.300 | 0.050 |  |"
    assert lines[5] == "| add | grpo add round 2 | 0.990 (+0.690) | 0.050 (+0.000) | yes |"
    assert lines[6] == "| sub | grpo sub round 1 | 0.900 (-0.090) | - | **no** |"


ALWAYS_RIGHT = """
def always_right(completions, **kw):
    return [1.0 for _ in completions]
"""


@pytest.mark.integration
def test_a_staged_run_trains_each_stage_from_the_last_and_gates_it_on_its_suite(tmp_path: Path, prefect_api) -> None:
    """Three micro stages: GRPO on the recipe, GRPO on its own prompts, and rejection sampling. Each starts from the
    policy kept before it, is gated on its own suite with the earlier ones guarded, and the summary names each
    stage's rounds and verdict and shows the matrix. The correctness reward calls every completion right, so that
    rejection sampling keeps rows to fine-tune on from a micro model (the gate then sees no gain anywhere)."""
    (tmp_path / "always.py").write_text(ALWAYS_RIGHT)
    rft = "{name: self, kind: rft, target: heldout, samples_per_prompt: 2}"
    stages = TWO_STAGES.removesuffix("]") + f", {rft}]"
    proc, path = run_pipeline(
        tmp_path, "staged", SUITES, stages, f"code_dir={tmp_path}", "eval.correctness_reward=always:always_right",
        api=prefect_api,
    )  # fmt: skip
    summary = finished(proc, path)
    ran = [s["stage"] for s in summary["stages"]]
    expected = ["grpo-add-round1", "register-add-r1", "prepare_data-sub", "replay-sub", "grpo-sub-round1",
                "register-sub-r1", "rejection_sample-self", "sft-self", "register-self-r1"]  # fmt: skip
    assert [s for s in ran if s in expected] == expected  # in this order: each stage after the one before it
    (first, second, third) = summary["registrations"]
    assert first["gate"]["metric"] == "heldout/accuracy" and second["gate"]["metric"] == "sub/accuracy"
    assert [g["metric"] for g in second["gate"]["guards"]] == ["heldout/accuracy"]  # the first stage's suite
    assert third["gate"]["metric"] == "heldout/accuracy" and [g["metric"] for g in third["gate"]["guards"]] == [
        "sub/accuracy"
    ]
    assert [row["stage"] for row in summary["matrix"]] == ["", "add", "sub", "self"]
    assert set(summary["matrix"][1]["values"]) == {"heldout", "sub"}
    assert "stage add kept" in summary["stopped"] and "stage sub held back" in summary["stopped"]
    (sampling,) = summary["rejection_sampling"]
    assert sampling["kept"] == 200 and sampling["keep_rate"] == 1.0  # one per prompt: every sample was right
    models = [r["model"] for r in summary["rounds"]]
    assert models == ["sft", "grpo add round 1", "grpo sub round 1", "rft self"]
    # each stage's version carries the matrix so far on its card, itself the last row, undecided there
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    card = mlflow.MlflowClient().get_model_version(second["model_name"], second["version"]).description
    stages = card.split("\n## Stages\n")[1].split("\n## ")[0].splitlines()
    assert [line.split("|")[1].strip() for line in stages if line.startswith("| ") and "---" not in line] == [
        "stage", "start", "add", "sub",
    ]  # fmt: skip
    assert "The last row is this version; the promotion gate below says whether its stage is kept." in stages
    assert stages[-3].endswith("|  |")  # the version's own row: its gate decides below


def test_the_matrix_heatmap_writes_each_value_in_its_cell() -> None:
    from grpo_pipeline.tasks.scoring.curves import matrix_figure

    fig = matrix_figure([("sft", {"heldout": 0.3, "sub": 0.05}), ("sub", {"heldout": 0.9, "sub": None})], "accuracy")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.texts] == ["0.30", "0.05", "0.90"]  # the unscored cell left blank
    assert [t.get_text() for t in ax.get_yticklabels()] == ["sft", "sub"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["heldout", "sub"]


# ----------------------------------------------------------------------------- replay of earlier stages' prompts


def rows_file(path: Path, prompts: list[str], **columns: list[str]):
    from grpo_pipeline.tasks.core.common import Ref, fingerprint_path

    pd.DataFrame({"prompt": prompts, "answer": ["0"] * len(prompts), **columns}).to_parquet(path, index=False)
    return Ref(path=str(path), fingerprint=fingerprint_path(path))


def test_replay_mixes_a_share_of_earlier_prompts_into_a_stages_own(tmp_path: Path) -> None:
    from grpo_pipeline.tasks.data import replay_mixture

    own = rows_file(tmp_path / "own.parquet", [f"{i}-1=" for i in range(40)])
    first = rows_file(tmp_path / "a.parquet", [f"{i}+1=" for i in range(60)])
    second = rows_file(tmp_path / "b.parquet", [f"{i}*1=" for i in range(60)] + ["3-1="])  # one prompt is the stage's
    mix = dict(train=own, earlier=[first, second], share=0.2, seed=0, run_dir=str(tmp_path), label="sub")
    rows = pd.read_parquet(replay_mixture(**mix).require())
    own_prompts = set(pd.read_parquet(own.path)["prompt"])
    replayed = rows[~rows["prompt"].isin(own_prompts)]
    assert own_prompts <= set(rows["prompt"]) and len(rows) == 50  # all 40 of its own, and 10 earlier: 20% of 50
    assert replayed["prompt"].is_unique and not replayed["prompt"].str.contains("-").any()  # never its own again
    assert replayed["prompt"].str.contains(r"\+").any() and replayed["prompt"].str.contains(r"\*").any()  # both
    assert rows.equals(pd.read_parquet(replay_mixture(**mix).require()))  # seeded: the same mixture again
    other = pd.read_parquet(replay_mixture(**{**mix, "seed": 1}).require())
    assert set(other["prompt"]) != set(rows["prompt"])  # another seed draws other earlier prompts
    # more than the earlier stages have: all of them, once each (said in the log), never a prompt twice
    everything = pd.read_parquet(replay_mixture(**{**mix, "share": 0.9}).require())
    assert len(everything) == 40 + 120 and everything["prompt"].is_unique


def test_replay_of_rows_without_the_stages_columns_fails_naming_them(tmp_path: Path) -> None:
    from grpo_pipeline.tasks.data import replay_mixture
    from grpo_pipeline.tasks.sources import DataError

    own = rows_file(tmp_path / "own.parquet", ["1-1="], tests=["assert f(1) == 0"])
    earlier = rows_file(tmp_path / "a.parquet", ["1+1="])
    with pytest.raises(DataError, match=r"lack the column\(s\) \['tests'\].*a\.parquet|a\.parquet.*lack the column"):
        replay_mixture(train=own, earlier=[earlier], share=0.5, seed=0, run_dir=str(tmp_path), label="code")


# ----------------------------------------------------------------------------- rejection sampling (kind: rft)
# The difficulty filter's micro model, rows and `planted` reward: the first `planted` samples of each prompt are
# correct whatever the model wrote, so which samples rejection sampling may keep is known exactly.


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("rft")


@pytest.fixture(scope="module")
def policy(run_dir: Path):
    return micro_policy(run_dir)


@pytest.fixture(scope="module")
def train(run_dir: Path):
    return planted_rows(run_dir, PLANTED)


def unscorable(completions: list[str], **_: object) -> list[float | None]:
    """A reward that scores nothing: no sample is verified, none counted wrong."""
    return [None for _ in completions]


@pytest.mark.parametrize("kept_per_prompt", [1, 3])
def test_rejection_sampling_keeps_only_verified_distinct_samples(
    run_dir, policy, train, kept_per_prompt: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the run directory's own store
    result = rejection_sample(policy, train, rollouts(PLANTED_REWARD), ctx(run_dir), "rft", N, kept_per_prompt)
    samples = [json.loads(line) for line in Path(result.samples_path).read_text().splitlines()]
    assert [s["verified"] for s in samples] == [[i < k for i in range(N)] for k in PLANTED]
    kept = pd.read_parquet(result.train.path)
    for sample, rows in zip(samples, [kept[kept["prompt"] == s["prompt"]] for s in samples], strict=True):
        right = list(dict.fromkeys(c for c, ok in zip(sample["completions"], sample["verified"], strict=True) if ok))
        assert rows["completion"].tolist() == right[:kept_per_prompt]  # verified, distinct, in sampled order
    assert set(kept.columns) >= {"prompt", "answer", "completion"}
    assert (result.sampled, result.verified, result.unscored) == (N * len(PLANTED), sum(PLANTED), 0)
    assert result.keep_rate == sum(PLANTED) / (N * len(PLANTED))
    assert result.prompts_kept == sum(k > 0 for k in PLANTED) and result.kept == len(kept)


def test_rejection_sampling_keeps_nothing_it_could_not_score(run_dir, policy, train, monkeypatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    result = rejection_sample(policy, train, rollouts(f"{__name__}:unscorable"), ctx(run_dir), "none", 2, 1)
    assert (result.kept, result.verified, result.unscored, result.keep_rate) == (0, 0, 2 * len(PLANTED), None)
    assert "no keep rate: the correctness reward scored no sample" in result.describe()  # not a silent 0
    assert pd.read_parquet(result.train.path).empty


def test_an_rft_stage_is_one_fine_tuning_on_plain_completions() -> None:
    (_, _), (rft, rft_cfg) = staged(
        "stages=[{name: add, target: heldout}, {name: self, kind: rft, target: heldout, sft: {max_steps: 7}}]"
    ).stage_configs()
    assert rft.kind == "rft" and rft_cfg.sft.max_steps == 7
    with pytest.raises(ConfigError, match="an rft stage samples and fine-tunes once"):
        staged("stages=[{name: self, kind: rft, target: heldout, rounds: 2}]")
    with pytest.raises(ConfigError, match="a grpo stage runs no SFT"):
        staged("stages=[{name: g, target: heldout, sft: {max_steps: 7}}]")
    with pytest.raises(ConfigError, match="an rft stage fine-tunes on plain completions"):
        load_config("configs/tiny-tools.yaml", ["stages=[{name: self, kind: rft, target: heldout}]"])


@pytest.mark.slow
def test_a_stage_that_erodes_an_earlier_skill_is_held_back_by_its_guard(tmp_path: Path, prefect_api) -> None:
    """Stage 1 keeps what SFT taught (one-digit addition, every held-out problem right). Stage 2 trains on brevity
    alone (a `shorter` reward, at 50x the learning rate): its own metric gains, and the addition it costs is caught by
    the guard on stage 1's metric. Nothing of stage 2 takes champion, and the summary says which guard held it back."""
    from tests.test_keep_best import SHORTER, TINY

    (tmp_path / "keep_rewards.py").write_text(SHORTER)
    taught = [o for o in TINY if not o.startswith(("grpo.rewards", "grpo.learning_rate", "data.num_"))]
    brevity = "grpo: {rewards: [{name: 'keep_rewards:shorter'}], learning_rate: 0.05}"
    short = f"{{name: short, target: heldout/reward/keep_rewards:shorter, {brevity}}}"
    proc, path = run_pipeline(
        tmp_path, "forget", *taught, "data.synthetic.min_digits=1", "data.num_train=50", "data.num_eval=12",
        "data.num_probe=8", "sft.stop_at_accuracy=null", "sft.max_steps=150", "eval.suites=[{name: heldout}]",
        f"stages=[{{name: add, target: heldout}}, {short}]", f"code_dir={tmp_path}", api=prefect_api,
    )  # fmt: skip
    summary = finished(proc, path)
    _, add, brief = summary["matrix"]
    assert add["kept"] and add["values"]["heldout"] >= 0.5  # stage 1 holds a skill to lose
    first, second = summary["registrations"]
    assert first["alias"] == "champion" and second["alias"] != "champion"  # stage 2 held back
    (guard,) = second["gate"]["guards"]
    assert guard["metric"] == "heldout/accuracy" and not guard["passed"]  # by the guard on stage 1's metric
    assert second["gate"]["metric"] == "heldout/reward/keep_rewards:shorter" and second["gate"]["ci_low"] > 0
    assert brief["values"]["heldout"] < add["values"]["heldout"] - 0.1 and brief["kept"] is False
    assert "stage short held back" in summary["stopped"] and "heldout/accuracy" in summary["stopped"]


def test_a_staged_runs_notes_and_alarms_name_each_rounds_stage() -> None:
    from grpo_pipeline.flows.summary_tables import health_lines

    lines = health_lines([[], ["reward spread collapsed"]], ["grpo add round 1", "grpo sub round 1"])
    assert lines[2:] == ["- grpo add round 1: healthy", "- grpo sub round 1: 1 alarm(s)", "  - reward spread collapsed"]
    assert health_lines([[], ["x"]])[2:4] == ["- round 1: healthy", "- round 2: 1 alarm(s)"]  # without stages


def test_retraining_guards_every_suite_but_the_gated_one() -> None:
    """The nightly run's gate (registry.guard_every_suite): it gains where it is gated and keeps every other suite."""
    cfg = staged("registry.guard_every_suite=true", "registry.guard=[heldout/pass_at_4]")
    assert cfg.registry.guarded(cfg.eval.suite_names()) == ["heldout/pass_at_4", "sub/accuracy"]
    assert staged("registry.guard=[heldout/pass_at_4]").registry.guarded(["heldout", "sub"]) == ["heldout/pass_at_4"]
    # a gating metric another suite does not produce fails when the recipe loads, not at the register stage
    with pytest.raises(ConfigError, match=r"registry\.guard_every_suite: 'sub/reward/format'"):
        staged("registry.guard_every_suite=true", "registry.gating_metric=heldout/reward/format")
    deployments = yaml.safe_load((Path(__file__).parents[1] / "deployments" / "prefect.yaml").read_text())
    (nightly,) = [d for d in deployments["deployments"] if d["name"] == "nightly"]
    assert "registry.guard_every_suite=true" in nightly["parameters"]["overrides"]
