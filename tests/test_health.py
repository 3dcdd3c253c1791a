"""Training-health alarms (tasks/training/health.py): the detection logic on synthetic metrics and on the readings
of a real default-recipe run, then each alarm provoked for real on the tiny model through the GRPO stage
(`grpo_train`, in-process), and the registry's health rule (an unhealthy round is challenger only)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import mlflow
import pytest

from grpo_pipeline.configs.schema import ConfigError, MonitorsConfig, RegistryConfig, RewardSpec, load_config
from grpo_pipeline.tasks.core.common import Checkpoint, Ref
from grpo_pipeline.tasks.core.stage import RunContext
from grpo_pipeline.tasks.release.gate import GateDecision, health_rule
from grpo_pipeline.tasks.training.monitor import (
    HealthMonitor,
    StepRewards,
    TrainingHealthError,
    alarm_kinds,
    health_tags,
    weighted_totals,
)

# Every alarm off; a test turns on the one it is about, so it can assert that exactly that one fires.
QUIET = {
    "zero_spread_max": 1.0,
    "kl_max": 1e9,
    "entropy_min_ratio": 0.0,
    "length_min_ratio": 0.0,
    "length_max_ratio": 1e9,
    "clip_ratio_max": 1.0,
    "stagnation_steps": 0,
}


def quiet(**on: object) -> MonitorsConfig:
    return MonitorsConfig(**{**QUIET, **on})


def logs(entropy: float = 1.0, length: float = 4.0, clip: float = 0.0, kl: float | None = None, **more: float):
    return {
        "loss": 0.01,
        "grad_norm": 1.0,
        "entropy": entropy,
        "completions/mean_length": length,
        "clip_ratio/region_mean": clip,
        **({"kl": kl} if kl is not None else {}),
        **more,
    }


def rewards(mean: float, groups: int = 8, zero: int = 2) -> StepRewards:
    return StepRewards(groups=groups, zero_spread=zero, zero_spread_reward=mean if zero else None, mean=mean, scored=64)


def feed(monitor: HealthMonitor, steps: range, **readings: object) -> list[str]:
    """Feed the same readings at every step; return the kinds of the alarms, in the order they fired."""
    fired = []
    for step in steps:
        monitor.record_rewards(step, readings.get("step_rewards", rewards(0.5)))  # type: ignore[arg-type]
        monitor.record_logs(step, readings.get("step_logs", logs()))  # type: ignore[arg-type]
        fired += [a.kind for a in monitor.check(step)]
    return fired


# ----------------------------------------------------------------------------- rewards -> readings


def test_weighted_totals_sum_like_trl():
    # two reward functions x three completions; None beside a score counts 0, all None is unscored (NaN)
    totals = weighted_totals([[1.0, None, None], [1.0, 1.0, None]], [1.0, 0.2])
    assert totals[:2] == [pytest.approx(1.2), pytest.approx(0.2)] and math.isnan(totals[2])


def test_zero_spread_is_read_from_the_rewards_not_from_their_float32_std():
    import torch

    # 1.0 x weight 0.3 for all 8 completions: TRL's float32 std is ~3e-8, so its isclose(std, 0) misses the group
    same = (torch.ones(8) * torch.tensor(0.3)).tolist()
    assert torch.std(torch.tensor(same)).item() > 1e-8
    varied = [0.0, 1.2, 1.2, 0.2, 1.2, 1.2, 1.2, 1.2]
    half_scored = [1.0] + [math.nan] * 7  # one scored completion: no advantage either
    step = StepRewards.of(same + varied + half_scored, group_size=8)
    assert (step.groups, step.zero_spread) == (3, 2)
    assert step.zero_spread_reward == pytest.approx((0.3 + 1.0) / 2)
    assert step.mean == pytest.approx((sum(same) + sum(varied) + 1.0) / 17) and step.scored == 17
    with pytest.raises(ValueError, match="groups of 8"):
        StepRewards.of([1.0] * 12, group_size=8)


def test_solved_groups_are_told_apart_from_unsolved_ones():
    right, wrong = [1.0] * 4, [0.0] * 4
    partly = [1.0, 0.0, 1.0, 1.0]
    one_unscored = [1.0, 1.0, 1.0, math.nan]
    totals = right + wrong + partly + one_unscored
    correct = [t == 1.0 for t in totals]
    step = StepRewards.of(totals, group_size=4, correct=correct)
    assert (step.groups, step.zero_spread, step.solved, step.no_signal) == (4, 3, 1, 2)
    assert step.zero_spread_reward == pytest.approx((0.0 + 1.0) / 2)  # the unsolved zero-spread groups' mean
    assert StepRewards.of(totals, group_size=4).solved == 0  # without a correctness reading nothing is solved
    with pytest.raises(ValueError, match="correctness readings"):
        StepRewards.of(totals, group_size=4, correct=correct[:-1])


def solved_step(solved: int, groups: int = 100, spread: int = 0) -> StepRewards:
    """`groups` groups: `solved` all right, `spread` with reward spread, the rest all wrong."""
    wrong = groups - solved - spread
    return StepRewards(groups, solved + wrong, 0.0 if wrong else None, solved / groups, 8 * groups, solved=solved)


def test_a_converged_round_is_saturated_not_alarmed_and_an_all_wrong_one_is_alarmed():
    # 99% sampled accuracy with 8 generations: 0.99**8 = 92% of the groups are all right
    converged = HealthMonitor(quiet(window_steps=4, zero_spread_max=0.9, saturated_min=0.9))
    assert feed(converged, range(1, 13), step_rewards=solved_step(92, spread=8)) == []
    assert converged.saturation is not None and converged.saturation.step == 4
    assert str(converged.saturation).startswith("saturated at step 4: 92% of the prompt groups over steps 1-4")

    hopeless = HealthMonitor(quiet(window_steps=4, zero_spread_max=0.9, saturated_min=0.9))
    assert feed(hopeless, range(1, 13), step_rewards=solved_step(0, spread=5)) == ["zero_spread"]
    assert hopeless.saturation is None


def test_a_round_whose_episodes_keep_calling_at_the_turn_limit_is_alarmed():
    monitor = HealthMonitor(quiet(window_steps=4, turn_limit_max=0.9))
    for step in range(1, 9):  # 1 in 8 episodes past the limit: a policy that sometimes calls once too often
        monitor.record_turn_limits(step, hits=1, episodes=8)
    assert [a.kind for a in monitor.check(8)] == []
    for step in range(9, 13):  # then all but 0.5 in 8 of them
        monitor.record_turn_limits(step, hits=15, episodes=16)
    (alarm,) = monitor.check(12)
    assert alarm.kind == "turn_limit" and "94% of the episodes over steps 9-12" in alarm.message
    assert "grpo.max_tool_turns" in alarm.message and "monitors.turn_limit_max=0.9" in alarm.message


def test_the_round_reads_turn_limit_hits_from_either_tool_loop():
    from grpo_pipeline.tasks.training.health import RoundHealth

    def reward(completions, **kwargs):
        return [1.0] * len(completions)

    health = RoundHealth(quiet(window_steps=1, turn_limit_max=0.5), "r1", 0.0, 2, [1.0], max_tool_turns=1)
    (wrapped,) = health.wrap_rewards([reward])
    wrapped(completions=["a", "b"], tool_turn_limit=[True, False])  # the text loop's column
    assert health._take_turn_limits() == (1, 2) and health._take_turn_limits() is None
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}
    still_calling = [call, {"role": "tool", "name": "f", "content": "1"}, call]
    wrapped(completions=[still_calling, still_calling])  # TRL's loop: message lists
    health.step_end(1, None)
    assert health.monitor.series["turn_limit"].values == [1.0] and alarm_kinds(health.alarms) == ["turn_limit"]
    without_tools = RoundHealth(quiet(), "r1", 0.0, 2, [1.0])
    without_tools.wrap_rewards([reward])[0](completions=[still_calling, still_calling])
    assert without_tools._take_turn_limits() is None


# ----------------------------------------------------------------------------- detection on synthetic sequences


def test_a_steady_round_raises_nothing_and_each_alarm_fires_once():
    cfg = MonitorsConfig(window_steps=5, stagnation_steps=20)
    steady = HealthMonitor(cfg)
    rising = [rewards(0.5 + 0.01 * s) for s in range(60)]
    fired = []
    for step in range(1, 60):
        steady.record_rewards(step, rising[step])
        steady.record_logs(step, logs(entropy=1.0 - 0.005 * step, length=4 + 0.01 * step))
        fired += steady.check(step)
    assert fired == []

    collapsing = HealthMonitor(quiet(window_steps=5, entropy_min_ratio=0.1))
    kinds = feed(collapsing, range(1, 11), step_logs=logs(entropy=1.0))
    kinds += feed(collapsing, range(11, 40), step_logs=logs(entropy=0.01))
    assert kinds == ["entropy_collapse"]  # once, although it stays true


@pytest.mark.parametrize(
    ("kind", "cfg", "beta", "before", "after"),
    [
        ("entropy_collapse", {"entropy_min_ratio": 0.1}, 0.0, {"step_logs": logs(entropy=2.0)},
         {"step_logs": logs(entropy=0.1)}),
        ("length_collapse", {"length_min_ratio": 0.5}, 0.0, {"step_logs": logs(length=8.0)},
         {"step_logs": logs(length=3.0)}),
        ("length_blowup", {"length_max_ratio": 2.0}, 0.0, {"step_logs": logs(length=3.0)},
         {"step_logs": logs(length=7.0)}),
        ("kl", {"kl_max": 0.5}, 0.04, {"step_logs": logs(kl=0.01)}, {"step_logs": logs(kl=2.0)}),
        ("clip_ratio", {"clip_ratio_max": 0.2}, 0.0, {"step_logs": logs(clip=0.0)}, {"step_logs": logs(clip=0.6)}),
        ("zero_spread", {"zero_spread_max": 0.9}, 0.0, {"step_rewards": rewards(0.5, zero=2)},
         {"step_rewards": rewards(0.0, zero=8)}),
    ],
)  # fmt: skip
def test_each_alarm_fires_on_its_sequence_only(kind, cfg, beta, before, after):
    monitor = HealthMonitor(quiet(window_steps=4, **cfg), beta=beta)
    assert feed(monitor, range(1, 13), **before) == []
    assert feed(monitor, range(13, 25), **after) == [kind]


def test_kl_is_watched_only_with_a_reference_model():
    monitor = HealthMonitor(quiet(window_steps=4, kl_max=0.5), beta=0.0)
    assert feed(monitor, range(1, 20), step_logs=logs(kl=5.0)) == []


def test_ratios_wait_for_a_start_window_that_the_now_window_no_longer_overlaps():
    monitor = HealthMonitor(quiet(window_steps=10, entropy_min_ratio=0.5))
    kinds = feed(monitor, range(1, 11), step_logs=logs(entropy=1.0))
    kinds += feed(monitor, range(11, 20), step_logs=logs(entropy=0.1))
    assert kinds == []  # steps 10-19 still overlap the start window (1-10)
    assert feed(monitor, range(20, 21), step_logs=logs(entropy=0.1)) == ["entropy_collapse"]


def test_readings_logged_less_often_than_the_window():
    """TRL logs every grpo.log_every_steps steps, each value a mean over them: a window then holds one reading."""
    monitor = HealthMonitor(quiet(window_steps=5, length_min_ratio=0.5))
    fired = []
    for step, length in ((20, 4.0), (40, 4.0), (60, 1.5)):
        monitor.record_logs(step, logs(length=length))
        fired += [a.kind for a in monitor.check(step)]
    assert fired == ["length_collapse"]


def test_reward_stagnation_compares_the_best_window_with_the_start():
    cfg = quiet(window_steps=5, stagnation_steps=20)
    flat = HealthMonitor(cfg)
    assert feed(flat, range(1, 20), step_rewards=rewards(0.5)) == []  # not before stagnation_steps
    assert feed(flat, range(20, 21), step_rewards=rewards(0.5)) == ["reward_stagnation"]

    noisy_but_rising = HealthMonitor(cfg)
    values = [0.5, 0.45, 0.55, 0.5, 0.52, 0.48, 0.6, 0.5, 0.55, 0.62] * 4
    fired = []
    for step, value in enumerate(values, 1):
        noisy_but_rising.record_rewards(step, rewards(value))
        fired += noisy_but_rising.check(step)
    assert fired == []

    gain_needed = HealthMonitor(quiet(window_steps=5, stagnation_steps=20, stagnation_min_gain=0.5))
    fired = []
    for step, value in enumerate(values, 1):
        gain_needed.record_rewards(step, rewards(value))
        fired += [a.kind for a in gain_needed.check(step)]
    assert fired == ["reward_stagnation"]


def test_a_nonfinite_logged_loss_is_an_alarm_at_once():
    monitor = HealthMonitor(quiet(window_steps=20))
    feed(monitor, range(1, 3))
    monitor.record_logs(3, logs(loss=float("nan")))
    [alarm] = monitor.check(3)
    assert alarm.kind == "nonfinite_loss" and "loss is nan" in alarm.message and not alarm.fatal


def test_a_resumed_round_measures_from_where_it_resumed():
    monitor = HealthMonitor(quiet(window_steps=5, length_max_ratio=2.0), first_step=100)
    kinds = feed(monitor, range(101, 106), step_logs=logs(length=3.0))
    kinds += feed(monitor, range(106, 112), step_logs=logs(length=7.0))
    assert kinds == ["length_blowup"]


def test_stagnation_window_must_exceed_the_start_window():
    with pytest.raises(ConfigError, match=r"stagnation_steps \(40\) must exceed window_steps"):
        load_config(None, ["monitors.window_steps=50", "monitors.stagnation_steps=40"])
    assert load_config(None, ["monitors.window_steps=50", "monitors.stagnation_steps=0"]).monitors.window_steps == 50


def test_monitor_settings_key_the_round_and_allow_unhealthy_keys_registration():
    """A round's alarms are part of its result, so its thresholds are part of its key (docs/pipeline.md's rerun
    table)."""
    from grpo_pipeline.tasks.grpo import GRPORound, grpo_train
    from grpo_pipeline.tasks.register import register_policy

    cfg = load_config(None, [])
    ctx = RunContext.of(cfg)
    start, train = Checkpoint(path="sft", fingerprint="sft"), Ref(path="train", fingerprint="train")

    def key(fn, /, *args, **kwargs) -> str:
        params = fn.__signature__.bind(*args, **kwargs)
        params.apply_defaults()
        return fn.stage.key(params.arguments)

    def round_key(monitors: MonitorsConfig) -> str:
        return key(
            grpo_train,
            GRPORound(
                start=start, train=train, cfg=cfg.grpo, model_cfg=cfg.model, round_index=1, ctx=ctx, monitors=monitors
            ),
        )

    assert round_key(cfg.monitors) == round_key(MonitorsConfig())
    assert round_key(cfg.monitors) != round_key(MonitorsConfig(kl_max=0.5))
    policy = Checkpoint(path="r1", fingerprint="r1", run_id="run")
    assert key(register_policy, policy, None, None, cfg.registry, ctx, "", {}) != key(
        register_policy, policy, None, None, RegistryConfig(allow_unhealthy=True), ctx, "", {}
    )


# ----------------------------------------------------------------------------- the default recipe stays silent

# A real run of configs/tiny-arith.yaml (both rounds, 250 steps each) with the monitor, read back from its MLflow run:
# entropy, completions/mean_length and reward as TRL logged them every 20 steps (an earlier run without the monitor
# logged the same values: the run is deterministic), and the monitor's health/zero_spread_frac. TRL's own
# frac_reward_zero_std read 0.0 at every one of these steps. clip_ratio/region_mean was 0 throughout (on-policy
# updates never clip). The run raised no alarm.
DEFAULT_RUN = {
    "r1": {
        "entropy": [0.177, 0.187, 0.178, 0.162, 0.159, 0.162, 0.15, 0.134, 0.128, 0.135, 0.117, 0.12, 0.104],
        "length": [3.619, 3.545, 3.622, 3.591, 3.509, 3.604, 3.616, 3.652, 3.621, 3.581, 3.644, 3.584, 3.672],
        "reward": [0.942, 0.943, 1.012, 1.014, 1.006, 1.017, 1.028, 1.024, 1.077, 1.062, 1.065, 1.06, 1.09],
        "zero_spread": [0.356, 0.263, 0.35, 0.369, 0.419, 0.419, 0.45, 0.444, 0.512, 0.5, 0.55, 0.506, 0.588],
    },
    "r2": {
        "entropy": [0.117, 0.11, 0.112, 0.098, 0.089, 0.095, 0.091, 0.08, 0.081, 0.076, 0.08, 0.085, 0.081],
        "length": [3.546, 3.576, 3.601, 3.545, 3.595, 3.639, 3.591, 3.563, 3.608, 3.578, 3.564, 3.548, 3.58],
        "reward": [1.073, 1.073, 1.06, 1.086, 1.117, 1.099, 1.117, 1.131, 1.141, 1.131, 1.129, 1.093, 1.104],
        "zero_spread": [0.556, 0.588, 0.55, 0.706, 0.669, 0.613, 0.631, 0.762, 0.706, 0.719, 0.688, 0.669, 0.6],
    },
}  # fmt: skip
DEFAULT_STEPS = [20, 40, 60, 80, 100, 120, 140, 160, 180, 200, 220, 240, 250]


def replay_default_round(readings: dict[str, list[float]], cfg: MonitorsConfig) -> list[str]:
    monitor = HealthMonitor(cfg)
    fired, last = [], 0
    for i, step in enumerate(DEFAULT_STEPS):
        groups = 8 * (step - last)  # 8 prompts per step
        zero = round(readings["zero_spread"][i] * groups)
        mean = readings["reward"][i]
        monitor.record_rewards(step, StepRewards(groups, zero, mean, mean, 8 * groups))
        monitor.record_logs(step, logs(entropy=readings["entropy"][i], length=readings["length"][i]))
        fired += [str(a) for a in monitor.check(step)]
        last = step
    return fired


@pytest.mark.parametrize("round_name", ["r1", "r2"])
def test_default_thresholds_are_silent_on_the_default_recipe(round_name):
    cfg = load_config(Path(__file__).parents[1] / "configs" / "tiny-arith.yaml").monitors
    assert replay_default_round(DEFAULT_RUN[round_name], cfg) == []
    # ... and the replay can fail: the same round with its entropy collapsing after step 100 raises the alarm
    collapsed = dict(DEFAULT_RUN[round_name])
    collapsed["entropy"] = [
        e if s <= 100 else e * 0.05 for e, s in zip(collapsed["entropy"], DEFAULT_STEPS, strict=True)
    ]
    assert alarm_kinds(replay_default_round(collapsed, cfg)) == ["entropy_collapse"]


# ----------------------------------------------------------------------------- the gate's health rule


def test_gate_keeps_an_unhealthy_round_challenger_unless_allowed():
    promoted = GateDecision(metric="accuracy", promote=True, reason="first version", challenger=0.9, n=40, min_delta=0)
    alarms = ["entropy_collapse at step 40: ...", "kl at step 60: ..."]
    assert health_rule(promoted, [], RegistryConfig()) == promoted

    held = health_rule(promoted, alarms, RegistryConfig())
    assert (held.promote, held.held_back, held.decision) == (False, True, "unhealthy")
    assert "2 training-health alarm(s) (entropy_collapse, kl)" in held.reason
    assert "registry.allow_unhealthy" in held.reason and "challenger only" in held.explain()
    assert GateDecision.from_tags(held.tags()) == held  # what a registered version's tags give back

    allowed = health_rule(promoted, alarms, RegistryConfig(allow_unhealthy=True))
    assert (allowed.promote, allowed.held_back, allowed.decision) == (True, False, "first")
    assert "allow_unhealthy lets it take champion" in allowed.reason

    kept = health_rule(promoted.model_copy(update={"promote": False}), alarms, RegistryConfig())
    assert (kept.promote, kept.held_back) == (False, False)  # the comparison alone already kept the champion
    assert health_tags(alarms) == {"training_health": "unhealthy: entropy_collapse, kl"}
    assert health_tags([]) == {"training_health": "healthy"}


def test_run_summary_lists_each_rounds_alarms_or_says_all_were_healthy():
    from grpo_pipeline.flows.summary import Summary
    from grpo_pipeline.flows.summary_tables import as_markdown, health_lines

    def summary(health: list[list[str]]) -> Summary:
        return Summary(recipe="r", config_hash="c", stages=[], scores=[], registrations=[], eval_settings={},
                       health=health)  # fmt: skip

    assert "Training health: all 2 GRPO round(s) healthy, no alarm" in as_markdown(summary([[], []]))
    alarm = "kl at step 60: mean per-token KL to the reference over steps 41-60 is 3.1, above monitors.kl_max=1.0"
    lines = health_lines(summary([[], [alarm]]).health)
    assert lines[2:] == ["- round 1: healthy", "- round 2: 1 alarm(s)", f"  - {alarm}"]
    assert "Training health" not in as_markdown(summary([]))  # no GRPO round ran


# ----------------------------------------------------------------------------- each alarm, provoked for real

# Rewards written as a user's module (a dotted path), so a test can make the reward signal whatever it needs.
REWARDS = """
def constant(completions, **kwargs):
    return [1.0 for _ in completions]


