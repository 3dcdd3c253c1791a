"""The held-out accuracy probe: greedy accuracy on the probe split (data.num_probe rows, held out from training and
disjoint from the eval items), measured during GRPO.

It measures what evaluation measures (greedy answers on unseen problems), not only the sampled training reward,
in one batched `generate` call every few steps, and logs it to the training run (MLflow `probe/greedy_accuracy`).
With `grpo.keep: best_probe` it also chooses the policy a round returns: the step with the best probe accuracy
(ties go to the later step), whose trainable weights it keeps a copy of (on the CPU) until the round ends, and it
can end a round whose probe has stopped improving (`grpo.probe_patience`). With `grpo.keep_over_start` the chosen
step must also beat the round's start (tasks/training/keep_rule.py: by default it is chosen on one half of the
probe rows and confirmed on the other). Because the probe never sees an eval item, that choice cannot leak into the
evaluation or the gate.

In a multi-process stage every process measures (a sharded model needs all of them in `generate`), and every
process then uses process 0's per-row results (tasks/training/consensus.py), so the bar, the patience stop and the
kept step are the same decision everywhere. A round resumed from a periodic checkpoint keeps its true start: the
start's per-row results and weights are saved when the round begins and go into every checkpoint it saves
(tasks/training/checkpoints.py), so they travel wherever the checkpoint does (to another machine, through MLflow,
under Ray). A checkpoint without them cannot be resumed from: the resume point is not the start, and a round that
took it for one would return trained weights as its unchanged start.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from transformers import TrainerCallback

from grpo_pipeline.agents.loops import ToolLoop, eval_tool_loop
from grpo_pipeline.configs.grpo import RewardSpec
from grpo_pipeline.configs.sampling import Sampling
from grpo_pipeline.rewards import build_spec
from grpo_pipeline.tasks.core.common import logger
from grpo_pipeline.tasks.scoring.curves import PROBE_METRIC
from grpo_pipeline.tasks.scoring.episodes import hf_sampler
from grpo_pipeline.tasks.scoring.items import judge
from grpo_pipeline.tasks.scoring.metrics import paired_bootstrap_ci
from grpo_pipeline.tasks.training.checkpoints import START_DIR, start_weights_name
from grpo_pipeline.tasks.training.consensus import agree, gather, rank
from grpo_pipeline.tasks.training.keep_rule import as_items, confirms, counts, halves, scored_mean, sign_test_p


class StartMissingError(RuntimeError):
    """A round with grpo.keep: best_probe resumed from a checkpoint that does not hold the round's start."""


def greedy_accuracy(model, tokenizer, rows: pd.DataFrame, reward, max_new_tokens: int) -> float:
    """Fraction of `rows` whose greedy completion gets `reward` >= 1.0 (one batched generate call)."""
    return accuracy(greedy_correct(model, tokenizer, rows, reward, max_new_tokens))


def accuracy(items: list[float | None]) -> float:
    """The mean of the scored items (an unscored completion is left out); NaN when none was scored."""
    scored = [c for c in items if c is not None]
    return sum(scored) / len(scored) if scored else float("nan")


def greedy_correct(
    model, tokenizer, rows: pd.DataFrame, reward, max_new_tokens: int, tools: ToolLoop | None = None
) -> list[float | None]:
    """Per row: 1.0 when its greedy completion gets `reward` >= 1.0, else 0.0; None when the reward could not
    score it (left out of the accuracy). With `tools`, each completion is a tool episode, as in training."""
    was_training, side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    prompts, settings = rows["prompt"].tolist(), {"max_new_tokens": max_new_tokens, "batch_size": len(rows)}
    try:
        texts, _ = hf_sampler(model, tokenizer, tools, rows)(prompts, **settings)
    finally:
        model.train(was_training)
        tokenizer.padding_side = side
    judged, _ = judge(reward, rows, texts)
    return [group[0] for group in judged]


def beats_start(start: list[float | None], best: list[float | None]) -> tuple[bool, tuple[float, float, float]]:
    """Whether `best` is more accurate than `start` on the same probe rows beyond the noise: the lower bound of the
    paired bootstrap 95% CI of (best - start) over the rows both scored is above zero. Also (mean, low, high).
    The decision of `grpo.keep_rule: ci`."""
    pairs = [(a, b) for a, b in zip(start, best, strict=True) if a is not None and b is not None]
    if len(pairs) < 2:
        return False, (math.nan, math.nan, math.nan)
    mean, low, high = paired_bootstrap_ci([a for a, _ in pairs], [b for _, b in pairs], n_boot=2_000, seed=0)
    return low > 0, (mean, low, high)


