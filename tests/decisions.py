"""Driving the callbacks that decide (the held-out probe, the health watch) without a trainer, with figures a test
chooses per step and per process, in one process or in two (torch.distributed over gloo, spawned here).

The model is one parameter whose value is the training step that produced it: the fake probe reads the step from
the model it is given, and the weights a round ends with say which step they are."""

from __future__ import annotations

import datetime
import json
import socket
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import torch

from grpo_pipeline.configs.sampling import Sampling
from grpo_pipeline.configs.schema import CORRECTNESS

PLAIN = Sampling(temperature=None, max_new_tokens=4)  # the probe's completions: greedy, 4 tokens, no tools


@dataclass
class Args:
    save_strategy: str = "no"
    output_dir: str = ""


@dataclass
class State:
    global_step: int = 0
    max_steps: int = 0


@dataclass
class Control:
    should_training_stop: bool = False


class StepModel(torch.nn.Module):
    def __init__(self, step: int = 0) -> None:
        super().__init__()
        self.step = torch.nn.Parameter(torch.tensor(float(step)))

    def at(self, step: int) -> None:
        with torch.no_grad():
            self.step.fill_(step)


def fake_probe(monkeypatch: Any, results: Callable[[int], list[float | None]]) -> None:
    """Make the probe's measurement `results(step)`, the step read from the model."""
    from grpo_pipeline.tasks.training import probe

    monkeypatch.setattr(probe, "greedy_correct", lambda model, *args: list(results(int(model.step.item()))))


def probe_callback(rows: int, **kwargs: Any):
    from grpo_pipeline.tasks.training.probe import HeldOutAccuracyProbe

    frame = pd.DataFrame({"prompt": [f"p{i}" for i in range(rows)], "answer": ["0"] * rows})
    return HeldOutAccuracyProbe(frame, None, kwargs.pop("every_steps", 1), PLAIN, CORRECTNESS, **kwargs)


def run_probe(probe, model: StepModel, max_steps: int, args: Args | None = None, first_step: int = 0,
              crash_at: int | None = None, rates: list[float] | None = None, save_every: int = 0) -> int:  # fmt: skip
    """Train `model` (its step is its weight) from `first_step` to `max_steps` under `probe`; returns the step training
    ended at. `crash_at` raises there, after the step's callbacks, like a fault between two checkpoints. `rates`
    collects the learning rate each step's callbacks leave for the next, a constant scheduler setting 1.0 first.
    With `save_every`, a checkpoint folder (`checkpoint-<step>` in args.output_dir) is written that often and the
    probe's `on_save` runs, as the Trainer does."""
    args = args or Args()
    model.at(first_step)
    state = State(first_step, max_steps)
    probe.on_train_begin(args, state, Control(), model=model)
    for step in range(first_step + 1, max_steps + 1):
        model.at(step)
        state.global_step = step
        control = Control()
        optimizer = SimpleNamespace(param_groups=[{"lr": 1.0}])  # the scheduler sets each step's rate anew
        probe.on_step_end(args, state, control, model=model, optimizer=optimizer)
        if rates is not None:
            rates.append(optimizer.param_groups[0]["lr"])
        if save_every and step % save_every == 0:
            Path(args.output_dir, f"checkpoint-{step}").mkdir(parents=True)
            probe.on_save(args, state, control)
        if step == crash_at:
            raise RuntimeError(f"injected fault at step {step}")
        if control.should_training_stop:
            break
    probe.on_train_end(args, state, Control(), model=model)
    return state.global_step


# ----------------------------------------------------------------------------- two processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def in_two_processes(scenario: Callable[[int], Any], out: Path) -> list[Any]:
    """`scenario(rank)` in two spawned processes joined in one gloo group; what each returned (JSON), by rank. A
    process left waiting in a collective fails after 60 s instead of hanging the test."""
    import torch.multiprocessing as mp

    mp.spawn(_child, args=(scenario, free_port(), str(out)), nprocs=2, join=True)
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for r, result in enumerate(results):
        assert "error" not in result, f"process {r} failed:\n{result['error']}"
    return [result["value"] for result in results]


def _child(rank: int, scenario: Callable[[int], Any], port: int, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=60)
    # The store is made here, not by init_method, so that process 0, which serves it, can outlive process 1's use of
    # it: a process that tears its group down while the other is still inside a collective or still talking to the
    # store (its TCPStore server gone) dies in C++ ("terminate called without an active exception", SIGABRT),
    # seen under load in about one pair in seven.
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timeout)
    try:
        result = {"value": scenario(rank)}
    except Exception:
        result = {"error": traceback.format_exc()}
    try:
        dist.barrier()  # neither process leaves while the other still has a collective in flight
    finally:
        dist.destroy_process_group()
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
        if rank == 1:
            store.set("released", "1")  # process 1 is done with the group and the store
        else:
            store.wait(["released"])  # process 0 serves the store until then