def longer(completions, **kwargs):
    return [float(len(c)) for c in completions]


def shorter(completions, **kwargs):
    return [-float(len(c)) for c in completions]
"""
TINY = [
    "seed=0",
    "data.synthetic.max_digits=1",
    "data.num_train=62",
    "data.num_eval=8",
    "data.num_probe=0",
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=2",
    "model.tiny.num_heads=2",
    "model.tiny.intermediate_size=64",
    "model.tiny.max_positions=32",
    "sft.max_steps=20",
    "sft.learning_rate=1e-2",
    "sft.batch_size=16",
    "sft.save_every_steps=0",
    "grpo.prompts_per_step=4",
    "grpo.generations_per_prompt=4",
    "grpo.max_completion_tokens=4",
    "grpo.log_every_steps=1",
    "grpo.probe_problems=0",
    "grpo.save_every_steps=0",
]


@dataclass
class Tiny:
    run_dir: Path
    train: Ref
    base: Checkpoint  # untrained: long, random completions (entropy ~4.6 nats)
    sft: Checkpoint  # 20 SFT steps: short answers (~4 tokens with EOS)
    ctx: RunContext


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny model before and after a short SFT warmup, its data, and a reward module on the import path; MLflow
    and the stages write under one temporary run directory."""
    from grpo_pipeline.tasks.data import prepare_data
    from grpo_pipeline.tasks.model import prepare_base_model
    from grpo_pipeline.tasks.sft import sft_warmup

    run_dir = tmp_path_factory.mktemp("health")
    (run_dir / "health_rewards.py").write_text(REWARDS)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.setenv("DISABLE_MLFLOW_INTEGRATION", "FALSE")
        mp.syspath_prepend(str(run_dir))
        cfg = load_config(None, [*TINY, f"run_dir={run_dir}"])
        ctx = RunContext(run_dir=str(run_dir), experiment="health", recipe="health", seed=0)
        data = prepare_data(cfg.data, cfg.run_dir)
        base = prepare_base_model(cfg.model, cfg.run_dir, cfg.seed)
        sft = sft_warmup(base, data.train, cfg.sft, cfg.model, ctx)
        yield Tiny(run_dir, data.train, base, sft, ctx)


