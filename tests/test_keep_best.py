"""The probe split choosing checkpoints: `grpo.keep: best_probe` (a round returns the step its held-out probe liked
best, not its last one) and `sft.stop_at_accuracy` (SFT ends at the first probe that reaches a bar).

A tiny model is first taught one-digit addition (SFT), then a GRPO round rewards short answers at a huge learning
rate, which destroys what SFT taught: the probe's accuracy falls. With best_probe the round must return an earlier
step, whose weights score what the probe measured at that step; with `last` it returns the destroyed policy.
"""

from __future__ import annotations

import itertools
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch

from grpo_pipeline.configs.sampling import Sampling
from grpo_pipeline.configs.schema import ConfigError, RewardSpec, load_config
from grpo_pipeline.tasks.core.common import Checkpoint, Ref
from grpo_pipeline.tasks.core.stage import RunContext
from grpo_pipeline.tasks.training.checkpoints import START_DIR
from grpo_pipeline.tasks.training.keep_rule import halves
from grpo_pipeline.tasks.training.probe import HeldOutAccuracyProbe, StartMissingError
from tests.decisions import Args, StepModel, fake_probe, probe_callback, run_probe

SHORTER = """
def shorter(completions, **kwargs):
    return [-float(len(c)) for c in completions]
"""
TINY = [
    "seed=0",
    "data.synthetic.max_digits=1",
    "data.num_train=54",
    "data.num_eval=8",
    "data.num_probe=8",
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=2",
    "model.tiny.num_heads=2",
    "model.tiny.intermediate_size=64",
    "model.tiny.max_positions=16",
    "sft.max_steps=60",
    "sft.learning_rate=1e-2",
    "sft.batch_size=64",
    "sft.save_every_steps=0",
    "grpo.steps_per_round=8",
    "grpo.prompts_per_step=4",
    "grpo.generations_per_prompt=4",
    "grpo.max_completion_tokens=4",
    "grpo.learning_rate=0.05",
    "grpo.log_every_steps=1",
    "grpo.save_every_steps=0",
    "grpo.probe_problems=8",
    "grpo.probe_every_steps=2",
    "grpo.rewards=[{name: 'keep_rewards:shorter'}]",
]


@dataclass
class Taught:
    run_dir: Path
    train: Ref
    probe: Ref
    sft: Checkpoint
    ctx: RunContext


@pytest.fixture(scope="module")
def taught(tmp_path_factory):
    from grpo_pipeline.tasks.data import prepare_data
    from grpo_pipeline.tasks.model import prepare_base_model
    from grpo_pipeline.tasks.sft import sft_warmup

    run_dir = tmp_path_factory.mktemp("keep")
    (run_dir / "keep_rewards.py").write_text(SHORTER)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.setenv("DISABLE_MLFLOW_INTEGRATION", "FALSE")
        mp.syspath_prepend(str(run_dir))
        cfg = load_config(None, [*TINY, f"run_dir={run_dir}"])
        ctx = RunContext(run_dir=str(run_dir), experiment="keep", recipe="keep", seed=0)
        data = prepare_data(cfg.data, cfg.run_dir)
        base = prepare_base_model(cfg.model, cfg.run_dir, cfg.seed)
        sft = sft_warmup(base, data.train, cfg.sft, cfg.model, ctx)
        yield Taught(run_dir, data.train, data.probe, sft, ctx)


def train_round(taught: Taught, *overrides: str) -> Checkpoint:
    from grpo_pipeline.tasks.grpo import GRPORound, grpo_train

    cfg = load_config(None, [*TINY, f"run_dir={taught.run_dir}", *overrides])
    spec = GRPORound(
        start=taught.sft, train=taught.train, cfg=cfg.grpo, model_cfg=cfg.model, round_index=1, ctx=taught.ctx,
        held_out=taught.probe,
    )  # fmt: skip
    return grpo_train(spec)


def probe_accuracy(policy: Checkpoint, probe: Ref) -> float:
    """The probe's measurement, taken afresh on the saved policy."""
    from transformers import AutoModelForCausalLM

    from grpo_pipeline.rewards import build_reward
    from grpo_pipeline.tasks.training.probe import greedy_accuracy
    from grpo_pipeline.tasks.training.trainer import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(policy.path)
    rows = pd.read_parquet(probe.require())
    return greedy_accuracy(model, load_tokenizer(policy.path), rows, build_reward("correctness"), 4)


