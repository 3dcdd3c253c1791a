"""The whole flow on a micro config, run through the CLI in fresh processes as users run it.

The session's cold run (conftest's `micro_run`) is inspected as it is; the `reruns` fixture then runs the pipeline
on its store again, always in the same order (an unchanged rerun, a changed `grpo.*` value that must rerun only the
GRPO side, `--refresh` with yet another value, a cached checkpoint changed on disk), each when a test first needs it
or a later one, and records what each run saw and left, so each test reads an explicit state whichever tests ran
before it, and each also runs alone (`-k name`). `round_reruns` does the same for runs of several rounds (two rounds
of another model, rounds that return their start), in the slow tier.
"""

from __future__ import annotations

import itertools
import json
import re
import sqlite3
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_pipeline.tasks.scoring.generation import generate
from tests.conftest import MicroRun
from tests.helpers import MICRO_MODEL, ROOT, cli_env, finished, micro_overrides, run_cli, run_pipeline

pytestmark = pytest.mark.integration

GRPO_SIDE = {"grpo-round1", "evaluate-r1", "evaluate-r1-one_digit", "register-r1"}
MODEL_NAME = MICRO_MODEL


def client_for(store: Path) -> MlflowClient:
    mlflow.set_tracking_uri(f"sqlite:///{store / 'runs' / 'mlflow.db'}")
    return MlflowClient()


def states(summary: dict) -> dict[str, bool]:
    return {s["stage"]: s["cached"] for s in summary["stages"]}


def aliases(store: Path) -> dict[str, list[str]]:
    """Each registered version of the model -> its aliases."""
    client = client_for(store)
    found = sorted(int(v.version) for v in client.search_model_versions(f"name='{MODEL_NAME}'"))
    # search_model_versions leaves the aliases out; get_model_version has them
    return {str(v): sorted(client.get_model_version(MODEL_NAME, str(v)).aliases) for v in found}


def champion(registry: dict[str, list[str]]) -> str:
    (version,) = [v for v, names in registry.items() if "champion" in names]
    return version


@dataclass(frozen=True)
class Rerun:
    """One more run on the micro run's store: its process and summary file, and the registry (each version's
    aliases) just before and just after it."""

    proc: subprocess.CompletedProcess
    summary_path: Path
    before: dict[str, list[str]]
    after: dict[str, list[str]]

    @property
    def summary(self) -> dict:
        return finished(self.proc, self.summary_path)

    @property
    def output(self) -> str:
        return self.proc.stdout + self.proc.stderr


class Plan:
    """The runs of a plan on the micro run's store, in its order, each run when a test first asks for it (or for a
    later one): each test's time is its own run's. A failed rerun fails only the tests that read it."""

    def __init__(
        self, micro_run: MicroRun, prefect_api: str, request: pytest.FixtureRequest,
        plan: dict[str, tuple[str, tuple[str, ...]]],
    ):  # fmt: skip
        """`plan`: each run's name -> the test that reads it, and the run's overrides."""
        self.micro_run, self.prefect_api = micro_run, prefect_api
        self.plan = {name: extra for name, (_, extra) in plan.items()}
        self.done: dict[str, Rerun] = {}
        # only the runs that a test of this session reads, so that a run whose test is not selected (another tier's,
        # or left out by -k) costs nothing
        selected = {getattr(item, "originalname", item.name) for item in request.session.items}
        self.wanted = {name for name, (test, _) in plan.items() if test in selected}

    def __getitem__(self, wanted: str) -> Rerun:
        store = self.micro_run.store
        for name, extra in self.plan.items():
            if name not in self.done and (name in self.wanted or name == wanted):
                if name == "damaged":
                    for sft_dir in (store / "runs" / "sft").iterdir():  # one, unless the project's code changed
                        (sft_dir / "config.json").write_text("{}")  # a cached checkpoint edited behind its back
                before = aliases(store)
                proc, summary_path = run_pipeline(store, name, *extra, api=self.prefect_api)  # the module's server
                self.done[name] = Rerun(proc, summary_path, before, aliases(store))
            if name == wanted:
                break
        return self.done[wanted]


@pytest.fixture(scope="module")
def reruns(micro_run: MicroRun, prefect_api: str, request: pytest.FixtureRequest) -> Plan:
    """The reruns of the caching tests. `--refresh` uses a learning rate of its own, so it cannot cache what
    `grpo-changed` must train; the damaged checkpoint comes last, so the other runs never see it (a rebuilt SFT
    checkpoint is what `round_reruns`, if it runs after, starts from)."""
    plan = {
        "warm": ("test_unchanged_rerun_is_fully_cached", ()),
        "grpo-changed": ("test_changed_grpo_value_reruns_only_the_grpo_side", ("grpo.learning_rate=3e-4",)),
        "refresh": ("test_refresh_reruns_everything", ("grpo.learning_rate=2e-4", "--refresh")),
        "damaged": ("test_a_cached_result_whose_files_changed_on_disk_is_rebuilt", ()),
    }
    return Plan(micro_run, prefect_api, request, plan)