def train_round(
    tiny: Tiny, start: Checkpoint, overrides: list[str], monitors: MonitorsConfig, correctness: str = "correctness"
) -> Checkpoint:
    from grpo_pipeline.tasks.grpo import GRPORound, grpo_train

    cfg = load_config(None, [*TINY, f"run_dir={tiny.run_dir}", *overrides])
    spec = GRPORound(
        start=start, train=tiny.train, cfg=cfg.grpo, model_cfg=cfg.model, round_index=1, ctx=tiny.ctx,
        correctness_reward=RewardSpec(name=correctness), monitors=monitors,
    )  # fmt: skip
    return grpo_train(spec)


def run_of(policy: Checkpoint) -> mlflow.entities.Run:
    return mlflow.MlflowClient().get_run(policy.run_id)


def last_run() -> mlflow.entities.Run:
    [run] = mlflow.search_runs(experiment_names=["health"], order_by=["start_time DESC"], max_results=1,
                               output_format="list")  # fmt: skip
    return run


@pytest.mark.integration
def test_a_constant_reward_raises_zero_spread_and_stagnation(tiny):
    """Every completion gets 1.0 x weight 0.3: no group has any spread (TRL's own frac_reward_zero_std misses such
    groups, see above), and the reward never rises. The alarms reach the checkpoint, meta.json and MLflow."""
    policy = train_round(
        tiny,
        tiny.base,
        ["grpo.steps_per_round=6", "grpo.generations_per_prompt=8", "grpo.prompts_per_step=2",
         "grpo.rewards=[{name: 'health_rewards:constant', weight: 0.3}]"],
        quiet(window_steps=2, zero_spread_max=0.9, stagnation_steps=4),
    )  # fmt: skip
    assert alarm_kinds(policy.alarms) == ["zero_spread", "reward_stagnation"]
    assert policy.alarms[0].startswith("zero_spread at step 2: 100% of the prompt groups")
    assert json.loads((Path(policy.path) / "meta.json").read_text())["alarms"] == list(policy.alarms)
    run = run_of(policy)
    assert run.data.tags["health.status"] == "unhealthy"
    assert run.data.tags["health.alarm.zero_spread"] == policy.alarms[0]
    assert run.data.metrics["health/alarm/reward_stagnation"] == 1.0
    history = mlflow.MlflowClient().get_metric_history(policy.run_id, "health/zero_spread_frac")
    assert sorted(m.step for m in history) == [1, 2, 3, 4, 5, 6] and {m.value for m in history} == {1.0}