def probe_history(policy: Checkpoint) -> dict[int, float]:
    history = mlflow.MlflowClient().get_metric_history(policy.run_id, "probe/greedy_accuracy")
    return {m.step: m.value for m in history}


@pytest.mark.integration
def test_best_probe_returns_the_earlier_step_when_the_last_is_worse(taught):
    policy = train_round(taught, "grpo.keep=best_probe")
    history = probe_history(policy)
    assert sorted(history) == [0, 2, 4, 6, 8]
    assert history[0] > 0 and history[8] < history[0]  # SFT taught something; the round destroyed it
    best = max(history.values())
    kept = max(step for step, acc in history.items() if acc == best)  # ties go to the later step
    [note] = policy.notes
    assert re.match(rf"kept step {kept} of 8 \(grpo.keep=best_probe\): probe accuracy {best:.3f}", note)
    assert kept < 8
    assert probe_accuracy(policy, taught.probe) == pytest.approx(best)  # the saved weights are that step's


@pytest.mark.integration
def test_last_returns_the_last_step(taught):
    policy = train_round(taught, "grpo.keep=last")
    history = probe_history(policy)
    assert policy.notes == ()
    assert probe_accuracy(policy, taught.probe) == pytest.approx(history[8]) and history[8] < history[0]


@pytest.mark.integration
def test_patience_ends_the_round_once_the_probe_stops_improving(taught):
    policy = train_round(taught, "grpo.keep=best_probe", "grpo.probe_patience=1", "grpo.steps_per_round=40")
    history = probe_history(policy)
    ended, kept = policy.notes
    last = max(history)
    assert last < 40 and ended == (
        f"ended at step {last} of 40: 1 probe(s) in a row did not beat the best (grpo.probe_patience=1)"
    )
    assert kept.startswith(f"kept step {max(s for s, a in history.items() if a == max(history.values()))} of {last}")


@pytest.mark.integration
def test_keep_over_start_returns_the_start_when_the_best_step_is_not_clearly_better(taught):
    """At a learning rate too small to change a greedy answer every probe ties with the start, so best_probe keeps
    the last step (ties go to the later one), whose weights have moved; with keep_over_start the round returns its
    start, the SFT policy's weights exactly, since the last step is not better: on the confirming half of the probe
    rows (the default rule) it gains nothing, and with keep_rule=ci its CI is not above zero."""
    from safetensors.torch import load_file

    def weights(policy: Checkpoint) -> dict[str, torch.Tensor]:
        return load_file(str(Path(policy.path) / "model.safetensors"))

    start = weights(taught.sft)
    tiny_steps = ("grpo.keep=best_probe", "grpo.learning_rate=1e-6")
    last = train_round(taught, *tiny_steps)
    assert len(set(probe_history(last).values())) == 1  # every probe ties
    assert last.notes[0].startswith("kept step 8 of 8") and any(
        not torch.equal(start[k], v) for k, v in weights(last).items()
    )
    kept = train_round(taught, *tiny_steps, "grpo.keep_over_start=true")
    [note] = kept.notes
    assert note.startswith(
        "kept the start (step 0) of 8 (grpo.keep_over_start): step 8 was the best on half of the probe rows, but on "
        "the 4 probe rows that did not choose it, it gained +0.0 points over the start"
    )
    assert all(torch.equal(start[k], v) for k, v in weights(kept).items())  # the start, unchanged
    by_ci = train_round(taught, *tiny_steps, "grpo.keep_over_start=true", "grpo.keep_rule=ci")
    [note] = by_ci.notes
    assert note.startswith("kept the start (step 0) of 8 (grpo.keep_over_start): the best step 8's probe gain +0.000")
    assert all(torch.equal(start[k], v) for k, v in weights(by_ci).items())


# ----------------------------------------------------------------------------- the keep rule, on chosen figures

ROWS = 128
CHOOSE, CONFIRM = halves(ROWS)


def results(choose: int | list[int], confirm: int | list[int]) -> list[float]:
    """Probe results with these rows right (positions in the choosing and the confirming half; a number n: the
    first n), every other row wrong."""
    items = np.zeros(ROWS)
    for half, right in ((CHOOSE, choose), (CONFIRM, confirm)):
        items[half[list(range(right)) if isinstance(right, int) else right]] = 1.0
    return [float(v) for v in items]