@pytest.fixture(scope="module")
def round_reruns(micro_run: MicroRun, prefect_api: str, request: pytest.FixtureRequest) -> Plan:
    """The runs of more than one round (the slow tier's: tests/test_difficulty.py runs the filter before a second
    round in `make test`), each under a model name of its own (the later registry.model_name wins
    over run_pipeline's), from the cached SFT policy."""
    plan = {
        "rounds": (
            "test_iterative_rounds_start_from_the_last_policy",
            ("registry.model_name=micro-rounds", "grpo.rounds=2", "grpo.beta=0.04"),
        ),
        # rounds that must beat their start by half the confirming probe rows: round 1 returns its start
        "returned-start": (
            "test_a_round_that_returned_its_start_is_not_registered_and_ends_the_rounds",
            (
                "registry.model_name=micro-kept",
                "grpo.rounds=3",
                "grpo.keep=best_probe",
                "grpo.keep_over_start=true",
                "grpo.keep_margin=0.5",
            ),
        ),
    }
    return Plan(micro_run, prefect_api, request, plan)


def test_cold_run_trains_evaluates_and_registers(micro_run: MicroRun):
    store, summary = micro_run.store, micro_run.summary
    assert not any(states(summary).values()), states(summary)
    assert list(states(summary)) == [
        "prepare_data",
        "validate_data",
        "prepare_suite-one_digit",
        "decontaminate",
        "base_model",
        "sft_warmup",
        "evaluate-sft",
        "evaluate-sft-one_digit",
        "grpo-round1",
        "evaluate-r1",
        "evaluate-r1-one_digit",
        "register-r1",
    ]
    reg = summary["registrations"][0]
    assert (reg["model_name"], reg["version"], reg["alias"]) == (MODEL_NAME, "1", "champion")

    # version 1 as the registry holds it (a rerun on this store may since have moved the champion alias on)
    client = client_for(store)
    version = client.get_model_version(MODEL_NAME, "1")
    check_version_tags_and_card(version, summary)
    run = client.get_run(version.run_id)
    assert run.info.run_id == reg["run_id"]
    assert run.data.tags["stage"] == "grpo"
    assert {"eval/accuracy", "eval/pass_at_4", "eval/maj_at_4", "eval/reward/correctness"} <= set(run.data.metrics)
    assert run.data.params["eval_n_samples"] == "4" and run.data.params["eval_seed"] == "0"
    # TRL reported per-step training metrics to the same run
    assert len(client.get_metric_history(run.info.run_id, "reward")) == 2
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "eval")}
    assert {"eval/items.jsonl", "eval/completions.json"} <= artifacts
    check_registered_model_generates_as_checkpoint(micro_run.grpo_checkpoint)
    config_text = Path(
        mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="config.yaml")
    ).read_text()
    assert "steps_per_round: 2" in config_text
    check_summary_artifact(store)


def check_version_tags_and_card(version: ModelVersion, summary: dict) -> None:
    """The registered version's lineage tags, objective, precision, rollout engine and SFT warning, in its tags and
    its model card."""
    tags = version.tags
    for tag in (
        "config_hash",
        "data_fingerprint",
        "parent_run_id",
        "eval_fingerprint",
        "code_version",
        "torch_version",
    ):
        assert tags.get(tag), tag
    assert (tags["parent_model"], tags["round"], tags["gate.decision"]) == ("tiny", "1", "first")
    assert (tags["grpo.loss_type"], tags["grpo.epsilon"], tags["grpo.delta"]) == ("dapo", "0.2", "None")  # objective
    assert "## Objective (TRL's GRPOConfig)\nloss_type=dapo, importance_sampling_level=token" in version.description
    # the dtypes training used, read from the trainer (no CUDA here: no autocast)
    assert summary["precision"] == "float32 weights and optimizer state, no autocast"
    assert "Trained with float32 weights and optimizer state, no autocast." in version.description
    # what generated GRPO's rollouts (no CUDA here: transformers' generate), in the summary and the card
    assert summary["rollouts"] == "transformers generate"
    assert "GRPO rollouts generated by transformers generate." in version.description
    # six SFT steps learn nothing: the run said so before GRPO, and the summary, the version and its card carry it
    assert summary["sft_warning"].startswith("SFT has not learned its data: the SFT policy's greedy held-out")
    assert tags["sft_warning"] == summary["sft_warning"]
    assert f"## Training notes\n- **Warning**: {summary['sft_warning']}." in version.description  # the card