@pytest.mark.integration
def test_a_saturated_round_is_noted_ends_early_and_is_not_held_back(tiny):
    """The same constant reward, now the correctness reward: every group is solved. No alarm, a saturation note in
    the checkpoint, meta.json and MLflow, and with stop_when_saturated the round ends at the first full window."""
    policy = train_round(
        tiny,
        tiny.base,
        ["grpo.steps_per_round=8", "grpo.generations_per_prompt=4", "grpo.prompts_per_step=2",
         "grpo.rewards=[{name: 'health_rewards:constant', weight: 0.3}]"],
        quiet(window_steps=2, zero_spread_max=0.9, stagnation_steps=4, saturated_min=0.9, stop_when_saturated=True),
        correctness="health_rewards:constant",
    )  # fmt: skip
    assert policy.alarms == ()  # neither zero_spread nor stagnation: a solved prompt is no failure to learn
    [note] = policy.notes
    assert note.startswith("saturated at step 2: 100% of the prompt groups over steps 1-2 were solved")
    assert json.loads((Path(policy.path) / "meta.json").read_text())["notes"] == [note]
    run = run_of(policy)
    assert run.data.tags["health.status"] == "healthy" and run.data.tags["health.saturated"] == note
    steps = [m.step for m in mlflow.MlflowClient().get_metric_history(policy.run_id, "health/solved_frac")]
    assert max(steps) == 2  # ended at saturation, 6 steps short of the round
    gate = GateDecision(metric="accuracy", promote=True, reason="first version", challenger=1.0, n=8, min_delta=0)
    assert health_rule(gate, policy.alarms, RegistryConfig()).promote