def kept_by(monkeypatch, by_step: dict[int, list[float]], steps: int = 5, **keep) -> tuple[int, str]:
    """(the kept step, as the restored weights say, and the note) of a round whose probe reads `by_step`."""
    fake_probe(monkeypatch, lambda step: by_step[step])
    probe = probe_callback(ROWS, keep_best=True, over_start=True, **keep)
    model = StepModel()
    run_probe(probe, model, steps)
    assert int(model.step.item()) == probe.kept_step
    return probe.kept_step, probe.notes[-1]


def test_confirm_keeps_a_gain_that_is_too_small_for_the_ci(monkeypatch):
    """+3.1 points on 128 rows (net +2 rows on each half, 10 rows changed): the confirming half sees it (4 wins, 2
    losses); the bootstrap CI on all 128 rows reaches below zero, so keep_rule=ci returns the start."""
    start = results(40, 40)
    step = results([*range(1, 40), 40, 41, 42], [*range(2, 40), 40, 41, 42, 43])
    by_step = {0: start, **{s: step for s in range(1, 6)}}
    kept, note = kept_by(monkeypatch, by_step)
    assert kept == 5  # ties on the choosing half go to the later step
    assert "it gained +3.1 points over the start (4 right where the start was wrong, 2 the reverse" in note
    kept, note = kept_by(monkeypatch, by_step, rule="ci")
    assert kept == 0 and "probe gain +0.031" in note and "is not above zero" in note


def test_confirm_judges_the_chosen_step_on_rows_that_did_not_choose_it(monkeypatch):
    """The winner's curse: step 2 is the best on the choosing half by luck and no better than the start elsewhere;
    on the confirming half it loses a row, so the start stays."""
    start = results(30, 31)
    by_step = {0: start, 1: results(31, 31), 2: results(36, 30), 3: results(32, 31)}
    kept, note = kept_by(monkeypatch, by_step, steps=3)
    assert kept == 0 and note.startswith("kept the start (step 0) of 3 (grpo.keep_over_start): step 2 was the best")
    assert "it gained -1.6 points over the start (0 right where the start was wrong, 1 the reverse" in note


def test_a_negative_margin_keeps_a_step_that_is_not_worse_beyond_it(monkeypatch):
    by_step = {0: results(30, 31), 1: results(36, 30)}  # one confirming row worse: -1.6 points
    assert kept_by(monkeypatch, by_step, steps=1)[0] == 0
    kept, note = kept_by(monkeypatch, by_step, steps=1, margin=-0.02)
    assert kept == 1 and "above grpo.keep_margin=-0.02" in note


def test_the_start_stays_when_no_step_scores_as_well_on_the_choosing_half(monkeypatch):
    by_step = {0: results(40, 10), 1: results(39, 60), 2: results(20, 64)}
    kept, note = kept_by(monkeypatch, by_step, steps=2)
    assert kept == 0 and note == (
        "kept the start (step 0) of 2 (grpo.keep_over_start): no later step scored as well as the start on the "
        "choosing half of the probe"
    )


# ----------------------------------------------------------------------------- a resumed round keeps its start


