"""Preflight: reject bad input before anything trains, with one error that says what, where and how to fix it.

A mistake found after SFT costs the SFT run, and one found mid-GRPO leaves a half-trained policy behind; so every
check that can be made early is made early, and each failure lists every problem found at once:

  - `configs/schema.py` rejects what the values alone decide (types, ranges, batch sizes that cannot form whole
    groups), when the config is loaded;
  - `check_config` rejects what needs the machine but no data: a run directory that cannot be written, a reward
    name that is not registered or a dotted path that does not import, a local `model.base` or a local data file
    or dataset directory (`data.path`, a local `data.hf_name`) that does not exist.
    The CLI runs it before Prefect starts (a bad recipe fails in about a second); the flow runs it again on entry,
    for deployments and plain Python;
  - `check_inputs`, a stage between base_model and sft_warmup, rejects what needs the validated data and the base
    model: a reward that fails, returns the wrong number of scores or non-numbers on real training rows; prompts
    that do not fit the model's context with the completion budget (tasks/core/context_window.py); fewer training
    rows than one GRPO batch.

The data contract itself (columns, blanks, duplicates, train/eval overlap) is tasks/sources/contract.py.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel

from grpo_pipeline.configs.schema import DataConfig, EvalConfig, GRPOStageConfig, PipelineConfig
from grpo_pipeline.rewards import build_reward
from grpo_pipeline.rewards.registry import RewardError
from grpo_pipeline.tasks.core.chat import as_completion
from grpo_pipeline.tasks.core.common import Checkpoint, DatasetRefs, load_tokenizer, logger
from grpo_pipeline.tasks.core.context_window import context_problems
from grpo_pipeline.tasks.core.hub import check_base_path, dataset_problem, looks_local, model_problem
from grpo_pipeline.tasks.core.stage import stage, user_code
from grpo_pipeline.tasks.scoring.items import reward_columns
from grpo_pipeline.tasks.training.vllm_rollouts import rollouts_use_vllm

# Training rows each reward scores before SFT: enough to hit a wrong count or a bad type, cheap for a sandbox/judge.
SMOKE_ROWS = 4
# The data files tasks/data.py's read_table reads, by extension.
DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".jsonl.gz", ".json.gz", ".csv.gz")


class PreflightError(ValueError):
    """Bad input found before training; the message lists every problem, each naming its field, file or row."""


def _raise(what: str, problems: Sequence[str]) -> None:
    if problems:
        raise PreflightError(f"{what}:\n" + "\n".join(f"  - {p}" for p in problems))


# ----------------------------------------------------------------------------- the config alone


def check_config(cfg: PipelineConfig) -> None:
    """Raise PreflightError naming every problem the config has on this machine: run dir, rewards, base model path,
    local data paths, tools and environment (grpo.tools, grpo.environment).

    Needs the user's import paths in place (`runtime.setup(cfg)`) so that dotted-path rewards import as in training.
    """
    problems = [p for p in (run_dir_problem(cfg.run_dir),) if p]
    for field, name, params in reward_entries(cfg.grpo, cfg.eval):
        try:
            build_reward(name, params)
        except Exception as e:  # a factory may raise anything on bad params; each is the user's to fix
            problems.append(f"{field}: {e}")
    try:
        check_base_path(cfg.model.base)
    except FileNotFoundError as e:
        problems.append(str(e))
    data_problems = data_path_problems(cfg.data)
    problems += data_problems
    # A hub model or dataset that cannot be fetched here (offline, no network), said now rather than after Prefect
    # has started and the library's retries have run out (tasks/core/hub.py).
    problems += [p for p in (model_problem(cfg.model.base), None if data_problems else dataset_problem(cfg.data)) if p]
    problems += suite_problems(cfg)
    if cfg.grpo.tools or cfg.grpo.environment:  # the check loads transformers: only for a recipe with tools
        from grpo_pipeline.agents.trainer_args import check_agent_config

        problems += check_agent_config(cfg.grpo)
    _raise("the config cannot run here", problems)


def suite_problems(cfg: PipelineConfig) -> list[str]:
    """Why an eval suite's file, local dataset or hub dataset cannot be read here, each named by its suite, as the
    training data's are: said before anything trains, not when the suite is prepared after training data."""
    problems = []
    for suite in cfg.eval.suites:
        if suite.source in ("heldout", "synthetic"):
            continue
        data = suite.data_config()
        found = data_path_problems(data) or [p for p in (dataset_problem(data),) if p]
        problems += [re.sub(r"\bdata\.(?=path|hf_)", f"eval.suites[{suite.name}].", p) for p in found]
    return problems