@pytest.mark.integration
def test_fail_fast_stops_the_round_at_its_first_alarm(tiny):
    with pytest.raises(TrainingHealthError, match=r"stopped at step 2 .*monitors.fail_fast.*zero_spread"):
        train_round(
            tiny,
            tiny.base,
            ["grpo.steps_per_round=8", "grpo.rewards=[{name: 'health_rewards:constant'}]"],
            quiet(window_steps=2, zero_spread_max=0.9, fail_fast=True),
        )
    run = last_run()
    assert run.info.status == "FAILED" and run.data.tags["health.status"] == "unhealthy"
    steps = [m.step for m in mlflow.MlflowClient().get_metric_history(run.info.run_id, "reward")]
    assert max(steps) <= 2  # stopped where the alarm fired (before logging that step), 6 steps short of the round


@pytest.mark.integration
def test_a_reward_for_short_answers_at_a_huge_learning_rate_collapses_entropy_and_length(tiny):
    policy = train_round(
        tiny,
        tiny.base,  # starts at the length limit with near-uniform tokens
        ["grpo.steps_per_round=12", "grpo.learning_rate=0.05", "grpo.rewards=[{name: 'health_rewards:shorter'}]"],
        quiet(window_steps=1, entropy_min_ratio=0.1, length_min_ratio=0.5),
    )
    assert sorted(alarm_kinds(policy.alarms)) == ["entropy_collapse", "length_collapse"]
    assert run_of(policy).data.tags["health.status"] == "unhealthy"