def test_a_resumed_round_compares_with_its_true_start(monkeypatch, tmp_path):
    """The start (step 0) is better than every later step. Interrupted at step 5 and resumed from the checkpoint of
    step 4, the round still returns the start's weights, read from that checkpoint, also on a disk that holds
    nothing but the checkpoint (a rerun on another machine, the checkpoint fetched from MLflow); before, the
    resumed attempt there took step 4 as its start and returned it as the unchanged start."""
    good, worse = results(50, 50), results(20, 20)
    fake_probe(monkeypatch, lambda step: good if step == 0 else worse)
    first_disk, other_disk = tmp_path / "node-a", tmp_path / "node-b"

    def attempt(disk: Path, first_step: int = 0, crash_at: int | None = None) -> tuple[HeldOutAccuracyProbe, StepModel]:
        probe, model = probe_callback(ROWS, keep_best=True, over_start=True), StepModel()
        args = Args(save_strategy="steps", output_dir=str(disk))
        run_probe(probe, model, 8, args, first_step=first_step, crash_at=crash_at, save_every=2)
        return probe, model

    uninterrupted, model = attempt(tmp_path / "whole")
    assert uninterrupted.kept_step == 0 and model.step.item() == 0 and uninterrupted.kept_start
    with pytest.raises(RuntimeError, match="injected fault at step 5"):
        attempt(first_disk, crash_at=5)
    assert (first_disk / "checkpoint-4" / START_DIR / "start.json").is_file()
    resumed, model = attempt(first_disk, first_step=4)
    assert resumed.kept_step == 0 and model.step.item() == 0  # the true start's weights
    assert resumed.notes == uninterrupted.notes

    other_disk.mkdir()
    shutil.copytree(first_disk / "checkpoint-4", other_disk / "checkpoint-4")  # only the checkpoint travels
    moved, model = attempt(other_disk, first_step=4)
    assert moved.kept_step == 0 and model.step.item() == 0 and moved.kept_start
    assert moved.notes == uninterrupted.notes
    assert (other_disk / "checkpoint-6" / START_DIR / "start.json").is_file()  # and goes on into the next ones


def test_a_round_resumed_from_a_checkpoint_without_its_start_fails_saying_so(monkeypatch, tmp_path):
    """A checkpoint that does not hold the round's start cannot be resumed from: the resume point is not the start,
    and a round that took it for one returned trained weights as its unchanged start (kept_start), so the pipeline
    skipped its evaluation and ended the rounds. Before, the resumed attempt did just that, with a note."""
    fake_probe(monkeypatch, lambda step: results(50, 50) if step == 0 else results(20, 20))
    args = Args(save_strategy="steps", output_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match="injected fault at step 5"):
        run_probe(probe_callback(ROWS, keep_best=True, over_start=True), StepModel(), 8, args, crash_at=5, save_every=2)
    shutil.rmtree(tmp_path / "checkpoint-4" / START_DIR)
    with pytest.raises(StartMissingError, match=r"resumed at step 4 from a checkpoint without the round's start"):
        run_probe(probe_callback(ROWS, keep_best=True, over_start=True), StepModel(), 8, args, first_step=4)


def test_a_step_replaces_the_start_only_when_clearly_better():
    from grpo_pipeline.tasks.training.probe import beats_start

    start = [0.0] * 40 + [1.0] * 10
    assert beats_start(start, [1.0] * 50)[0]  # 10 -> 50 of 50 right: clearly better
    better, (gain, low, high) = beats_start(start, [1.0] + [0.0] * 39 + [1.0] * 10)  # one more right: noise
    assert not better and gain == pytest.approx(1 / 50) and low <= 0 < high
    assert not beats_start(start, start)[0]  # no change is not an improvement
    assert not beats_start(start, [1.0] * 9 + [0.0] * 41)[0]
    assert not beats_start([None, 1.0], [1.0, None])[0]  # too few rows scored on both sides to say


def test_best_probe_needs_a_probe():
    with pytest.raises(ConfigError, match=r"grpo.keep is 'best_probe' but grpo.probe_problems is 0"):
        load_config(None, ["grpo.keep=best_probe", "grpo.probe_problems=0"])
    with pytest.raises(ConfigError, match=r"grpo.keep is 'best_probe' but data.num_probe is 0"):
        load_config(None, ["grpo.keep=best_probe", "data.num_probe=0"])
    with pytest.raises(ConfigError, match=r"probe_patience ends a round by the probe"):
        load_config(None, ["grpo.probe_patience=3"])
    with pytest.raises(ConfigError, match=r"keep_over_start compares the best-probed step with the start"):
        load_config(None, ["grpo.keep_over_start=true", "grpo.keep=last"])
    with pytest.raises(ConfigError, match=r"keep_margin is the gain the confirm rule asks"):
        load_config(
            None, ["grpo.keep=best_probe", "grpo.keep_over_start=true", "grpo.keep_rule=ci", "grpo.keep_margin=0.01"]
        )


