"""Resumable training: a stage interrupted after a periodic checkpoint continues from it, to the same weights.

In process: SFT on a tiny model crashes (an exception from a callback) between two checkpoints, and the rerun of
the same stage resumes from the newest sealed checkpoint, ends at exactly the configured step and matches an
uninterrupted run weight for weight (model, optimizer, scheduler, RNG and data order restored). Broken checkpoints
(unsealed, a file changed) are skipped. Through the CLI (integration): the pipeline is SIGKILLed once a checkpoint
exists and the rerun resumes; an exception inside the GRPO task is retried by Prefect and resumes instead of
restarting.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from grpo_pipeline.configs.schema import PipelineConfig, load_config
from grpo_pipeline.tasks.core.common import Checkpoint, Ref
from grpo_pipeline.tasks.core.stage import RunContext
from grpo_pipeline.tasks.data import prepare_data
from grpo_pipeline.tasks.model import prepare_base_model
from grpo_pipeline.tasks.sft import sft_warmup
from grpo_pipeline.tasks.training import trainer
from grpo_pipeline.tasks.training.checkpoints import SEAL, START_DIR, latest_complete, problem, seal_on_save
from tests.helpers import ROOT, cli_env, micro_overrides

STEPS, EVERY, CRASH_AT = 8, 3, 7  # checkpoints at 3 and 6; the crash loses step 7


class Crash(RuntimeError):
    pass


class CrashingSeal(TrainerCallback):
    """Seals checkpoints like the real callback, then fails the training at `CRASH_AT` (a stand-in for a fault)."""

    def on_save(self, args, state, control, **kwargs) -> None:
        seal_on_save(args, state)

    def on_step_end(self, args, state, control, **kwargs) -> None:
        if state.global_step == CRASH_AT:
            raise Crash(f"injected fault at step {state.global_step}")


def tiny_config(run_dir: Path) -> PipelineConfig:
    return load_config(
        None,
        [
            f"run_dir={run_dir}",
            "data.num_train=64",
            "data.num_eval=8",
            "model.tiny.hidden_size=32",
            "model.tiny.num_layers=1",
            "model.tiny.num_heads=2",
            "model.tiny.intermediate_size=64",
            f"sft.max_steps={STEPS}",
            "sft.batch_size=8",
            f"sft.save_every_steps={EVERY}",
        ],
    )


def inputs(cfg: PipelineConfig) -> tuple[Checkpoint, Ref, RunContext]:
    data = prepare_data(cfg.data, cfg.run_dir)
    base = prepare_base_model(cfg.model, cfg.run_dir, cfg.seed)
    return base, data.train, RunContext(run_dir=cfg.run_dir, experiment="resume", recipe="resume", seed=cfg.seed)


def sft(cfg: PipelineConfig) -> Checkpoint:
    base, train, ctx = inputs(cfg)
    return sft_warmup(base, train, cfg.sft, cfg.model, ctx)


def crashed_sft(cfg: PipelineConfig, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run SFT until the injected fault; returns the stage's resume folder."""
    with monkeypatch.context() as m:
        m.setattr(trainer, "seal_callback", CrashingSeal)
        with pytest.raises(Crash):
            sft(cfg)
    (folder,) = Path(cfg.run_dir).glob("sft/*.resume")
    assert sorted(p.name for p in folder.glob("checkpoint-*")) == [f"checkpoint-{EVERY}", f"checkpoint-{2 * EVERY}"]
    return folder


def weights(ckpt: Checkpoint) -> dict[str, torch.Tensor]:
    return load_file(str(Path(ckpt.path) / "model.safetensors"))


def meta(ckpt: Checkpoint) -> dict:
    return json.loads((Path(ckpt.path) / "meta.json").read_text())


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    ckpt = sft(tiny_config(tmp_path_factory.mktemp("uninterrupted")))
    assert meta(ckpt)["resumed_from_step"] is None
    return weights(ckpt)


