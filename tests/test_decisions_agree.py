"""Every process of a multi-process stage takes the same stop and keep decisions (tasks/training/consensus.py).

Each scenario gives process 0 and process 1 figures that, read alone, lead to different decisions: a different
patience stop and kept step, a different step at which SFT's bar is reached, a saturation stop or a fail_fast alarm
on one process only. Run alone (one process each), the outcomes differ; run as two processes in one gloo group,
both take the same decision at the same step, the one the gathered figures (health) or process 0's figures (probe)
give. Without that, one process would stop while the other waited in its next collective."""

from __future__ import annotations

import numpy as np
import pytest

from grpo_pipeline.configs.schema import MonitorsConfig
from grpo_pipeline.tasks.training.keep_rule import halves
from tests.decisions import StepModel, fake_probe, in_two_processes, probe_callback, run_probe

ROWS = 16
CHOOSE, CONFIRM = halves(ROWS)


def level(j: int) -> list[float]:
    """Probe results with `j` of the 8 rows of each half right."""
    items = np.zeros(ROWS)
    items[CHOOSE[:j]] = items[CONFIRM[:j]] = 1.0
    return [float(v) for v in items]


# ----------------------------------------------------------------------------- the probe

# Process 0: better up to step 3, then worse: probe_patience=2 ends the round at step 5, which keeps step 3.
# Process 1: better at every step: no early end, the last step (8) kept.
PATIENCE_LEVELS = {0: [2, 3, 4, 5, 4, 3, 2, 1, 1], 1: [0, 1, 2, 3, 4, 5, 6, 7, 8]}


def patience_scenario(rank: int) -> dict:
    with pytest.MonkeyPatch.context() as mp:
        fake_probe(mp, lambda step: level(PATIENCE_LEVELS[rank][step]))
        probe = probe_callback(ROWS, keep_best=True, patience=2, over_start=True)
        model = StepModel()
        ended = run_probe(probe, model, max_steps=8)
        return {"ended": ended, "kept": probe.kept_step, "weights": model.step.item(), "notes": probe.notes}


# SFT's bar (0.5): process 0 reaches it at step 4, process 1 at step 2.
BAR_LEVELS = {0: [0, 1, 2, 3, 4, 5, 6], 1: [0, 2, 4, 6, 8, 8, 8]}


def bar_scenario(rank: int) -> dict:
    with pytest.MonkeyPatch.context() as mp:
        fake_probe(mp, lambda step: level(BAR_LEVELS[rank][step]))
        probe = probe_callback(ROWS, stop_at=0.5)
        return {"ended": run_probe(probe, StepModel(), max_steps=6), "notes": probe.notes}


@pytest.mark.parametrize(
    ("scenario", "alone", "together"),
    [
        ("patience", [(5, 3), (8, 8)], (5, 3)),
        ("bar", [(4, None), (2, None)], (4, None)),
    ],
    ids=["patience-and-kept-step", "sft-bar"],
)
def test_the_probe_decides_alike_on_both_processes(scenario, alone, together, two_processes):
    def outcome(result: dict) -> tuple[int, int | None]:
        return result["ended"], result.get("kept")

    assert [outcome(SCENARIOS[scenario](rank)) for rank in (0, 1)] == alone  # alone, the figures disagree
    both = two_processes[scenario]
    assert [outcome(result) for result in both] == [together, together]
    assert both[0]["notes"] == both[1]["notes"]
    if together[1] is not None:
        assert both[0]["weights"] == both[1]["weights"] == together[1]  # each process restored the same step


# ----------------------------------------------------------------------------- the health watch

GROUP, GROUPS = 4, 2  # each process scores 2 groups of 4 completions per step
QUIET = {
    "window_steps": 1,
    "zero_spread_max": 1.0,
    "kl_max": 1e9,
    "entropy_min_ratio": 0.0,
    "length_min_ratio": 0.0,
    "length_max_ratio": 1e9,
    "clip_ratio_max": 1.0,
    "stagnation_steps": 0,
}
MIXED = [1.0, 0.0, 1.0, 0.0]  # a group with spread: a gradient, neither solved nor stuck