@dataclass
class Probed:
    """One probe of the round: its step, per-row results (1.0, 0.0, None unscored) and, for a step that may be
    returned, a CPU copy of its trainable weights."""

    step: int
    items: list[float | None]
    weights: dict[str, object]


class HeldOutAccuracyProbe(TrainerCallback):
    """Log greedy accuracy on the probe rows when training starts, every `every_steps` steps and at its end (MLflow
    metric `probe/greedy_accuracy`); keeps the values in `history` as (step, accuracy). Each completion is decoded
    greedily at `sampling`'s length, as a tool episode where `sampling` has tools or an environment.

    With `keep_best`, the round ends with the weights of its best-probed step (`kept_step`), and `patience` > 0 ends
    it once that many probes in a row have not beaten the best (on the rows the step is chosen by). With
    `over_start` as well, that step replaces the round's start only when `rule` says it beats it: 'confirm' chooses
    the step on one half of the probe rows and requires a gain above `margin` on the other half; 'ci' chooses on
    every row and requires the paired bootstrap 95% CI of the gain on those rows to be above zero. `notes` says what
    was kept and why."""

    def __init__(
        self,
        rows: pd.DataFrame,
        tokenizer,
        every_steps: int,
        sampling: Sampling,
        correctness: RewardSpec,
        keep_best: bool = False,
        patience: int = 0,
        notes: list[str] | None = None,
        stop_at: float | None = None,
        steps_after_bar: int = 0,
        over_start: bool = False,
        rule: str = "confirm",
        margin: float = 0.0,
    ):
        self.rows = rows.reset_index(drop=True)
        self.tokenizer = tokenizer
        self.every_steps = every_steps
        self.max_new_tokens = sampling.max_new_tokens  # greedy: of `sampling`, its length and its episodes
        self.reward = build_spec(correctness)
        self.tools = eval_tool_loop(sampling, tokenizer)  # a tool-using policy is probed on its episodes
        self.keep_best = keep_best
        self.stop_at = stop_at  # end training `steps_after_bar` steps after the first probe at or above this accuracy
        self.steps_after_bar = steps_after_bar
        self._bar_step: int | None = None
        self.patience = patience
        self.over_start = over_start  # with keep_best: the start stays unless the chosen step beats it (`rule`)
        self.rule = rule
        self.margin = margin
        choosing, self._confirming = halves(len(self.rows))
        # the rows the best step is chosen on: one half with the confirm rule, else every row
        self._choosing = choosing if keep_best and over_start and rule == "confirm" else None
        self.history: list[tuple[int, float]] = []
        self.best: tuple[int, float] | None = None  # (step, score on the choosing rows) of the candidate
        self.kept_step: int | None = None
        self.kept_start = False  # with keep_over_start: the round returned its start, unchanged
        self.kept_accuracy: float | None = None  # the probe accuracy of what the round returns
        self.notes: list[str] = [] if notes is None else notes  # appended to: a caller may share its list
        self._candidate: Probed | None = None
        self._start: Probed | None = None  # the round's start (on a resumed attempt: as saved when it began)
        self._since_best = 0
        self._early_stop_at: int | None = None

    # ------------------------------------------------------------------ measuring

    def _measure(self, step: int, model) -> list[float | None]:
        import mlflow

        # every process measures; all of them go on with process 0's results, so they all decide alike
        items = agree(greedy_correct(model, self.tokenizer, self.rows, self.reward, self.max_new_tokens, self.tools))
        acc = accuracy(items)
        self.history.append((step, acc))
        if mlflow.active_run() is not None:
            mlflow.log_metric(PROBE_METRIC, acc, step=step)
        if self.keep_best:
            self._consider(step, items, model)
        return items

    def _score(self, items: list[float | None]) -> float:
        """The accuracy the candidate is chosen by: on the choosing half (confirm rule), else on every row."""
        return scored_mean(as_items(items), self._choosing)

    def _consider(self, step: int, items: list[float | None], model) -> None:
        """Make `step` the candidate when its score is at least the candidate's (ties: the later step), keeping a
        copy of its trainable weights; a NaN score (nothing scored) is passed over."""
        score = self._score(items)
        if math.isnan(score):
            return
        if self.best is not None and score < self.best[1]:
            self._since_best += 1
            return
        self._since_best = 0 if self.best is None or score > self.best[1] else self._since_best + 1
        self.best = (step, score)
        start = self._start is not None and self._start.step == step
        self._candidate = Probed(step, items, self._start.weights if start else trainable_copy(model))
        if not start and not self.over_start and self._start is not None:
            self._start.weights = {}  # only keep_over_start returns to the start once a later step is the candidate

    # ------------------------------------------------------------------ trainer events

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        step = state.global_step
        resumable = self.keep_best and args.save_strategy != "no"
        if not self.keep_best:
            self._measure(step, model)
        elif step > 0 and resumable:
            self._start = start = self._saved_start(args.output_dir, step)  # the interrupted attempt's start
            save_start(Path(args.output_dir) / START_DIR, start)  # for this attempt's checkpoints, on this disk
            self._consider(start.step, start.items, model)  # the candidate until a step scores as well
            self._measure(step, model)
        else:  # the round's start: measured here, its weights copied before _consider may share them
            self._start = Probed(step, [], trainable_copy(model))
            self._start.items = self._measure(step, model)
            if resumable:
                save_start(Path(args.output_dir) / START_DIR, self._start)

    def on_save(self, args, state, control, **kwargs):
        """Put the round's start into the checkpoint just written (before it is sealed and mirrored)."""
        if self.keep_best:
            copy_start(Path(args.output_dir), Path(args.output_dir) / f"checkpoint-{state.global_step}")

    def on_step_end(self, args, state, control, model=None, **kwargs):
        due = state.global_step % self.every_steps == 0 or state.global_step == state.max_steps
        if due and (not self.history or self.history[-1][0] != state.global_step):
            self._measure(state.global_step, model)
            if self.keep_best and self.patience and self._since_best >= self.patience:
                self._early_stop_at = state.global_step
                control.should_training_stop = True
            if self.stop_at is not None and self._bar_step is None and self.history[-1][1] >= self.stop_at:
                self._bar_step = state.global_step
        self._anneal_after_bar(state.global_step, kwargs.get("optimizer"))
        self._stop_after_bar(state, control)

    def _anneal_after_bar(self, step: int, optimizer) -> None:
        """Between the bar and `steps_after_bar` steps later, scale the scheduler's learning rate by a cosine from 1 to
        0, so that the warmup ends annealed. The scheduler sets each step's rate anew before this runs, so the
        factor never compounds; the logged `learning_rate` stays the scheduler's."""
        if self._bar_step is None or not self.steps_after_bar or optimizer is None:
            return
        factor = 0.5 * (1 + math.cos(math.pi * min((step - self._bar_step) / self.steps_after_bar, 1.0)))
        for group in optimizer.param_groups:
            group["lr"] *= factor

    def _stop_after_bar(self, state, control) -> None:
        step = state.global_step
        if self._bar_step is None or step < min(self._bar_step + self.steps_after_bar, state.max_steps):
            return
        control.should_training_stop = step < state.max_steps  # at the cap training ends anyway; the note says why
        reached = next(acc for s, acc in self.history if s == self._bar_step)
        after = f" at step {self._bar_step}, then {step - self._bar_step} more steps" if self.steps_after_bar else ""
        self.notes.append(
            f"ended at step {step} of {state.max_steps}: the probe's greedy accuracy {reached:.3f} reached "
            f"{self.stop_at}{after}"
        )
        logger.info("%s", self.notes[-1])
        self._bar_step = None  # one note

    def on_train_end(self, args, state, control, model=None, **kwargs):
        step = state.global_step
        if not self.history or self.history[-1][0] != step:
            self._measure(step, model)
        if not self.keep_best or self._candidate is None:
            self.kept_accuracy = self.history[-1][1]
            return
        if self._early_stop_at is not None:
            self.notes.append(
                f"ended at step {self._early_stop_at} of {state.max_steps}: {self.patience} probe(s) in a row did not "
                f"beat the best (grpo.probe_patience={self.patience})"
            )
        kept, note = self._decide(step)
        if kept.step != step:
            restore(model, kept.weights)
        self.kept_step, self.kept_accuracy = kept.step, accuracy(kept.items)
        self.kept_start = kept is self._start
        self.notes.append(note)
        logger.info("%s", note)
        self._candidate = self._start = None

    # ------------------------------------------------------------------ the kept step

    def _decide(self, step: int) -> tuple[Probed, str]:
        """The probe the round returns and the note that says why."""
        chosen, start, last_acc = self._candidate, self._start, self.history[-1][1]
        assert chosen is not None
        plain = (
            f"kept step {chosen.step} of {step} (grpo.keep=best_probe): probe accuracy {accuracy(chosen.items):.3f}, "
            f"the round's best held-out probe accuracy, ties to the later step; the last step's was {last_acc:.3f}"
        )
        if not self.over_start or start is None or chosen.step == start.step:
            if self.over_start and start is not None:
                return start, (
                    f"kept the start (step {start.step}) of {step} (grpo.keep_over_start): no later step scored as "
                    f"well as the start on the {'choosing half of the ' if self._choosing is not None else ''}probe"
                )
            return chosen, plain
        if self.rule == "ci":
            better, (gain, low, high) = beats_start(start.items, chosen.items)
            if better:
                return chosen, plain
            return start, (
                f"kept the start (step {start.step}) of {step} (grpo.keep_over_start): the best step "
                f"{chosen.step}'s probe gain {gain:+.3f} (paired 95% CI {low:+.3f}..{high:+.3f}) is not above zero"
            )
        c = counts(start.items, chosen.items, self._confirming)
        evidence = (
            f"on the {c.rows} probe rows that did not choose it, it gained {c.gain * 100:+.1f} points over the start "
            f"({c.wins} right where the start was wrong, {c.losses} the reverse; one-sided sign test "
            f"p={sign_test_p(c.wins, c.losses):.2g})"
        )
        if confirms(c.wins, c.losses, c.rows, self.margin):
            return chosen, (
                f"kept step {chosen.step} of {step} (grpo.keep=best_probe, grpo.keep_over_start): the best of the "
                f"round's probes on half of the probe rows; {evidence}, above grpo.keep_margin={self.margin:g}; probe "
                f"accuracy {accuracy(chosen.items):.3f}, the start's {accuracy(start.items):.3f}, the last step's "
                f"{last_acc:.3f}"
            )
        return start, (
            f"kept the start (step {start.step}) of {step} (grpo.keep_over_start): step {chosen.step} was the best "
            f"on half of the probe rows, but {evidence}, not above grpo.keep_margin={self.margin:g}"
        )

    # ------------------------------------------------------------------ a resumed round's start

    def _saved_start(self, output_dir: str, step: int) -> Probed:
        """The start the interrupted attempt saved in the checkpoint it resumes from; StartMissingError when a process
        cannot read its part (the resume point is not the start, and taking it for one would return trained weights as
        the round's unchanged start)."""
        folder = Path(output_dir) / f"checkpoint-{step}" / START_DIR
        start = load_start(folder)
        if all(gather(start is not None)):
            assert start is not None
            start.items = agree(start.items)
            return start
        raise StartMissingError(
            f"resumed at step {step} from a checkpoint without the round's start ({folder} is missing or unreadable "
            "on at least one process): with grpo.keep=best_probe the round compares its steps with its start, and "
            "the resume point is not the start. Delete the checkpoints to train the round afresh: the folder "
            f"{output_dir} and, with distributed.backend=ray, the tag grpo_pipeline.resume_step of the round's MLflow "
            "run"
        )