def test_crashed_sft_resumes_to_the_same_weights(tmp_path, monkeypatch, uninterrupted):
    import mlflow

    cfg = tiny_config(tmp_path)
    folder = crashed_sft(cfg, monkeypatch)
    first_run = (folder / "mlflow_run_id").read_text()

    ckpt = sft(cfg)

    assert ckpt.resumed_from_step == 2 * EVERY
    assert meta(ckpt)["steps"] == STEPS  # exactly the configured steps, not 6 + 8
    assert ckpt.run_id == first_run  # the resumed attempt logs on in the run the first one started
    assert not folder.exists()  # the checkpoints go once the model is saved
    mine = weights(ckpt)
    assert mine.keys() == uninterrupted.keys()
    for name, tensor in uninterrupted.items():
        torch.testing.assert_close(mine[name], tensor, rtol=0, atol=1e-6, msg=f"{name} differs after resuming")
    assert mlflow.MlflowClient().get_run(ckpt.run_id).info.status == "FINISHED"


@pytest.mark.parametrize("damage", ["unsealed", "changed", "missing"])
def test_a_broken_newest_checkpoint_is_skipped(tmp_path, monkeypatch, damage):
    cfg = tiny_config(tmp_path)
    folder = crashed_sft(cfg, monkeypatch)
    newest = folder / f"checkpoint-{2 * EVERY}"
    assert problem(newest) is None
    if damage == "unsealed":  # killed before the save finished
        (newest / SEAL).unlink()
    elif damage == "changed":
        with open(newest / "optimizer.pt", "r+b") as fh:
            fh.seek(100)
            fh.write(b"\xff\xfe\xfd")
    else:
        (newest / "scheduler.pt").unlink()
    assert problem(newest) is not None
    assert latest_complete(folder, "sft") == folder / f"checkpoint-{EVERY}"
    assert not newest.exists()  # deleted, so it cannot count against keep_checkpoints

    ckpt = sft(cfg)
    assert ckpt.resumed_from_step == EVERY
    assert meta(ckpt)["steps"] == STEPS


# ----------------------------------------------------------------------------- a GRPO round's start survives a resume

SHORTER = "def shorter(completions, **kwargs):\n    return [-float(len(c)) for c in completions]\n"
GRPO_STEPS, GRPO_EVERY, GRPO_CRASH_AT = 6, 2, 5  # checkpoints at 2 and 4; the crash loses step 5


class CrashingGrpoSeal(CrashingSeal):
    def on_step_end(self, args, state, control, **kwargs) -> None:
        if state.global_step == GRPO_CRASH_AT:
            raise Crash(f"injected fault at step {state.global_step}")


