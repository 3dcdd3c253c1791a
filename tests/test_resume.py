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
from grpo_pipeline.tasks import training
from grpo_pipeline.tasks.checkpoints import SEAL, SealCheckpoints, latest_complete, problem
from grpo_pipeline.tasks.common import Checkpoint, Ref
from grpo_pipeline.tasks.data import prepare_data
from grpo_pipeline.tasks.model import prepare_base_model
from grpo_pipeline.tasks.sft import sft_warmup
from grpo_pipeline.tasks.stage import RunContext
from tests.helpers import ROOT, cli_env, micro_overrides

STEPS, EVERY, CRASH_AT = 8, 3, 7  # checkpoints at 3 and 6; the crash loses step 7


class Crash(RuntimeError):
    pass


class CrashingSeal(SealCheckpoints):
    """Seals checkpoints like the real callback, then fails the training at `CRASH_AT` (a stand-in for a fault)."""

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
        m.setattr(training, "SealCheckpoints", CrashingSeal)
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