@pytest.mark.integration
def test_a_reward_for_long_answers_blows_up_the_length(tiny):
    policy = train_round(
        tiny,
        tiny.sft,  # short answers to start from
        ["grpo.steps_per_round=4", "grpo.learning_rate=0.02", "grpo.max_completion_tokens=12",
         "grpo.rewards=[{name: 'health_rewards:longer'}]"],
        quiet(window_steps=1, length_max_ratio=2.0),
    )  # fmt: skip
    assert alarm_kinds(policy.alarms) == ["length_blowup"]


@pytest.mark.integration
def test_kl_to_the_reference_with_beta_and_a_high_learning_rate(tiny):
    policy = train_round(
        tiny,
        tiny.sft,
        ["grpo.steps_per_round=5", "grpo.beta=0.1", "grpo.learning_rate=0.05", "grpo.max_completion_tokens=12",
         "grpo.rewards=[{name: 'health_rewards:longer'}]"],
        quiet(window_steps=2, kl_max=1.0),
    )  # fmt: skip
    assert alarm_kinds(policy.alarms) == ["kl"]
    assert run_of(policy).data.metrics["kl"] > 0  # TRL logs it only with a reference model


@pytest.mark.integration
def test_a_tiny_epsilon_clips_the_second_pass_over_a_batch(tiny):
    """On-policy updates never clip (the ratio is exactly 1); a second pass over the same batch
    (grpo.num_iterations, GRPO's mu) with epsilon 0.001 clips most tokens whose advantage is not zero."""
    policy = train_round(
        tiny,
        tiny.base,
        ["grpo.steps_per_round=4", "grpo.learning_rate=0.01", "grpo.epsilon=0.001", "grpo.num_iterations=2",
         "grpo.rewards=[{name: 'health_rewards:shorter'}]"],
        quiet(window_steps=2, clip_ratio_max=0.2),
    )  # fmt: skip
    assert alarm_kinds(policy.alarms) == ["clip_ratio"]