def test_a_resumed_grpo_round_compares_with_its_true_start(tmp_path, monkeypatch):
    """grpo.keep_over_start against the round's start, when the round is interrupted and resumed: the fake probe
    finds every row right on the start's weights and every row wrong on any other, so the round must return its
    start. The resumed attempt reads the start's results and weights from the checkpoint it resumes from, on a disk
    that holds nothing else, and returns the start's weights, as the uninterrupted round does; before, the start was
    saved only beside the checkpoints, and the attempt took the resume point (step 4) as its start and returned a
    trained step as its unchanged start."""
    from grpo_pipeline.tasks.grpo import GRPORound, grpo_train
    from grpo_pipeline.tasks.training import probe

    (tmp_path / "keep_resume_rewards.py").write_text(SHORTER)
    monkeypatch.syspath_prepend(str(tmp_path))
    overrides = [
        "data.num_probe=8", "grpo.probe_problems=8", f"grpo.probe_every_steps={GRPO_EVERY}",
        "grpo.keep=best_probe", "grpo.keep_over_start=true", f"grpo.steps_per_round={GRPO_STEPS}",
        f"grpo.save_every_steps={GRPO_EVERY}", "grpo.prompts_per_step=2", "grpo.generations_per_prompt=4",
        "grpo.max_completion_tokens=4", "grpo.learning_rate=1e-3",
        "grpo.rewards=[{name: 'keep_resume_rewards:shorter'}]",
    ]  # fmt: skip

    def round_from_the_start(run_dir: Path) -> tuple[Checkpoint, dict[str, torch.Tensor]]:
        """The round from a fresh base model, and that model's weights (the round's start)."""
        cfg = tiny_grpo_config(run_dir, overrides)
        data = prepare_data(cfg.data, cfg.run_dir)
        base = prepare_base_model(cfg.model, cfg.run_dir, cfg.seed)
        start = load_file(str(Path(base.path) / "model.safetensors"))

        def on_the_start(model, tokenizer, rows, reward, max_new_tokens, tools=None):
            named = {n: p for n, p in model.named_parameters() if n in start}
            assert named, "no parameter of the model is in the start checkpoint"
            same = all(torch.equal(p.detach().cpu(), start[n]) for n, p in named.items())
            return [1.0 if same else 0.0] * len(rows)

        monkeypatch.setattr(probe, "greedy_correct", on_the_start)
        ctx = RunContext(run_dir=cfg.run_dir, experiment="resume", recipe="resume", seed=cfg.seed)
        spec = GRPORound(
            start=base, train=data.train, cfg=cfg.grpo, model_cfg=cfg.model, round_index=1, ctx=ctx, held_out=data.probe
        )
        return grpo_train(spec), start

    uninterrupted, start = round_from_the_start(tmp_path / "uninterrupted")
    [note] = uninterrupted.notes
    assert note.startswith(f"kept the start (step 0) of {GRPO_STEPS} (grpo.keep_over_start)")
    assert weights(uninterrupted).keys() == start.keys()
    assert all(torch.equal(weights(uninterrupted)[n], t) for n, t in start.items())

    run_dir = tmp_path / "interrupted"
    with monkeypatch.context() as m:
        m.setattr(trainer, "seal_callback", CrashingGrpoSeal)
        with pytest.raises(Crash):
            round_from_the_start(run_dir)
    (folder,) = run_dir.glob("grpo-round1/*.resume")
    checkpoint = folder / f"checkpoint-{2 * GRPO_EVERY}"
    sealed = json.loads((checkpoint / SEAL).read_text())["files"]
    assert {f"{START_DIR}/start.json", f"{START_DIR}/weights-rank0.pt"} <= set(sealed) and problem(checkpoint) is None
    for other in folder.iterdir():  # a rerun elsewhere: the disk holds only the checkpoint (fetched from MLflow)
        if other != checkpoint:
            shutil.rmtree(other) if other.is_dir() else other.unlink()
    resumed, _ = round_from_the_start(run_dir)
    assert resumed.resumed_from_step == 2 * GRPO_EVERY
    assert resumed.notes == uninterrupted.notes
    assert all(torch.equal(weights(resumed)[n], t) for n, t in start.items())  # the true start's weights


def tiny_grpo_config(run_dir: Path, overrides: list[str]) -> PipelineConfig:
    return load_config(
        None,
        [
            f"run_dir={run_dir}",
            "data.num_train=64",
            "data.num_eval=8",
            "model.tiny.hidden_size=32",
            "model.tiny.num_layers=1",
            "model.tiny.num_heads=2",
            "model.tiny.intermediate_size=64",
            *overrides,
        ],
    )


# ----------------------------------------------------------------------------- through the CLI, as users run it

FLAKY_REWARD = textwrap.dedent("""\
    from pathlib import Path

    def flaky(completions, trainer_state=None, **kwargs):
        # Fails the GRPO task once, at step 5 (after the checkpoint of step 4), like a transient fault would.
        marker = Path(__file__).with_name("failed-once")
        if trainer_state is not None and trainer_state.global_step == 4 and not marker.exists():
            marker.touch()
            raise RuntimeError("injected transient fault in step 5")
        return [0.0 for _ in completions]
""")


def cli(tmp_path: Path, name: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "grpo_pipeline.cli", "run", "--config", "configs/tiny-arith.yaml",
        "--summary-json", str(tmp_path / f"{name}.json"), *micro_overrides(tmp_path / "runs"), *extra,
    ]  # fmt: skip


