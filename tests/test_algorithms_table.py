"""The objective ablation's table (benchmarks/algorithms.py): each recipe and regime is a block of its own, every
variant is compared with dapo of the same block and seed, and an off-policy variant's record carries its regime."""

from __future__ import annotations

import sys

import pytest

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import algorithms
from algorithms import REGIMES, VARIANTS, table


def result(variant: str, regime: str, seed: int, accuracy: float) -> dict:
    return {
        "recipe": "tiny-arith",
        "regime": regime,
        "seed": seed,
        "variant": variant,
        "sft": 0.4,
        "accuracy": accuracy,
        "s_per_step": 0.1,
    }


def test_regimes_are_blocks_compared_within_themselves():
    results = [result("dapo", "on-policy", s, 0.80) for s in range(3)]
    results += [result("cispo", "on-policy", s, 0.80) for s in range(3)]
    # off-policy, dapo falls and cispo holds: cispo beats dapo there, by 10 points on every seed
    results += [result("dapo", "num_iterations=4", s, 0.70 + 0.01 * s) for s in range(3)]
    results += [result("cispo", "num_iterations=4", s, 0.80 + 0.01 * s) for s in range(3)]
    lines, best, beats = table(results, ["dapo", "cispo"])
    on = next(line for line in lines if "| on-policy | cispo |" in line)
    off = next(line for line in lines if "| num_iterations=4 | cispo |" in line)
    assert "+0.0 (+0.0..+0.0)" in on
    assert "+10.0 (+10.0..+10.0)" in off
    assert beats == ["tiny-arith@num_iterations=4:cispo"]
    assert best == ["tiny-arith@on-policy:dapo", "tiny-arith@num_iterations=4:cispo"]
    assert sum("(SFT start)" in line for line in lines) == 2


@pytest.mark.parametrize("regime", [r for r in REGIMES if r != "on-policy"])
def test_every_regime_is_off_policy_in_the_config(regime):
    from grpo_pipeline.configs.schema import load_config

    cfg = load_config(ROOT / "configs" / "tiny-arith.yaml", [*REGIMES[regime], *VARIANTS["cispo"]])
    assert cfg.grpo.num_iterations > 1 or (cfg.grpo.steps_per_generation or 1) > 1


def test_a_round_that_returned_its_start_is_one_clear_error(tmp_path, monkeypatch):
    """Under keep_over_start a round can return its start and register nothing: there is no accuracy of its own to
    put in the table, so the run stops with the overrides that keep the round's best step, instead of a bare
    unpacking error."""
    stopped = "round 1 returned its start unchanged"
    record = {"summary": {"registrations": [], "stopped": stopped, "scores": []}, "total_s": 1.0}
    monkeypatch.setattr(algorithms, "run_pipeline", lambda *args: record)
    with pytest.raises(SystemExit, match=r"grpo\.keep_over_start=false grpo\.keep_margin=0") as e:
        algorithms.run_variant(ROOT / "configs" / "tiny-arith.yaml", tmp_path, 0, "dapo@num_iterations=2", [], {}, None)
    assert stopped in str(e.value)
    assert not (tmp_path / "variant-dapo@num_iterations=2.json").exists()