@pytest.mark.integration
def test_nonfinite_weights_stop_the_round_without_fail_fast(tiny):
    with pytest.raises(TrainingHealthError, match=r"nonfinite_loss at step 1: the weights are not finite"):
        train_round(tiny, tiny.base, ["grpo.steps_per_round=4", "grpo.learning_rate=1e38"], quiet(window_steps=2))
    assert last_run().data.tags["health.alarm.nonfinite_loss"].startswith("nonfinite_loss at step 1")


# ----------------------------------------------------------------------------- registration of an unhealthy round


def test_an_unhealthy_round_is_registered_as_challenger_and_as_champion_when_allowed(tmp_path, monkeypatch):
    """Real tiny checkpoints registered in a SQLite store (as in tests/test_register.py): the unhealthy round would
    be the first version, hence champion, but stays challenger; with registry.allow_unhealthy it takes champion."""
    from grpo_pipeline.tasks.register import register_policy
    from tests.test_register import eval_set, policy, scored

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    ctx = RunContext(run_dir=str(tmp_path), experiment="test", recipe="test", seed=0)
    held_out = eval_set(tmp_path, 40)
    alarms = ("entropy_collapse at step 40: mean token entropy over steps 21-40 is 0.01, 0.05x its start 0.2",)

    def register(name: str, seed: int, **registry: object):
        unhealthy = policy(tmp_path, name, seed).model_copy(update={"alarms": alarms})
        result = scored(tmp_path, held_out, [1] * 30 + [0] * 10, name)
        cfg = RegistryConfig(experiment="test", model_name="m", **registry)
        return register_policy(unhealthy, result, None, cfg, ctx, "name: test\n", {"round": "1"})

    held = register("a", 0)
    assert (held.version, held.alias, held.gate.decision) == ("1", "challenger", "unhealthy")
    assert "challenger only (registry.allow_unhealthy: true lets such a round take champion)" in held.gate.reason
    version = mlflow.MlflowClient().get_model_version("m", "1")
    assert list(version.aliases) == ["challenger"]
    assert version.tags["training_health"] == "unhealthy: entropy_collapse" and version.tags["gate.held_back"] == "True"
    assert "unhealthy" in version.description  # the model card's gate line

    allowed = register("b", 1, allow_unhealthy=True)
    assert (allowed.version, allowed.alias, allowed.gate.decision) == ("2", "champion", "first")
    assert "registry.allow_unhealthy lets it take champion" in allowed.gate.reason
