"""Stage of an rft stage (a staged recipe's `kind: rft`), rejection_sample: the policy's own verified completions, to
fine-tune it on.

Rejection-sampling fine-tuning (STaR, Zelikman et al. 2022; ReST-EM, Singh et al. 2023, sec. 3; Llama 3's rejection
sampling, Dubey et al. 2024, sec. 4.2.2): sample `samples_per_prompt` completions of the current policy for each of the
stage's prompts, as a GRPO round samples them, keep those the correctness reward verifies (at most `kept_per_prompt`
distinct ones per prompt), and fine-tune the policy on them with the recipe's SFT (tasks/sft.py). The keep rate says
how much of what the policy sampled was right; the kept rows are logged with it (MLflow) and shown in the summary.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from pydantic import BaseModel, computed_field

from grpo_pipeline.tasks.core.common import Checkpoint, Ref, atomic_dir, fingerprint_path, logger
from grpo_pipeline.tasks.core.stage import RunContext, stage
from grpo_pipeline.tasks.core.tracking import mlflow_run
from grpo_pipeline.tasks.scoring.rollouts import Rollouts, rollouts_code, sample_judged

TRAIN_FILE = "train.parquet"
SAMPLES_FILE = "samples.jsonl"


class RFTData(BaseModel):
    """What rejection sampling kept: the fine-tuning rows (prompt, completion) and how many of the samples passed."""

    label: str
    train: Ref
    source_fingerprint: str
    prompts: int
    samples_per_prompt: int
    sampled: int  # completions sampled
    verified: int  # of them, the ones the correctness reward verified
    unscored: int  # of them, the ones it could not score (neither kept nor counted wrong)
    kept: int  # rows written: at most kept_per_prompt distinct verified completions per prompt
    prompts_kept: int  # prompts with at least one kept completion
    samples_path: str
    run_id: str | None = None

    @computed_field
    @property
    def keep_rate(self) -> float | None:
        """Verified samples over scored samples; None when the correctness reward scored none (`describe` says so)."""
        scored = self.sampled - self.unscored
        return self.verified / scored if scored else None

    def describe(self) -> str:
        rate = "no keep rate: the correctness reward scored no sample" if self.keep_rate is None else (
            f"keep rate {self.keep_rate:.1%}")  # fmt: skip
        return (
            f"{self.verified} of {self.sampled - self.unscored} scored samples verified ({rate}; "
            f"{self.samples_per_prompt} per prompt), {self.kept} rows kept from {self.prompts_kept} of {self.prompts} "
            "prompts"
        )

    def local_files(self) -> list[str]:
        return [self.samples_path]


@stage("rft-{label}", external=rollouts_code)
def rejection_sample(
    policy: Checkpoint,
    train: Ref,
    rollouts: Rollouts,
    ctx: RunContext,
    label: str,
    samples_per_prompt: int,
    kept_per_prompt: int,
    *,
    out: Path,
) -> RFTData:
    """The verified completions of `policy` on `train`'s prompts as prompt/completion rows (`out/train.parquet`),
    every sample with its verdict in `out/samples.jsonl`."""
    rows = pd.read_parquet(train.require()).reset_index(drop=True)
    sampled, judged = sample_judged(policy, rows, samples_per_prompt, rollouts, ctx.seed, f"rft {label}")
    kept_rows = []
    for row, completions, verdicts in zip(rows.to_dict("records"), sampled, judged, strict=True):
        right = list(dict.fromkeys(c for c, ok in zip(completions, verdicts, strict=True) if ok is True))
        kept_rows += [{**row, "completion": c} for c in right[:kept_per_prompt]]
    kept = pd.DataFrame(kept_rows, columns=[*rows.columns.drop("completion", errors="ignore"), "completion"])
    with atomic_dir(out) as tmp:
        kept.to_parquet(tmp / TRAIN_FILE, index=False)
        with open(tmp / SAMPLES_FILE, "w") as f:
            for prompt, completions, verdicts in zip(rows["prompt"], sampled, judged, strict=True):
                f.write(json.dumps({"prompt": prompt, "completions": completions, "verified": verdicts}) + "\n")
    flat = [ok for verdicts in judged for ok in verdicts]
    result = RFTData(
        label=label,
        train=Ref(path=str(out / TRAIN_FILE), fingerprint=fingerprint_path(out / TRAIN_FILE)),
        source_fingerprint=train.fingerprint,
        prompts=len(rows),
        samples_per_prompt=samples_per_prompt,
        sampled=len(flat),
        verified=sum(ok is True for ok in flat),
        unscored=sum(ok is None for ok in flat),
        kept=len(kept),
        prompts_kept=kept["prompt"].map(str).nunique() if len(kept) else 0,
        samples_path=str(out / SAMPLES_FILE),
    )
    result = result.model_copy(update={"run_id": _track(result, policy, rollouts, ctx)})
    logger.info("rejection sampling for %s: %s", label, result.describe())
    return result


def _track(result: RFTData, policy: Checkpoint, rollouts: Rollouts, ctx: RunContext) -> str:
    """A small MLflow run per rejection sampling: its settings, the keep rate, and every sample with its verdict."""
    import mlflow

    tags = {"stage": "rft", "round": result.label, "parent_model": policy.lineage,
            "data_fingerprint": result.source_fingerprint}  # fmt: skip
    with mlflow_run(ctx.run_dir, ctx.experiment, f"{ctx.recipe}-rft-{result.label}", tags) as run:
        params = {**rollouts.sampling.model_dump(), **rollouts.model_dump(exclude={"sampling"})}
        mlflow.log_params({**params, "samples_per_prompt": result.samples_per_prompt, "seed": ctx.seed})
        mlflow.log_metrics(
            {
                **({"rft/keep_rate": result.keep_rate} if result.keep_rate is not None else {}),
                "rft/verified": result.verified,
                "rft/kept": result.kept,
                "rft/prompts_kept": result.prompts_kept,
            }
        )
        mlflow.log_artifact(result.samples_path)
    return run.info.run_id
