"""Evaluation suites: named benchmarks with their own source, prompt format, correctness reward and sampling
settings (eval.suites), prepared and scored apart, and a gate that guards other suites' metrics (registry.guard).

MLflow is a SQLite store under tmp_path, as in tests/test_register.py, whose helpers build real tiny checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from mlflow import MlflowClient

from grpo_pipeline.configs.schema import (
    HELDOUT,
    ConfigError,
    Metric,
    PipelineConfig,
    RewardSpec,
    load_config,
    split_metric,
)
from grpo_pipeline.tasks.core.common import Ref, fingerprint_path
from grpo_pipeline.tasks.core.stage import RunContext
from grpo_pipeline.tasks.register import register_policy
from grpo_pipeline.tasks.release.champion import suite_items_artifact
from grpo_pipeline.tasks.release.gate import GateDecision
from grpo_pipeline.tasks.scoring.items import item_id
from grpo_pipeline.tasks.scoring.results import ITEMS_FILE, EvalResult, summarize
from grpo_pipeline.tasks.sources.contract import DataValidationError
from grpo_pipeline.tasks.suites import prepare_suite, suite_sources
from tests.helpers import finished, run_pipeline
from tests.test_register import EVAL, policy

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
GSM8K_TEST = SHARED / "gsm8k_test.jsonl"
GSM8K_SUITE = (
    "eval.suites=[{name: heldout}, {name: gsm8k_test, source: file, path: %s, prompt_column: question, "
    "answer_column: answer, answer_pattern: '#### (.+)$', max_problems: 40, n_samples: 2, k: [1, 2]}]"
)


# ----------------------------------------------------------------------------- the config


def test_no_suites_means_the_held_out_split_alone():
    cfg = load_config(None)
    assert cfg.eval.suite_names() == [HELDOUT] and cfg.gating_suite() == HELDOUT
    assert cfg.eval.suite(HELDOUT).source == "heldout"
    # the held-out suite's settings are the section's own: the evaluations cached before suites existed still match
    assert cfg.eval.for_suite(HELDOUT) == cfg.eval


def test_a_suite_overrides_the_sampling_and_the_scorer_and_keys_only_itself(tmp_path):
    cfg = load_config(None, [GSM8K_SUITE % (tmp_path / "t.jsonl")])
    assert cfg.eval.suite_names() == [HELDOUT, "gsm8k_test"]
    suite = cfg.eval.for_suite("gsm8k_test")
    assert (suite.n_samples, suite.k, suite.max_problems, suite.suites) == (2, [1, 2], 40, [])
    assert suite.temperature == cfg.eval.temperature  # not overridden: the section's
    # adding a suite changes neither the held-out suite's settings nor, so, its evaluation's key
    assert cfg.eval.for_suite(HELDOUT) == load_config(None).eval.for_suite(HELDOUT)
    coded = load_config(
        None,
        [
            "grpo.rewards=[{name: code_tests, params: {isolation: bwrap, float_tolerance: 0.01}}]",
            "eval.suites=[{name: he, source: file, path: x.jsonl, correctness_reward: code_tests}]",
        ],
    )
    assert coded.eval.for_suite("he").correctness_reward == RewardSpec(
        name="code_tests", params={"isolation": "bwrap", "float_tolerance": 0.01}
    )  # a bare name takes the training reward's params, as eval.correctness_reward does


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["eval.suites=[{name: a}, {name: a}]"], "more than once"),
        (["eval.suites=[{name: 'a/b'}]"], "letters, digits"),
        (["eval.suites=[{name: t, source: file}]"], "no path"),
        (["eval.suites=[{name: t, source: synthetic}]"], "no synthetic"),
        (["eval.suites=[{name: t, n_samples: 2}]"], "exceeds n_samples"),
        (["registry.gating_metric=gsm8k/accuracy"], "names no eval suite 'gsm8k'"),
        (["eval.suites=[{name: heldout}]", "registry.guard=[other/accuracy]"], "registry.guard"),
    ],
)
def test_a_bad_suite_is_one_error_naming_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


BENCH = (
    "eval.suites=[{name: heldout}, {name: bench, source: synthetic, synthetic: {kind: arithmetic}, k: [1, 2], "
    "n_samples: 2}]"
)


@pytest.mark.parametrize(
    ("overrides", "field", "why", "valid"),
    [
        (["registry.gating_metric=acuracy"], "registry.gating_metric", "not an eval metric name",
         "accuracy, pass_at_1, pass_at_4, pass_at_8, maj_at_1, maj_at_4, maj_at_8, reward/correctness, reward/format"),
        (["registry.gating_metric=pass_at_16"], "registry.gating_metric", "16 is not in eval.k [1, 4, 8]", "pass_at_8"),
        (["registry.gating_metric=pass_at_04"], "registry.gating_metric", "not an eval metric name", "pass_at_4"),
        (["eval.correctness_reward=code_tests", "registry.guard=[maj_at_4]"], "registry.guard[0]",
         "no final answer to vote on", "pass_at_8, reward/correctness"),
        (["registry.guard=[accuracy, reward/lenght]"], "registry.guard[1]", "'lenght' is not one of grpo.rewards",
         "reward/format"),
        # another benchmark is not scored on the training rewards: a guard on one could never be compared
        ([BENCH, "registry.guard=[bench/reward/format]"], "registry.guard[0]", "held-out suites only",
         "bench/accuracy, bench/pass_at_1, bench/pass_at_2, bench/maj_at_1, bench/maj_at_2"),
        ([BENCH, "registry.gating_metric=bench/pass_at_4"], "registry.gating_metric",
         "4 is not in the suite's k [1, 2]", "bench/pass_at_2"),
    ],
)  # fmt: skip
def test_a_gate_metric_the_evaluation_does_not_produce_is_refused_when_the_config_loads(overrides, field, why, valid):
    """The gate reads its metrics after every round has trained: a name no evaluation produces is refused up front,
    naming the field, the value, what is wrong and the names that are valid."""
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    message = str(e.value)
    assert f"{field}: " in message and why in message and valid in message.partition("; valid names: ")[2]


def test_metric_names_read_one_way():
    assert split_metric("accuracy", ["a", "b"]) == ("a", Metric("accuracy"))
    assert split_metric("b/pass_at_4", ["a", "b"]) == ("b", Metric("pass_at", k=4))
    assert split_metric("reward/format", ["a", "b"]) == ("a", Metric("reward", reward="format"))
    assert split_metric("b/reward/format", ["a", "b"]) == ("b", Metric("reward", reward="format"))
    assert [str(Metric.parse(n)) for n in ("maj_at_16", "reward/x")] == ["maj_at_16", "reward/x"]
    for bad in ("pass_at_0", "pass_at_", "pass_at_4x", "reward/", "f1", "tools/call_frequency"):
        assert Metric.read(bad) is None
    with pytest.raises(ValueError, match="names no eval suite 'c'"):
        split_metric("c/accuracy", ["a", "b"])


def test_the_cli_refuses_a_misspelt_gating_metric_before_anything_runs():
    from typer.testing import CliRunner

    from grpo_pipeline.cli import app

    result = CliRunner().invoke(app, ["config", "registry.gating_metric=acuracy"])
    assert result.exit_code == 2
    assert "registry.gating_metric: 'acuracy' is not an eval metric name" in result.output
    assert "valid names: accuracy, pass_at_1" in result.output


def test_the_gate_may_name_any_suites_metric(tmp_path):
    cfg = load_config(
        None, [GSM8K_SUITE % (tmp_path / "t.jsonl"), "registry.gating_metric=gsm8k_test/accuracy",
               "registry.guard=[heldout/accuracy, reward/format]"]
    )  # fmt: skip
    assert cfg.gating_suite() == "gsm8k_test"
    assert isinstance(cfg, PipelineConfig) and cfg.registry.guard == ["heldout/accuracy", "reward/format"]


# ----------------------------------------------------------------------------- preparing a suite


@pytest.mark.skipif(not GSM8K_TEST.exists(), reason=f"{GSM8K_TEST} is absent (the shared GSM8K test split)")
def test_a_file_suite_is_prepared_and_validated(tmp_path):
    cfg = load_config(None, [GSM8K_SUITE % GSM8K_TEST, f"run_dir={tmp_path}"])
    suite = cfg.eval.suite("gsm8k_test")
    ref = prepare_suite(suite, cfg.run_dir)
    rows = pd.read_parquet(ref.path)
    source = pd.read_json(GSM8K_TEST, lines=True).head(40)
    assert rows["prompt"].tolist() == source["question"].tolist()  # in the benchmark's order, capped
    assert rows["answer"].tolist() == [a.rsplit("#### ", 1)[1].strip() for a in source["answer"]]
    held_out = Ref(path="eval.parquet", fingerprint="f" * 64)
    assert suite_sources(cfg.eval, held_out, {"gsm8k_test": ref}) == {HELDOUT: held_out, "gsm8k_test": ref}
    assert prepare_suite(suite, cfg.run_dir) == ref  # keyed by its config and the file's content


def test_a_suite_with_bad_rows_names_them(tmp_path):
    bad = tmp_path / "bench.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in [{"q": "1+1=", "a": "2"}, {"q": " ", "a": "3"}]))
    cfg = load_config(None, [f"eval.suites=[{{name: bench, source: file, path: {bad}, prompt_column: q, "
                             f"answer_column: a}}]", f"run_dir={tmp_path}"])  # fmt: skip
    with pytest.raises(
        DataValidationError, match=r"(?s)eval suite 'bench'.*row 1: column 'prompt' failed 'prompt_not_blank'"
    ):
        prepare_suite(cfg.eval.suite("bench"), cfg.run_dir)
    assert not (tmp_path / "suite-bench").exists() or not any((tmp_path / "suite-bench").rglob("*.parquet"))


def test_a_synthetic_suite_draws_its_own_problems(tmp_path):
    cfg = load_config(None, ["eval.suites=[{name: heldout}, {name: units, source: synthetic, num_problems: 30, "
                             "synthetic: {min_digits: 1, max_digits: 1}}]", f"run_dir={tmp_path}"])  # fmt: skip
    rows = pd.read_parquet(prepare_suite(cfg.eval.suite("units"), cfg.run_dir).path)
    assert len(rows) == 30 and all(len(p) == 4 for p in rows["prompt"])  # "7+8="
    assert all(int(p[0]) + int(p[2]) == int(a) for p, a in zip(rows["prompt"], rows["answer"], strict=True))


# ----------------------------------------------------------------------------- the gate over suites


@pytest.fixture
def store(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    return tmp_path


def problems(run_dir: Path, name: str, n: int) -> Ref:
    rows = pd.DataFrame({"prompt": [f"{name} {i}?" for i in range(n)], "answer": [str(i) for i in range(n)]})
    path = run_dir / f"{name}.parquet"
    rows.to_parquet(path, index=False)
    return Ref(path=str(path), fingerprint=fingerprint_path(path))


def scored(run_dir: Path, held_out: Ref, correct: list[int], suite: str, model: str) -> EvalResult:
    rows = pd.read_parquet(held_out.path)
    items = [
        {"id": item_id(p), "prompt": p, "answer": a, "greedy": a if ok else "x", "greedy_correct": ok,
         "samples": [a, "x"], "sample_correct": [ok, 0], "correct_count": ok, "scored_count": 2,
         "pass_at_k": {"1": ok / 2, "2": float(ok)}, "maj_at_k": {}, "sample_rewards": {}, "reward_means": {}}
        for p, a, ok in zip(rows["prompt"], rows["answer"], correct, strict=True)
    ]  # fmt: skip
    path = run_dir / f"items-{model}-{suite}" / ITEMS_FILE
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(it) + "\n" for it in items))
    return summarize(items, EVAL, model, 0, held_out, path).model_copy(update={"suite": suite})


def register(run_dir: Path, model: str, task: list[int], other: list[int], **registry: object):
    """Register `model` with accuracy vectors on the gating suite `task` and on the guarded suite `other`."""
    from grpo_pipeline.configs.schema import RegistryConfig

    refs = {"task": problems(run_dir, "task", len(task)), "other": problems(run_dir, "other", len(other))}
    suites = {"task": scored(run_dir, refs["task"], task, "task", model),
              "other": scored(run_dir, refs["other"], other, "other", model)}  # fmt: skip
    cfg = RegistryConfig(experiment="test", model_name="m", gating_metric="task/accuracy", **registry)
    ctx = RunContext(run_dir=str(run_dir), experiment="test", recipe="test", seed=0)
    ckpt = policy(run_dir, model)
    return register_policy(ckpt, suites["task"], None, cfg, ctx, "name: test\n", {}, suites=suites)


def test_a_challenger_that_loses_on_a_guarded_suite_is_not_promoted(store):
    n = 60
    first = register(store, "v1", [1] * 20 + [0] * 40, [1] * 50 + [0] * 10, guard=["other/accuracy"])
    assert first.alias == "champion" and first.gate.guards[0].reason == "no champion to compare with"
    # much better on the gating suite (20 -> 50 of 60), much worse on the guarded one (50 -> 20 of 60)
    second = register(store, "v2", [1] * 50 + [0] * 10, [1] * 20 + [0] * 40, guard=["other/accuracy"])
    gate = second.gate
    assert second.alias == "challenger" and gate.decision == "guarded" and not gate.promote
    assert gate.delta == pytest.approx(30 / n) and gate.ci_low > 0  # the gating metric alone would promote it
    guard = gate.guards[0]
    assert guard.metric == "other/accuracy" and not guard.passed and guard.n == n
    assert guard.delta == pytest.approx(-30 / n) and guard.ci_low < -0.02
    assert "guarded metric may have regressed" in gate.reason and "other/accuracy" in gate.reason
    # the decision and every figure it used are in the version's tags, and read back from them
    version = MlflowClient().get_model_version("m", second.version)
    assert version.tags["gate.decision"] == "guarded"
    assert GateDecision.from_tags(version.tags).guards[0].delta == pytest.approx(guard.delta)
    assert "guard other/accuracy" in version.description  # the card
    # every suite is logged under its name, with its items where the next gate reads them
    run = MlflowClient().get_run(version.run_id)
    assert run.data.metrics["task/accuracy"] == pytest.approx(50 / n)
    assert run.data.metrics["other/accuracy"] == pytest.approx(20 / n)
    artifacts = {a.path for a in MlflowClient().list_artifacts(version.run_id, "eval/suites/other")}
    assert suite_items_artifact("other") in artifacts
    # as good on the guarded suite (within the margin) and better on the gating one: promoted
    third = register(store, "v3", [1] * 50 + [0] * 10, [1] * 50 + [0] * 10, guard=["other/accuracy"])
    assert third.alias == "champion" and third.gate.decision == "promoted" and third.gate.guards[0].passed


def test_without_guards_the_other_suites_do_not_gate(store):
    register(store, "v1", [1] * 20 + [0] * 40, [1] * 50 + [0] * 10)
    second = register(store, "v2", [1] * 50 + [0] * 10, [1] * 20 + [0] * 40)
    assert second.alias == "champion" and second.gate.decision == "promoted" and not second.gate.guards


# ----------------------------------------------------------------------------- the whole flow


@pytest.mark.integration
@pytest.mark.slow
def test_a_run_with_two_suites_scores_logs_and_guards_both(tmp_path, prefect_api):
    """The micro pipeline on training rows from a file, with a benchmark file as a second suite: a training row
    planted from the benchmark is dropped and said so; both suites are scored for SFT and each round, printed as a
    table each, logged under their names, and the registration carries the guard's figures."""
    bench = [{"question": f"what is {i} plus {i} when counted twice over in a long and careful way?", "a": str(2 * i)}
             for i in range(12)]  # fmt: skip
    train = [{"prompt": f"{i}+{j}=", "answer": str(i + j)} for i in range(10, 40) for j in range(10, 20)]
    train.append({"prompt": bench[3]["question"].upper(), "answer": "6"})  # the benchmark's question, shouted
    (tmp_path / "bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bench))
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    extra = [
        "data.source=file", f"data.path={tmp_path / 'train.jsonl'}", "data.num_train=240", "data.num_eval=24",
        f"eval.suites=[{{name: heldout}}, {{name: bench, source: file, path: {tmp_path / 'bench.jsonl'}, "
        "prompt_column: question, answer_column: a, n_samples: 2, k: [1, 2]}]",
        "registry.guard=[bench/accuracy]", "grpo.rounds=2",
    ]  # fmt: skip
    proc, summary_path = run_pipeline(tmp_path, "two-suites", *extra, api=prefect_api)
    summary = finished(proc, summary_path)
    out = proc.stdout
    assert "dropped 1 of" in summary["decontamination"] and "bench" in summary["decontamination"]
    assert [t["name"] for t in summary["suites"]] == [HELDOUT, "bench"]
    bench_table = summary["suites"][1]
    assert [r["model"] for r in bench_table["scores"]] == ["sft", "grpo round 1", "grpo round 2"]
    assert bench_table["eval_settings"]["problems"] == 12 and bench_table["eval_settings"]["n"] == 2
    assert "Suite heldout" in out and "Suite bench" in out and "Decontamination: dropped 1 of" in out
    stages = [s["stage"] for s in summary["stages"]]
    assert {"prepare_suite-bench", "evaluate-sft-bench", "evaluate-r1-bench", "evaluate-r2-bench"} <= set(stages)
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    second = summary["registrations"][1]
    version = client.get_model_version(second["model_name"], second["version"])
    assert version.tags["decontam.bench"] == "1"
    guards = GateDecision.from_tags(version.tags).guards
    assert [g.metric for g in guards] == ["bench/accuracy"] and guards[0].n == 12
    metrics = client.get_run(version.run_id).data.metrics
    assert {"heldout/accuracy", "bench/accuracy", "bench/pass_at_2", "sft/bench/accuracy"} <= set(metrics)
    # adding nothing: a rerun scores nothing again; the suite's evaluations are cached like the held-out ones
    again, again_path = run_pipeline(
        tmp_path, "again", *proc.args[proc.args.index("data.source=file") :], api=prefect_api
    )
    cached = {s["stage"]: s["cached"] for s in finished(again, again_path)["stages"]}
    assert cached["evaluate-r2-bench"] and cached["prepare_suite-bench"], cached


def test_a_suite_that_cannot_be_read_here_stops_the_run_before_anything_runs(tmp_path):
    from grpo_pipeline.tasks.preflight import PreflightError, check_config

    missing = tmp_path / "nowhere" / "bench.jsonl"
    suites = (
        f"eval.suites=[{{name: heldout}}, {{name: bench, source: file, path: {missing}}}, "
        "{name: local, source: hf, hf_name: ./no-such-dir}]"
    )
    cfg = load_config(None, [f"run_dir={tmp_path / 'runs'}", suites])
    with pytest.raises(PreflightError) as e:
        check_config(cfg)
    message = str(e.value)
    assert f"eval.suites[bench].path {str(missing)!r}" in message or "eval.suites[bench].path" in message
    assert "eval.suites[local].hf_name './no-such-dir'" in message and "data.path" not in message


def test_no_stage_trains_on_a_suites_prompts(tmp_path):
    """The default recipe's SFT rows are its training split plus a units drill (`07+08=`): a suite of those drill
    problems is dropped from SFT's rows, not only from the training split's, and the training split loses nothing."""
    from grpo_pipeline.flows.inputs import prepare_inputs

    def direct(name, stage, /, *, listed=True, **inputs):  # the stages as plain functions, without Prefect
        return stage.fn(**inputs)

    drill = [f"0{a}+0{b}=" for a in range(10) for b in range(10)][:30]
    (tmp_path / "drill.jsonl").write_text("".join(json.dumps({"q": p, "a": "0"}) + "\n" for p in drill))
    cfg = load_config(
        ROOT / "configs" / "tiny-arith.yaml",
        [f"run_dir={tmp_path / 'runs'}", "data.num_train=300", "data.num_eval=50", "data.num_probe=10",
         f"eval.suites=[{{name: heldout}}, {{name: drill, source: file, path: {tmp_path / 'drill.jsonl'}, "
         "prompt_column: q, answer_column: a}]"],
    )  # fmt: skip
    data, suites, clean = prepare_inputs(direct, cfg)
    assert list(suites) == [HELDOUT, "drill"] and clean is not None and clean.total == 0
    sft = pd.read_parquet(data.sft.path)["prompt"]
    assert not set(drill) & set(sft) and len(sft) == 300 + 1000 - 10 * len(drill)  # each drill row is there 10 times
    assert len(pd.read_parquet(data.train.path)) == 300


def test_the_probe_reads_no_suites_prompt(tmp_path):
    """The probe split chooses checkpoints, ends SFT at its bar and stops rounds: a suite's prompt among its rows is
    dropped as a training row's is, and its other rows stay."""
    from grpo_pipeline.flows.inputs import prepare_inputs

    def direct(name, stage, /, *, listed=True, **inputs):  # the stages as plain functions, without Prefect
        return stage.fn(**inputs)

    sizes = [f"run_dir={tmp_path / 'runs'}", "data.num_train=300", "data.num_eval=50", "data.num_probe=40"]
    cfg = load_config(ROOT / "configs" / "tiny-arith.yaml", sizes)
    plain, _, _ = prepare_inputs(direct, cfg)
    probe = pd.read_parquet(plain.probe.path)["prompt"].tolist()
    planted = probe[:6]
    (tmp_path / "bench.jsonl").write_text("".join(json.dumps({"q": p, "a": "0"}) + "\n" for p in planted))
    suites = (
        f"eval.suites=[{{name: heldout}}, {{name: bench, source: file, path: {tmp_path / 'bench.jsonl'}, "
        "prompt_column: q, answer_column: a}]"
    )
    data, _, _ = prepare_inputs(direct, load_config(ROOT / "configs" / "tiny-arith.yaml", [*sizes, suites]))
    kept = pd.read_parquet(data.probe.path)["prompt"].tolist()
    assert not set(planted) & set(kept) and kept == [p for p in probe if p not in planted]