def finished(tmp_path: Path, name: str, proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, f"pipeline failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return json.loads((tmp_path / f"{name}.json").read_text())


def notes(summary: dict) -> dict[str, str]:
    return {s["stage"]: s["note"] for s in summary["stages"]}


def stage_meta(run_dir: Path, folder: str) -> dict:
    (out,) = [p for p in run_dir.glob(f"{folder}/*") if p.is_dir() and not p.name.endswith(".resume")]
    return json.loads((out / "meta.json").read_text())


@pytest.mark.integration
@pytest.mark.slow
def test_a_pipeline_killed_mid_training_resumes_on_rerun(tmp_path):
    import mlflow

    steps = 100  # checkpoints at 25, 50 and 75: the kill lands after the first, the rerun trains the rest
    extra = [f"sft.max_steps={steps}", "sft.save_every_steps=25", "registry.model_name=resume-kill"]
    env = cli_env(tmp_path)
    # Its own session, so the kill takes the whole process group (the CLI and its Prefect server) like a lost node.
    with open(tmp_path / "killed.log", "w") as log:
        args = cli(tmp_path, "killed", *extra)
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while not list(tmp_path.glob("runs/sft/*.resume/checkpoint-*/sealed.json")):
                assert proc.poll() is None, (
                    f"the pipeline ended before a checkpoint:\n{(tmp_path / 'killed.log').read_text()[-3000:]}"
                )
                assert time.monotonic() < deadline, "no checkpoint within 300 s"
                time.sleep(0.05)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    sealed = sorted(
        int(p.parent.name.split("-")[1]) for p in tmp_path.glob("runs/sft/*.resume/checkpoint-*/sealed.json")
    )
    assert sealed and sealed[-1] < steps, sealed
    assert stage_meta_missing(tmp_path / "runs", "sft")

    rerun = subprocess.run(cli(tmp_path, "rerun", *extra), cwd=ROOT, env=env, capture_output=True, text=True)
    summary = finished(tmp_path, "rerun", rerun)
    resumed = int(notes(summary)["sft_warmup"].removeprefix("resumed from step "))
    assert resumed >= sealed[-1]  # the newest sealed checkpoint (a later one may have been sealed during the kill)
    meta = stage_meta(tmp_path / "runs", "sft")
    assert meta["steps"] == steps and meta["resumed_from_step"] == resumed
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    runs = mlflow.search_runs(search_all_experiments=True, filter_string="tags.stage = 'sft'", output_format="list")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"  # one SFT run, continued, not a second one


def stage_meta_missing(run_dir: Path, folder: str) -> bool:
    return not [p for p in run_dir.glob(f"{folder}/*") if p.is_dir() and not p.name.endswith(".resume")]


@pytest.mark.integration
@pytest.mark.slow
def test_a_failed_grpo_task_is_retried_by_prefect_and_resumes(tmp_path, prefect_api):
    (tmp_path / "flaky_reward.py").write_text(FLAKY_REWARD)
    extra = [
        f"code_dir={tmp_path}",
        "grpo.steps_per_round=6",
        "grpo.save_every_steps=2",
        "grpo.rewards=[{name: correctness}, {name: 'flaky_reward:flaky', weight: 0.1}]",
        "registry.model_name=resume-retry",
    ]
    proc = subprocess.run(
        cli(tmp_path, "retried", *extra),
        cwd=ROOT,
        env=cli_env(tmp_path, PREFECT_API_URL=prefect_api),
        capture_output=True,
        text=True,
    )
    summary = finished(tmp_path, "retried", proc)
    assert (tmp_path / "failed-once").exists()  # the fault did happen
    assert "injected transient fault in step 5" in proc.stdout + proc.stderr
    assert notes(summary)["grpo-round1"] == "resumed from step 4"
    meta = stage_meta(tmp_path / "runs", "grpo-round1")
    assert meta["steps"] == 6 and meta["resumed_from_step"] == 4