def run_health(cfg: MonitorsConfig, group_at: dict[int, list[float]], steps: int = 6) -> dict:
    """A round of `steps` steps whose correctness reward scores every group of this process as `group_at[step]`
    (MIXED when absent); returns where it ended and how."""
    from grpo_pipeline.tasks.training.health import RoundHealth
    from grpo_pipeline.tasks.training.monitor import TrainingHealthError

    health = RoundHealth(cfg, "grpo-round1", 0.0, GROUP, [1.0], correctness_index=0)
    [reward] = health.wrap_rewards([lambda completions, **kw: list(completions)])
    health.begin(0)
    for step in range(1, steps + 1):
        reward(group_at.get(step, MIXED) * GROUPS)
        try:
            health.step_end(step, None)
        except TrainingHealthError as e:
            return {"ended": step, "how": "fail_fast", "alarms": health.alarms, "error": str(e)[:60]}
        if health.stop_requested:
            return {"ended": step, "how": "saturated", "alarms": health.alarms, "notes": health.notes}
    return {"ended": steps, "how": "finished", "alarms": health.alarms}


def saturation_scenario(rank: int) -> dict:
    # process 0 solves every group from step 3 on, process 1 none: together half the groups are solved (> 0.4)
    cfg = MonitorsConfig(**QUIET, saturated_min=0.4, stop_when_saturated=True)
    return run_health(cfg, {step: [1.0] * GROUP for step in range(3, 7)} if rank == 0 else {})


def fail_fast_scenario(rank: int) -> dict:
    # process 1's groups are all wrong from step 2 on, process 0's mixed: together half have zero spread (> 0.4)
    cfg = MonitorsConfig(**{**QUIET, "zero_spread_max": 0.4}, fail_fast=True)
    return run_health(cfg, {step: [0.0] * GROUP for step in range(2, 7)} if rank == 1 else {})


@pytest.mark.parametrize(
    ("scenario", "alone", "together"),
    [
        ("saturation", [(3, "saturated"), (6, "finished")], (3, "saturated")),
        ("fail_fast", [(6, "finished"), (2, "fail_fast")], (2, "fail_fast")),
    ],
    ids=["stop_when_saturated", "fail_fast"],
)
def test_the_health_watch_decides_alike_on_both_processes(scenario, alone, together, two_processes):
    def outcome(result: dict) -> tuple[int, str]:
        return result["ended"], result["how"]

    assert [outcome(SCENARIOS[scenario](rank)) for rank in (0, 1)] == alone
    both = two_processes[scenario]
    assert [outcome(result) for result in both] == [together, together]
    assert both[0] == both[1]  # the same alarms and notes, from the gathered figures


SCENARIOS = {
    "patience": patience_scenario,
    "bar": bar_scenario,
    "saturation": saturation_scenario,
    "fail_fast": fail_fast_scenario,
}


def every_scenario(rank: int) -> dict:
    """Every scenario in turn, in one pair of processes (starting a pair costs more than the scenarios)."""
    return {name: scenario(rank) for name, scenario in SCENARIOS.items()}


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> dict[str, list[dict]]:
    """Each scenario's result on process 0 and process 1 of one gloo group."""
    by_rank = in_two_processes(every_scenario, tmp_path_factory.mktemp("two-processes"))
    return {name: [by_rank[0][name], by_rank[1][name]] for name in SCENARIOS}


def test_a_single_process_runs_no_collective():
    from grpo_pipeline.tasks.training.consensus import agree, gather, rank, world_size

    assert (world_size(), rank()) == (1, 0)
    assert agree({"a": 1}) == {"a": 1} and gather(3) == [3]