def check_registered_model_generates_as_checkpoint(checkpoint: Path) -> None:
    """The registered version is an MLflow transformers model: loaded through MLflow, it generates what the
    checkpoint on disk generates."""
    generator = mlflow.transformers.load_model(f"models:/{MODEL_NAME}/1")
    prompts = ["12+34=", "7+80=", "99+1="]
    loaded = [generator(p, max_new_tokens=4, do_sample=False)[0]["generated_text"] for p in prompts]
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    tokenizer.padding_side = "left"
    direct = generate(
        AutoModelForCausalLM.from_pretrained(checkpoint),
        tokenizer,
        prompts,
        max_new_tokens=4,
        batch_size=1,
    )
    assert loaded == [p + c[0] for p, c in zip(prompts, direct, strict=True)]


def check_summary_artifact(store: Path) -> None:
    """The summary table is also a Prefect markdown artifact of the run's flow run, the store's first (read from the
    local server's database)."""
    with sqlite3.connect(store / "prefect-home" / "prefect.db") as db:
        artifacts = db.execute(
            "select a.type, a.data from artifact a where a.key = 'grpo-pipeline-summary' and a.flow_run_id = "
            "(select f.id from flow_run f where f.parent_task_run_id is null order by f.created limit 1)"
        ).fetchall()
    assert [t for t, _ in artifacts] == ["markdown"]
    assert "register-r1" in artifacts[0][1] and MODEL_NAME in artifacts[0][1]


def test_the_console_has_no_deprecation_warnings_and_no_raw_log_dicts(micro_run: MicroRun):
    console = micro_run.output
    assert "FutureWarning" not in console
    assert "gradient_checkpointing" not in console
    assert "pin_memory" not in console  # torch's UserWarning for pinned memory without an accelerator
    assert "{'loss'" not in console and "{'train_runtime'" not in console


def test_each_training_stage_shows_one_progress_line_with_its_numbers(micro_run: MicroRun):
    # the bar (its last state), then the log line with the same numbers
    console = micro_run.output
    assert re.search(r"grpo-round1: 100%.*2/2.*loss=[-\d.e]+, reward=[-\d.e]+, probe acc=[\d.e]+", console)
    assert re.search(r"sft: 100%.*6/6", console)
    assert re.search(r"sft finished: 6 steps, train loss \d+\.\d{4}", console)
    assert re.search(r"grpo-round1 finished: 2 steps, train loss [-\d.]+ \(last logged: loss=", console)


def test_unchanged_rerun_is_fully_cached(reruns):
    warm = reruns["warm"]
    summary = warm.summary
    assert all(states(summary).values()), states(summary)
    assert warm.after == warm.before  # nothing new was registered, no alias moved


def test_changed_grpo_value_reruns_only_the_grpo_side(reruns):
    changed = reruns["grpo-changed"]
    summary = changed.summary
    cached = states(summary)
    assert {s for s, c in cached.items() if not c} == GRPO_SIDE, cached
    reg = summary["registrations"][0]
    champ = champion(changed.before)
    assert reg["version"] == str(len(changed.before) + 1) and reg["alias"] in ("champion", "challenger")
    assert reg["gate"]["champion_version"] == champ and reg["gate"]["n"] > 0
    after = {v: changed.after[v] for v in (champ, reg["version"])}
    if reg["alias"] == "champion":  # the alias moved to the better version
        assert after == {champ: [], reg["version"]: ["champion"]}
    else:
        assert after == {champ: ["champion"], reg["version"]: ["challenger"]}


@pytest.mark.slow
def test_refresh_reruns_everything(reruns):
    summary = reruns["refresh"].summary
    assert not any(states(summary).values()), states(summary)


def test_a_cached_result_whose_files_changed_on_disk_is_rebuilt(reruns, micro_run: MicroRun):
    damaged = reruns["damaged"]
    out = damaged.output
    stages = states(damaged.summary)
    assert "sft_warmup: not using the cached result" in out and "has changed" in out
    assert stages["sft_warmup"] is False and stages["prepare_data"] is True
    sft_dir = max((micro_run.store / "runs" / "sft").iterdir(), key=lambda p: p.stat().st_mtime)  # the rebuilt one
    assert json.loads((sft_dir / "config.json").read_text())["model_type"] == "llama"  # rebuilt in place