def save_start(folder: Path, start: Probed) -> None:
    """Save the round's start beside its resumable checkpoints: each process its trainable weights
    (`weights-rank<r>.pt`), process 0 the per-row results (`start.json`); each file written whole or not at all."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    weights = folder / start_weights_name(rank())
    torch.save(start.weights, folder / f".{weights.name}.tmp")
    os.replace(folder / f".{weights.name}.tmp", weights)
    if rank() == 0:
        (folder / ".start.json.tmp").write_text(json.dumps({"step": start.step, "items": start.items}))
        os.replace(folder / ".start.json.tmp", folder / "start.json")


def load_start(folder: Path) -> Probed | None:
    """The start `save_start` wrote, this process's part (None when a file is missing or unreadable)."""
    import torch

    if not folder.is_dir():
        return None
    try:
        meta = json.loads((folder / "start.json").read_text())
        weights = torch.load(folder / start_weights_name(rank()), map_location="cpu", weights_only=True)
    except (OSError, ValueError, RuntimeError) as e:
        logger.warning("cannot read the round's saved start in %s: %s", folder, e)
        return None
    return Probed(int(meta["step"]), list(meta["items"]), weights)


def copy_start(resume: Path, checkpoint: Path) -> None:
    """Each process: put its part of the start saved in `resume` (and process 0 the per-row results) into
    `checkpoint`, as hard links where the disk allows; then wait for every process, so that the checkpoint is whole
    before process 0 seals it."""
    names = [start_weights_name(rank()), *(["start.json"] if rank() == 0 else [])]
    (checkpoint / START_DIR).mkdir(parents=True, exist_ok=True)
    for name in names:
        source, target = resume / START_DIR / name, checkpoint / START_DIR / name
        try:
            os.link(source, target)
        except OSError:  # a disk without hard links (or a copy left by an earlier attempt)
            shutil.copyfile(source, target)
    gather(None)


def trainable_copy(model) -> dict[str, object]:
    """A CPU copy of `model`'s trainable parameters, by name."""
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}


def restore(model, weights: dict[str, object]) -> None:
    """Copy `weights` (name -> tensor, as kept by the probe) back into `model`'s parameters of those names."""
    import torch

    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value)