@pytest.mark.integration
def test_sft_ends_at_the_first_probe_that_reaches_its_bar(taught):
    from grpo_pipeline.tasks.model import prepare_base_model
    from grpo_pipeline.tasks.sft import sft_warmup

    overrides = ["sft.max_steps=400", "sft.stop_at_accuracy=0.25", "sft.probe_every_steps=10", "sft.probe_problems=8"]
    cfg = load_config(None, [*TINY, f"run_dir={taught.run_dir}", *overrides])
    base = prepare_base_model(cfg.model, cfg.run_dir, cfg.seed)
    policy = sft_warmup(base, taught.train, cfg.sft, cfg.model, taught.ctx, probe=taught.probe,
                         probe_sampling=Sampling(temperature=None, max_new_tokens=4))  # fmt: skip
    history = probe_history(policy)
    ended = max(history)
    assert ended < 400 and history[ended] >= 0.25  # stopped at the bar, far short of the cap
    assert all(acc < 0.25 for step, acc in history.items() if step < ended)  # and not before it
    note = f"ended at step {ended} of 400: the probe's greedy accuracy {history[ended]:.3f} reached 0.25"
    assert policy.notes == (note,)
    assert probe_accuracy(policy, taught.probe) == pytest.approx(history[ended])


def test_sft_goes_on_steps_after_bar_once_the_probe_first_reaches_it(monkeypatch):
    """`sft.steps_after_bar`: the bar is reached at step 30 (probed every 10); SFT ends 25 steps later, at 55, not at
    the next probe; a later dip below the bar does not move the count. 0 ends at the bar's probe, as before; a cap
    that comes first ends it, and the note says how many steps it had after the bar."""
    accuracy_at = {0: 0.0, 10: 0.05, 20: 0.1, 30: 0.3, 40: 0.1, 50: 0.4}
    right = {step: round(20 * acc) for step, acc in accuracy_at.items()}
    fake_probe(monkeypatch, lambda step: [1.0] * right.get(step, 10) + [0.0] * (20 - right.get(step, 10)))
    notes: list[str] = []
    rates: list[float] = []
    ended = run_probe(
        probe_callback(20, every_steps=10, stop_at=0.15, steps_after_bar=25, notes=notes), StepModel(), 200, rates=rates
    )
    assert ended == 55
    # the rate is the scheduler's until the bar, then a cosine from it to 0 at the last step
    assert rates[:30] == [1.0] * 30 and rates[-1] == pytest.approx(0.0, abs=1e-12)
    assert rates[29 + 12] > 0.5 > rates[29 + 13] and all(a > b for a, b in itertools.pairwise(rates[29:]))
    assert notes == [
        "ended at step 55 of 200: the probe's greedy accuracy 0.300 reached 0.15 at step 30, then 25 more steps"
    ]
    notes.clear()
    assert run_probe(probe_callback(20, every_steps=10, stop_at=0.15, notes=notes), StepModel(), 200) == 30
    assert notes == ["ended at step 30 of 200: the probe's greedy accuracy 0.300 reached 0.15"]
    notes.clear()
    never = probe_callback(20, every_steps=10, stop_at=0.9, steps_after_bar=25, notes=notes)
    assert run_probe(never, StepModel(), 60) == 60 and not notes  # the cap, when the bar is never reached
    assert (
        run_probe(probe_callback(20, every_steps=10, stop_at=0.15, steps_after_bar=25, notes=notes), StepModel(), 40)
        == 40
    )
    assert notes == [
        "ended at step 40 of 40: the probe's greedy accuracy 0.300 reached 0.15 at step 30, then 10 more steps"
    ]


def test_the_sft_bar_needs_a_probe_split():
    from grpo_pipeline.tasks.sft import bar_probe

    cfg = load_config(None, ["sft.stop_at_accuracy=0.5"])
    with pytest.raises(ConfigError, match=r"sft.stop_at_accuracy needs the probe split"):
        bar_probe(cfg.sft, None, None, "correctness", cfg.eval.sampling.greedy(), [])


def test_the_bar_keys_sft_on_the_probe_and_reward_code_only_when_set():
    from grpo_pipeline.tasks.sft import sft_warmup

    external = sft_warmup.stage.external
    plain = load_config(None, []).sft
    barred = load_config(None, ["sft.stop_at_accuracy=0.6"]).sft
    assert external({"cfg": plain, "correctness_reward": RewardSpec(name="keep_rewards:shorter")}) == {}
    keyed = external({"cfg": barred, "correctness_reward": RewardSpec(name="keep_rewards:shorter")})
    assert set(keyed) == {"probe", "keep_rewards:shorter"}