def test_invalid_data_stops_before_training(tmp_path, prefect_api):
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(20)]
    rows[5]["prompt"] = rows[4]["prompt"]  # duplicate
    rows[9]["answer"] = None  # missing answer
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    args = [
        "run",
        "--config",
        "configs/tiny-arith.yaml",
        *micro_overrides(tmp_path / "runs"),
        "data.source=file",
        f"data.path={path}",
        "data.num_eval=4",
    ]
    proc = run_cli(args, cli_env(tmp_path, PREFECT_API_URL=prefect_api))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "data validation failed" in out
    assert "not_nullable" in out and "no_duplicate_prompts_within_split" in out
    # nothing downstream ran: no model built, no SFT checkpoint, no MLflow store
    runs = tmp_path / "runs"
    assert not (runs / "sft").exists() and not (runs / "base").exists() and not (runs / "mlflow.db").exists()
    # validation errors are not retried
    assert "Retry 1/" not in out


@pytest.mark.slow
def test_iterative_rounds_start_from_the_last_policy(round_reruns, micro_run: MicroRun):
    """`grpo.rounds=2` with a KL term: round 2 starts from round 1's policy, which is also its reference model."""
    result = round_reruns["rounds"].summary
    assert [s["stage"] for s in result["stages"]][-8:] == [
        "grpo-round1",
        "evaluate-r1",
        "evaluate-r1-one_digit",
        "register-r1",
        "grpo-round2",
        "evaluate-r2",
        "evaluate-r2-one_digit",
        "register-r2",
    ]
    assert [r["version"] for r in result["registrations"]] == ["1", "2"]
    client = client_for(micro_run.store)
    first, second = (client.get_run(r["run_id"]).data for r in result["registrations"])
    # lineage: round 1 comes from the base model (through SFT's run), round 2 from the version round 1 registered
    assert (first.tags["parent_model"], second.tags["parent_model"]) == ("tiny", "models:/micro-rounds/1")
    assert second.tags["parent_run_id"] == result["registrations"][0]["run_id"]
    assert client.get_run(first.tags["parent_run_id"]).data.tags["stage"] == "sft"
    assert (first.tags["round"], second.tags["round"]) == ("1", "2")
    assert "kl" in second.metrics  # the reference model took part in round 2
    # the rounds as a plot, beside the last version's learning curve
    plots = {a.path for a in client.list_artifacts(result["registrations"][1]["run_id"], "plots")}
    assert {"plots/rounds.png", "plots/learning_curve.png"} <= plots
    # the rounds table: each model's gating metric and its paired change against the model before it
    rows = result["rounds"]
    assert [r["model"] for r in rows] == ["sft", "grpo round 1", "grpo round 2"]
    scores = {s["model"]: s["metrics"]["accuracy"] for s in result["scores"]}
    for before, row in itertools.pairwise(rows):
        assert row["value"] == pytest.approx(scores[row["model"]])
        assert row["change"] == pytest.approx(row["value"] - before["value"])
        assert row["change_ci"][0] <= row["change"] <= row["change_ci"][1] and row["n"] == 24


@pytest.mark.slow
def test_a_round_that_returned_its_start_is_not_registered_and_ends_the_rounds(round_reruns, micro_run: MicroRun):
    """grpo.rounds is a maximum: a round that returned its start unchanged registers nothing, starts no round after
    it, and the summary says so."""
    rerun = round_reruns["returned-start"]
    result = rerun.summary
    stages = [s["stage"] for s in result["stages"]]
    assert stages[-1] == "grpo-round1" and "grpo-round2" not in stages  # not evaluated again, nothing after it
    assert result["registrations"] == []
    assert not client_for(micro_run.store).search_model_versions("name='micro-kept'")
    assert result["stopped"].startswith("round 1 returned its start unchanged")
    assert "no further round started (1 of at most 3 rounds ran)" in result["stopped"]
    assert [r["model"] for r in result["scores"]] == ["sft"]  # no scores of its own: they would be the start's
    assert "Rounds: round 1 returned its start" in rerun.output
    assert any(note.startswith("kept the start (step 0)") for note in result["notes"][0])


@pytest.mark.slow
def test_flow_runs_from_python_without_the_cli(tmp_path, prefect_api):
    """The flow applies the process defaults itself (as a Prefect worker would need): plain Python is enough."""
    script = textwrap.dedent(f"""
        from grpo_pipeline.configs.schema import load_config
        from grpo_pipeline.flows.grpo_pipeline import grpo_pipeline

        cfg = load_config({str(ROOT / "configs/tiny-arith.yaml")!r}, {micro_overrides(tmp_path / "runs")!r})
        summary = grpo_pipeline(config=cfg)
        print("REGISTERED", summary.registrations[0].version)
    """)
    env = cli_env(tmp_path, PREFECT_API_URL=prefect_api)
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "REGISTERED 1" in proc.stdout
    # the pipeline's own logger reached the output through the flow's setup (logging was never configured here)
    assert "grpo_pipeline" in proc.stderr and "eval r1: accuracy" in proc.stderr
