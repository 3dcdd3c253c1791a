"""Stage 1, prepare_data: build the train, eval and probe splits from the config and write them as Parquet.

Sources (tasks/sources/): a built-in synthetic task (arithmetic, or Python functions from examples with hidden unit
tests; deterministic by seed), a local JSONL/Parquet/CSV file, or a
Hugging Face dataset (by name, or a local dataset directory). Every source ends as the same columns:
`prompt` (what the model sees), `answer` (the reference final answer, a string), `completion` (the SFT target),
plus any `extra_columns` the rewards need. With `prompt_format: chat` the prompt is the JSON of its chat messages
(tasks/core/chat.py).
"""

from __future__ import annotations

import random
from pathlib import Path

import pandas as pd

from grpo_pipeline.configs.schema import DataConfig
from grpo_pipeline.tasks.core.common import DatasetRefs, Ref, atomic_dir, fingerprint_path, logger
from grpo_pipeline.tasks.core.stage import stage
from grpo_pipeline.tasks.sources import DataError
from grpo_pipeline.tasks.sources.load import describe_source, load_source, source_content
from grpo_pipeline.tasks.sources.synthetic import slip_carries, swap_subtractions, units_drill

# ----------------------------------------------------------------------------- split and write


def split_train_eval(
    df: pd.DataFrame, num_train: int, num_eval: int, seed: int, num_probe: int = 0
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Deterministic split by prompt into (train, eval, probe): all rows of one prompt land in one split, so no prompt
    is in two. The prompts are shuffled once and dealt in turn: the eval split takes the first ones, training the
    next ones (its first `num_train` rows), the probe split what follows (up to `num_probe` rows; fewer, or none,
    when the source runs out). Eval and training are the same whatever `num_probe`."""
    key = df["prompt"].fillna("")
    prompts = list(dict.fromkeys(key))
    random.Random(seed).shuffle(prompts)
    counts = key.value_counts()
    wanted = {"eval": num_eval, "train": num_train, "probe": num_probe}
    taken = dict.fromkeys(wanted, 0)
    side: dict[str, str] = {}
    for p in prompts:
        name = next((n for n in wanted if taken[n] < wanted[n]), None)
        if name is None:
            break
        side[p] = name
        taken[name] += int(counts[p])
    order = {p: i for i, p in enumerate(prompts)}
    ranked = df.assign(_r=key.map(order), _side=key.map(side)).sort_values("_r", kind="stable")
    parts = {name: part.drop(columns=["_r", "_side"]) for name, part in ranked.groupby("_side", sort=False)}
    empty = df.iloc[:0]
    train, eval_df, probe = (parts.get(name, empty).reset_index(drop=True) for name in ("train", "eval", "probe"))
    return train.head(num_train), eval_df, probe


@stage("data", external=source_content)
def prepare_data(cfg: DataConfig, run_dir: str, out: Path) -> DatasetRefs:
    """Build the splits and write `train.parquet` / `eval.parquet` into the stage's keyed directory `out`."""
    df = load_source(cfg)
    if len(df) < 2:
        raise DataError(f"{describe_source(cfg)} has {len(df)} row(s); need at least 2 (one to train, one to evaluate)")
    if cfg.source == "synthetic":  # the probe's problems are drawn after the others: train and eval stay the same
        drawn = cfg.num_train + cfg.num_eval
        train, held_out, _ = split_train_eval(df.head(drawn), cfg.num_train, cfg.num_eval, cfg.seed)
        probe = df.iloc[drawn:].reset_index(drop=True)
    else:
        train, held_out, probe = split_train_eval(df, cfg.num_train, cfg.num_eval, cfg.seed, cfg.num_probe)
    if cfg.source == "synthetic":
        train = slip_carries(train, cfg.synthetic.teacher_carry_slip, cfg.seed, cfg.synthetic.teacher_slip_carries)
        if cfg.synthetic.kind == "functions":
            train = swap_subtractions(train, cfg.synthetic.teacher_order_slip, cfg.seed)
    if train.empty:
        raise DataError(f"no rows are left for training after holding out {len(held_out)}; lower data.num_eval")
    if len(probe) < cfg.num_probe:
        logger.warning(
            "the probe split has %d of data.num_probe=%d rows: %s has too few rows beyond data.num_train + "
            "data.num_eval; the GRPO probe measures %d problem(s)",
            len(probe),
            cfg.num_probe,
            describe_source(cfg),
            len(probe),
        )
    splits = {"train": train, "eval": held_out, **({"probe": probe} if not probe.empty else {})}
    if cfg.source == "synthetic" and cfg.synthetic.units_drill:
        drill = units_drill(cfg.synthetic.max_digits, cfg.synthetic.units_drill)
        splits["sft"] = pd.concat([train, drill], ignore_index=True)
        logger.info("units drill: %d one-digit additions added to SFT's %d rows", len(drill), len(train))
    with atomic_dir(out) as tmp:
        for name, frame in splits.items():
            frame.to_parquet(tmp / f"{name}.parquet", index=False)
    logger.info("prepared %s rows in %s", ", ".join(f"{len(f)} {name}" for name, f in splits.items()), out)
    files = {name: out / f"{name}.parquet" for name in splits}
    return DatasetRefs(**{name: Ref(path=str(f), fingerprint=fingerprint_path(f)) for name, f in files.items()})


# ----------------------------------------------------------------------------- a stage's mixture


@stage("replay-{label}")
def replay_mixture(
    train: Ref, earlier: list[Ref], share: float, seed: int, run_dir: str, label: str, *, out: Path
) -> Ref:
    """A staged recipe's stage trains on `train` (its own prompts) and on the earlier stages' training prompts
    (`earlier`) as `share` of the mixture (StageSpec.replay), drawn at random (seeded) and without repeats, so that it
    keeps practising what they taught (Llama 3's and Tulu 3's data mixes; replay against forgetting). Only the columns
    of the stage's own rows are kept, so each earlier stage's rows must have them all (its rewards score both)."""
    own = pd.read_parquet(train.require())
    pool = []
    for i, ref in enumerate(earlier):
        rows = pd.read_parquet(ref.require())
        if missing := [c for c in own.columns if c not in rows.columns]:
            raise DataError(
                f"stage {label}: replay reads the training rows of earlier stage {i + 1} ({ref.path}), which lack "
                f"the column(s) {missing} its own rows have; give those rows the same columns, or set the stage's "
                "replay to 0"
            )
        pool.append(rows[list(own.columns)])
    earlier_rows = pd.concat(pool, ignore_index=True).drop_duplicates("prompt") if pool else own.iloc[:0]
    earlier_rows = earlier_rows[~earlier_rows["prompt"].isin(set(own["prompt"]))]
    wanted = round(len(own) * share / (1 - share))
    if wanted > len(earlier_rows):
        logger.warning(
            "stage %s: replay %.0f%% asks for %d earlier prompts; the earlier stages have %d, all replayed",
            label, 100 * share, wanted, len(earlier_rows),
        )  # fmt: skip
    replayed = earlier_rows.sample(n=min(wanted, len(earlier_rows)), random_state=seed)
    mixture = pd.concat([own, replayed], ignore_index=True).sample(frac=1.0, random_state=seed).reset_index(drop=True)
    with atomic_dir(out) as tmp:
        mixture.to_parquet(tmp / "train.parquet", index=False)
    logger.info("stage %s: %d own prompts + %d replayed from earlier stages", label, len(own), len(replayed))
    path = out / "train.parquet"
    return Ref(path=str(path), fingerprint=fingerprint_path(path))
