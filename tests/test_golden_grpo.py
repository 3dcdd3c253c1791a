"""Golden regression test: a fixed-seed tiny model, a short SFT warmup and a few dozen GRPO steps must reproduce
the committed reward trajectory (tests/golden/grpo_tiny.json) within a tolerance.

It exercises the real stages (`sft_warmup`, `grpo_train` with TRL's GRPOTrainer and the registered rewards), so a
broken advantage (e.g. a sign flip, advantages zeroed by a wrong normalisation) or broken reward wiring (weights,
columns, names) changes the trajectory and fails it. The comparison is on window means, which tolerates the small
numeric differences between CPUs while the learning signal (end minus start) is several tolerances wide.

Regenerate after an intended change of the training code with:
    GOLDEN_UPDATE=1 pytest tests/test_golden_grpo.py
and say in the commit why the trajectory moved.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

GOLDEN = Path(__file__).parent / "golden" / "grpo_tiny.json"

OVERRIDES = [
    "seed=0",
    # One-digit addition: a 60-step SFT already answers a fair share, so GRPO has signal from the first step.
    "data.synthetic.max_digits=1",
    "data.num_train=62",
    "data.num_eval=8",
    "data.num_probe=0",
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=2",
    "model.tiny.num_heads=2",
    "model.tiny.intermediate_size=64",
    "model.tiny.max_positions=16",
    "sft.max_steps=60",
    "sft.learning_rate=1e-2",
    "sft.batch_size=64",
    "grpo.steps_per_round=40",
    "grpo.prompts_per_step=16",
    "grpo.generations_per_prompt=8",
    "grpo.learning_rate=2e-3",
    "grpo.max_completion_tokens=4",
    "grpo.log_every_steps=1",
    "grpo.probe_problems=0",
    "grpo.rewards=[{name: correctness, weight: 1.0}, {name: digit_match, weight: 0.5}, "
    "{name: format, weight: 0.2, params: {pattern: '^-?\\d+$'}}]",
]
STEPS = 40
WINDOW = 10  # steps per window mean; one step's reward is too noisy to compare (16 prompts)
TOLERANCE = 0.08  # largest allowed |window mean - golden window mean| of a reward
GRAD_NORM_RTOL = 0.5  # window means of the gradient norm within +-50% of golden: zeroed or rescaled advantages fail
MIN_GAIN = 0.05  # the mean reward of the second half must beat the first window's by this much: GRPO has to learn


def run_tiny_grpo(run_dir: Path) -> dict[str, list[float]]:
    """Per-step reward metrics of the golden run (MLflow metrics of the GRPO run)."""
    import mlflow

    from grpo_pipeline.configs.schema import load_config
    from grpo_pipeline.tasks.core.stage import RunContext
    from grpo_pipeline.tasks.data import prepare_data
    from grpo_pipeline.tasks.grpo import GRPORound, grpo_train
    from grpo_pipeline.tasks.model import prepare_base_model
    from grpo_pipeline.tasks.sft import sft_warmup

    cfg = load_config(None, [*OVERRIDES, f"run_dir={run_dir}"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same reduction order on every machine
    try:
        data = prepare_data(cfg.data, cfg.run_dir)
        base = prepare_base_model(cfg.model, cfg.run_dir, cfg.seed)
        ctx = RunContext(run_dir=cfg.run_dir, experiment="golden", recipe="golden", seed=cfg.seed)
        sft = sft_warmup(base, data.train, cfg.sft, cfg.model, ctx)
        policy = grpo_train(
            GRPORound(start=sft, train=data.train, cfg=cfg.grpo, model_cfg=cfg.model, round_index=1, ctx=ctx)
        )
    finally:
        torch.set_num_threads(threads)
    client = mlflow.MlflowClient()
    keys = ["reward", "rewards/correctness/mean", "rewards/digit_match/mean", "rewards/format/mean", "grad_norm"]
    return {
        k: [m.value for m in sorted(client.get_metric_history(policy.run_id, k), key=lambda m: m.step)] for k in keys
    }


def window_means(values: list[float], window: int = WINDOW) -> list[float]:
    return [sum(values[i : i + window]) / len(values[i : i + window]) for i in range(0, len(values), window)]


@pytest.mark.integration
def test_grpo_reward_trajectory_matches_golden(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("DISABLE_MLFLOW_INTEGRATION", "FALSE")
    history = run_tiny_grpo(tmp_path)
    reward = history["reward"]
    assert len(reward) == STEPS, f"expected one logged reward per GRPO step, got {len(reward)}"

    if os.environ.get("GOLDEN_UPDATE"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(
            json.dumps(
                {"overrides": OVERRIDES, **{k: [round(v, 4) for v in vals] for k, vals in history.items()}}, indent=1
            )
        )
        pytest.skip(f"wrote {GOLDEN}")

    golden = json.loads(GOLDEN.read_text())
    assert golden["overrides"] == OVERRIDES, "the golden run's settings changed; regenerate with GOLDEN_UPDATE=1"
    got, want = window_means(reward), window_means(golden["reward"])
    off = [
        (i * WINDOW, round(g, 3), round(w, 3))
        for i, (g, w) in enumerate(zip(got, want, strict=True))
        if abs(g - w) > TOLERANCE
    ]
    assert not off, f"reward trajectory left the golden band (start step, got, golden): {off}; got {got}, golden {want}"
    # Each reward's own mean, so a reward that is silently dropped or mis-weighted is named.
    for key in ("rewards/correctness/mean", "rewards/digit_match/mean", "rewards/format/mean"):
        g, w = window_means(history[key]), window_means(golden[key])
        assert max(abs(a - b) for a, b in zip(g, w, strict=True)) <= TOLERANCE, f"{key}: got {g}, golden {w}"
    g, w = window_means(history["grad_norm"]), window_means(golden["grad_norm"])
    assert all(abs(a - b) <= GRAD_NORM_RTOL * b for a, b in zip(g, w, strict=True)), f"grad_norm: got {g}, golden {w}"
    second_half = sum(reward[STEPS // 2 :]) / (STEPS - STEPS // 2)
    assert second_half - got[0] >= MIN_GAIN, f"GRPO did not raise the reward: window means {got}"