def run_dir_problem(run_dir: str) -> str | None:
    """Why `run_dir` cannot hold the run (created if missing, then written to), or None when it can."""
    path = Path(run_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, scratch = tempfile.mkstemp(dir=path, prefix=".write-check-")
        os.close(fd)
        os.unlink(scratch)
    except OSError as e:
        where = f" ({e.filename})" if e.filename and str(e.filename) != run_dir else ""
        return (
            f"run_dir {run_dir!r} is not writable: {e.strerror or e}{where}. The run keeps its datasets, checkpoints "
            "and MLflow store there; set run_dir=<a writable directory> or fix its permissions"
        )
    return None


def data_path_problems(data: DataConfig) -> list[str]:
    """Why each local file or directory the data config names cannot be read here, one line per field.

    Checked with `model.base`, before Prefect starts: otherwise a missing file is found only by the data stage,
    after the temporary Prefect server has started and the flow has begun."""
    cwd = Path.cwd()
    problems = []
    for field, value in local_data_paths(data):
        path = Path(value).expanduser()
        where = "" if path.is_absolute() else f" (relative to the working directory {cwd})"
        if field == "data.hf_name":
            if not path.exists():
                problems.append(
                    f"data.hf_name {value!r} looks like a local path but does not exist{where}; set data.hf_name to "
                    "a dataset directory on this machine (saved with save_to_disk, or a folder of data files) or to "
                    "a hub name such as openai/gsm8k"
                )
            continue
        suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
        fix = f"set {field}=<a .jsonl, .json, .parquet or .csv file on this machine>"
        if not path.exists():
            problems.append(f"{field} {value!r} does not exist{where}; {fix}")
        elif not path.is_file():
            problems.append(f"{field} {value!r} is not a file{where}; {fix}")
        elif suffix not in DATA_SUFFIXES:
            problems.append(f"{field} {value!r} has an unsupported extension ({suffix or 'none'}); {fix}")
        elif not os.access(path, os.R_OK):
            problems.append(f"{field} {value!r} is not readable; fix its permissions or {fix}")
    return problems


def local_data_paths(data: DataConfig) -> list[tuple[str, str]]:
    """(config field, path) of every local file or directory the data config reads: `data.path` (source: file), a
    local `data.hf_name` (source: hf) and any other `*_path` field that is set (e.g. separate train and eval files)."""
    paths = []
    if data.source == "file" and data.path:
        paths.append(("data.path", data.path))
    if data.source == "hf" and data.hf_name and looks_local(data.hf_name):
        paths.append(("data.hf_name", data.hf_name))
    for name, value in data:
        if name.endswith("_path") and isinstance(value, str) and value:
            paths.append((f"data.{name}", value))
    return paths


def reward_entries(grpo: GRPOStageConfig, eval_cfg: EvalConfig) -> list[tuple[str, str, dict[str, Any]]]:
    """(config field, name, params) of every reward a run builds: the training rewards and the one that decides
    correctness in evaluation."""
    entries = [(f"grpo.rewards[{i}]", spec.name, spec.params) for i, spec in enumerate(grpo.rewards)]
    return [*entries, ("eval.correctness_reward", eval_cfg.correctness_reward.name, eval_cfg.correctness_reward.params)]


# ----------------------------------------------------------------------------- the data and the base model


class InputReport(BaseModel):
    """What the input checks measured (kept as the stage's cached result)."""

    train_rows: int
    context: int | None
    longest_prompt_tokens: int
    rewards: list[str]


def _inputs_code(params: Mapping[str, Any]) -> dict[str, str]:
    # what `auto` resolves to on this machine keys the check too: one passed where rollouts are generated by
    # transformers does not speak for a machine where vLLM generates them (rollout_problems)
    code = user_code(name for _, name, _ in reward_entries(params["grpo"], params["eval_cfg"]))
    return {**code, "rollouts_use_vllm": str(rollouts_use_vllm(params["grpo"]))}


@stage("preflight", external=_inputs_code)
def check_inputs(
    data: DatasetRefs, base: Checkpoint, grpo: GRPOStageConfig, eval_cfg: EvalConfig, sft_enabled: bool
) -> InputReport:
    """Raise PreflightError naming every problem that the prepared data and the base model show before training:
    too few training rows for one GRPO batch, a reward that fails on real rows, prompts too long for the context."""
    train = pd.read_parquet(data.train.require())
    held_out = pd.read_parquet(data.eval.require())
    problems = []
    if len(train) < grpo.prompts_per_step:
        problems.append(
            f"the training split has {len(train)} row(s) ({data.train.path}), fewer than grpo.prompts_per_step="
            f"{grpo.prompts_per_step}: TRL forms only whole batches of prompts, so no GRPO step could run; add rows "
            "(data.num_train, or fewer held out with data.num_eval) or lower grpo.prompts_per_step"
        )
    problems += reward_problems(train.head(SMOKE_ROWS), reward_entries(grpo, eval_cfg))
    length_problems, context, longest = context_problems(base, train, held_out, grpo, eval_cfg, sft_enabled)
    problems += length_problems
    problems += rollout_problems(base, grpo)
    _raise("the input checks failed before training", problems)
    logger.info(
        "input checks passed: %d training rows; rewards score real rows; the longest prompt is %d tokens%s",
        len(train),
        longest,
        f" (context {context})" if context else "",
    )
    return InputReport(
        train_rows=len(train),
        context=context,
        longest_prompt_tokens=longest,
        rewards=[name for _, name, _ in reward_entries(grpo, eval_cfg)],
    )


def rollout_problems(base: Checkpoint, grpo: GRPOStageConfig) -> list[str]:
    """Tools called in text (the model's chat template cannot carry tool calls, agents/text_tools.py) with GRPO
    rollouts through vLLM: the text loop generates with transformers in the training process and refuses a trainer
    that uses vLLM, so the round would fail at its first step, after SFT."""
    if not grpo.tools or grpo.environment is not None or not rollouts_use_vllm(grpo):
        return []
    # the agents package loads transformers: only for a recipe with tools, as check_config's tool check does
    from grpo_pipeline.agents.text_tools import needs_text_loop

    try:
        tokenizer = load_tokenizer(base.path)
    except (OSError, ValueError):
        return []  # context_problems names a base that cannot be loaded
    if not needs_text_loop(tokenizer):
        return []
    resolved = "auto, which resolves to vLLM here (CUDA and the vllm package)" if grpo.use_vllm == "auto" else "true"
    return [
        f"grpo.tools {grpo.tools} on {base.parent or base.path}, whose chat template cannot carry tool calls, are "
        "called in text by the pipeline's own rollout loop (agents/text_tools.py), which generates with transformers "
        f"in the training process; grpo.use_vllm is {resolved}: set grpo.use_vllm=false"
    ]


def reward_problems(rows: pd.DataFrame, entries: Sequence[tuple[str, str, dict[str, Any]]]) -> list[str]:
    """Call each reward as training does, on `rows` with their own SFT completions as the completions: a reward
    that raises, returns the wrong number of scores or a non-number (None is allowed: "not applicable") is named."""
    prompts, columns = reward_columns(rows, 1)
    completions = [as_completion(p, c) for p, c in zip(prompts, rows["completion"], strict=True)]  # chat: messages
    where = f"on the first {len(rows)} training rows, with their SFT completions as completions"
    problems = []
    for field, name, params in entries:
        try:
            scores = build_reward(name, params)(prompts=prompts, completions=completions, **columns)
        except RewardError as e:  # a wrong count or a non-number: the message says which
            problems.append(f"{field}: {e} ({where})")
            continue
        except Exception as e:  # the user's code: any failure here would fail training the same way
            problems.append(
                f"{field}: reward {name!r} raised {type(e).__name__}: {e} ({where}). Fix the reward, or keep the "
                f"columns it reads with data.extra_columns (the rows have: {', '.join(sorted(columns)) or 'none'})"
            )
            continue
        if all(s is None for s in scores):
            logger.warning("%s: reward %r returned None (not applicable) for every row %s", field, name, where)
    return problems
