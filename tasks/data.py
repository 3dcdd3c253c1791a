"""Stage 1, prepare_data: build the train/eval splits from the config and write them as Parquet.

Sources: a built-in synthetic task (arithmetic, or Python functions from examples with hidden unit tests;
deterministic by seed), a local JSONL/Parquet/CSV file, or a
Hugging Face dataset (by name, or a local dataset directory). Every source ends as the same columns:
`prompt` (what the model sees), `answer` (the reference final answer, a string), `completion` (the SFT target),
plus any `extra_columns` the rewards need. With `prompt_format: chat` the prompt is the JSON of its chat messages
(tasks/scoring/chat.py).
"""

from __future__ import annotations

import json
import operator
import random
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel

from grpo_pipeline.configs.schema import DataConfig, SyntheticTaskConfig
from grpo_pipeline.tasks.core.common import Ref, atomic_dir, fingerprint_path, logger
from grpo_pipeline.tasks.core.stage import stage
from grpo_pipeline.tasks.scoring import chat


class DataError(ValueError):
    """The configured data cannot be loaded or mapped; the message names the file and column."""


class DatasetRefs(BaseModel):
    train: Ref
    eval: Ref
    # The GRPO probe's rows (data.num_probe), held out from training and disjoint from the eval items; None: none.
    probe: Ref | None = None


# ----------------------------------------------------------------------------- synthetic arithmetic

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def _operand(rng: random.Random, cfg: SyntheticTaskConfig) -> int:
    digits = rng.randint(cfg.min_digits, cfg.max_digits)
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(low, 10**digits - 1)


def synthetic_arithmetic(cfg: SyntheticTaskConfig, n: int, seed: int) -> pd.DataFrame:
    """`n` distinct problems like `prompt="47+8="`, `answer="55"`, drawn deterministically from `seed`."""
    largest = 10**cfg.max_digits
    space = (largest - (0 if cfg.min_digits == 1 else 10 ** (cfg.min_digits - 1))) ** 2 * len(cfg.operations)
    if n > space * 0.7:
        raise DataError(
            f"asked for {n} distinct problems but only about {space} exist with max_digits={cfg.max_digits}; "
            "lower data.num_train/num_eval/num_probe or raise data.synthetic.max_digits"
        )
    rng = random.Random(seed)
    seen: dict[str, str] = {}
    while len(seen) < n:
        a, b, op = _operand(rng, cfg), _operand(rng, cfg), rng.choice(cfg.operations)
        prompt = f"{a}{op}{b}="
        if prompt not in seen:
            seen[prompt] = str(_OPS[op](a, b))
    return pd.DataFrame({"prompt": list(seen), "answer": list(seen.values())})


_ADDITION = re.compile(r"(\d+)\+(\d+)=")


def needs_carry(prompt: str) -> bool | None:
    """Whether a synthetic '+' problem carries out of the units digit; None for any other problem."""
    m = _ADDITION.search(prompt)
    if m is None:
        return None
    return int(m.group(1)) % 10 + int(m.group(2)) % 10 >= 10


def slip_carries(train: pd.DataFrame, rate: float, seed: int) -> pd.DataFrame:
    """An imperfect teacher's SFT targets: on a `rate` fraction of the '+' problems that need a carry, the
    completion forgets it (the answer minus 10). `answer` stays right, so rewards and evaluation are unaffected."""
    if rate <= 0:
        return train
    rng = random.Random(f"teacher-slip-{seed}")
    slipped = [
        str(int(answer) - 10) if needs_carry(prompt) and rng.random() < rate else completion
        for prompt, answer, completion in zip(train["prompt"], train["answer"], train["completion"], strict=True)
    ]
    changed = sum(new != old for new, old in zip(slipped, train["completion"], strict=True))
    logger.info("imperfect teacher: %d of %d SFT completions forget a carry", changed, len(train))
    return train.assign(completion=slipped)


# ----------------------------------------------------------------------------- synthetic code: functions from examples

# Each family: how its body is written for a constant k, and what it computes.
FAMILIES: dict[str, tuple[str, Any]] = {
    "x+k": ("x+{k}", lambda x, k: x + k),
    "x-k": ("x-{k}", lambda x, k: x - k),
    "k-x": ("{k}-x", lambda x, k: k - x),
    "x*k": ("x*{k}", lambda x, k: x * k),
    "max(x,k)": ("max(x,{k})", lambda x, k: max(x, k)),
}
_SWAPPED = {"k-x": "x-k"}  # the imperfect teacher's slip: `k-x` written with its operands swapped, as `x-k`
FUNCTION_NAME = "f"
_SHOWN_INPUTS = (0, 1)  # always shown: with f(0) and f(1) the family and k can be read off the examples
_THIRD_INPUT = (2, 20)  # one more shown input, drawn from this range
_TEST_SPAN = 20  # hidden tests draw distinct inputs from 2..max_constant+20, never one the prompt shows


def synthetic_functions(cfg: SyntheticTaskConfig, n: int, seed: int) -> pd.DataFrame:
    """`n` distinct code problems: write the body of `f` from three input/output examples, e.g.
    `prompt="#f(0)=3 f(1)=4 f(7)=10\\ndef f(x):return "`, `answer="x+3"`, with HumanEval-style hidden tests
    (`test`: `check(candidate)` asserting `num_tests` inputs the prompt does not show; `entry_point`: "f"), so a
    completion passes by being the right program, not by echoing the examples. The program the code_tests reward
    runs is prompt + completion (the HumanEval protocol). Drawn deterministically from `seed`."""
    families = list(dict.fromkeys(cfg.families))
    space = len(families) * cfg.max_constant * (_THIRD_INPUT[1] - _THIRD_INPUT[0] + 1)
    if n > space * 0.7:
        raise DataError(
            f"asked for {n} distinct problems but only about {space} exist with {len(families)} families and "
            f"max_constant={cfg.max_constant}; lower data.num_train/num_eval/num_probe or raise "
            "data.synthetic.max_constant"
        )
    rng = random.Random(f"functions-{seed}")
    rows: dict[str, dict[str, str]] = {}
    while len(rows) < n:
        family, k = rng.choice(families), rng.randint(1, cfg.max_constant)
        body, fn = FAMILIES[family]
        shown = [*_SHOWN_INPUTS, rng.randint(*_THIRD_INPUT)]
        examples = " ".join(f"{FUNCTION_NAME}({x})={fn(x, k)}" for x in shown)
        prompt = f"#{examples}\ndef {FUNCTION_NAME}(x):return "
        if prompt in rows:
            continue
        unseen = [x for x in range(2, cfg.max_constant + _TEST_SPAN + 1) if x not in shown]
        hidden = rng.sample(unseen, cfg.num_tests)
        if family == "max(x,k)":  # inputs on both sides of k, else `k` or `max(x,k+1)` could pass every test
            for side, (lo, hi) in enumerate(((2, k - 1), (k + 1, cfg.max_constant + _TEST_SPAN))):
                if not any(lo <= x <= hi for x in hidden) and any(lo <= x <= hi for x in unseen):
                    hidden[side] = rng.choice([x for x in unseen if lo <= x <= hi and x not in hidden])
        asserts = "".join(f"    assert candidate({x}) == {fn(x, k)}\n" for x in hidden)
        rows[prompt] = {
            "prompt": prompt,
            "answer": body.format(k=k),
            "test": f"def check(candidate):\n{asserts}",
            "entry_point": FUNCTION_NAME,
            "family": family,
        }
    return pd.DataFrame(list(rows.values()))


def function_family(body: str) -> str | None:
    """The family of a functions-task body (`x+3` -> `x+k`), or None for anything else (e.g. an arithmetic answer)."""
    generic = re.sub(r"\d+", "k", body.strip())
    return generic if generic in FAMILIES else None


def swap_subtractions(train: pd.DataFrame, rate: float, seed: int) -> pd.DataFrame:
    """An imperfect teacher's SFT targets for the functions task: on a `rate` fraction of the `k-x` problems, the
    completion swaps the operands (`7-x` written `x-7`, a program the hidden tests reject). The tests stay right, so
    rewards and evaluation are unaffected; SFT learns a coin flip on the operand order, which only the tests (GRPO)
    can correct. `x-k` problems keep the right target: a slip in both directions left GRPO one shared choice
    ("x first or k first") pulled both ways (benchmarks/LEARNING.md)."""
    if rate <= 0:
        return train
    rng = random.Random(f"teacher-order-slip-{seed}")
    slipped = [
        FAMILIES[_SWAPPED[family]][0].format(k=re.sub(r"\D", "", answer))
        if family in _SWAPPED and rng.random() < rate
        else completion
        for family, answer, completion in zip(train["family"], train["answer"], train["completion"], strict=True)
    ]
    changed = sum(new != old for new, old in zip(slipped, train["completion"], strict=True))
    logger.info("imperfect teacher: %d of %d SFT completions swap a subtraction's operands", changed, len(train))
    return train.assign(completion=slipped)


# ----------------------------------------------------------------------------- files and HF datasets


def read_table(path: str | Path) -> pd.DataFrame:
    """Read a .jsonl/.json/.parquet/.csv file into a DataFrame, with errors that name the file."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {path} does not exist")
    suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
    try:
        if suffix in (".jsonl", ".jsonl.gz"):
            return pd.read_json(path, lines=True, dtype=False)
        if suffix in (".json", ".json.gz"):
            return pd.read_json(path, dtype=False)
        if suffix == ".parquet":
            return pd.read_parquet(path)
        if suffix in (".csv", ".csv.gz"):
            return pd.read_csv(path, dtype=str, keep_default_na=False)
    except ValueError as e:
        raise DataError(f"could not read {path}: {e}") from e
    raise DataError(f"data file {path} has an unsupported extension; use .jsonl, .json, .parquet or .csv")


def load_hf(name: str, config_name: str | None, split: str) -> pd.DataFrame:
    """Load a split of a Hugging Face dataset: a hub name, a directory saved with `save_to_disk`, or a data dir."""
    import datasets

    local = Path(name)
    if (local / "dataset_info.json").exists() or (local / "dataset_dict.json").exists():
        ds = datasets.load_from_disk(str(local))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise DataError(f"dataset {name} has splits {list(ds)}, not {split!r}; set data.hf_split")
            ds = ds[split]
    elif local.exists():
        ds = datasets.load_dataset(name, config_name, split=split)
    else:
        try:
            ds = datasets.load_dataset(name, config_name, split=split)
        except (ConnectionError, FileNotFoundError) as e:  # offline and not cached, hub unreachable, no such name
            config = f" (config {config_name!r})" if config_name else ""
            raise DataError(
                f"data.hf_name {name!r}{config} cannot be fetched: {e}. {dataset_fix(name, config_name)}"
            ) from e
    return ds.to_pandas()


def dataset_fix(name: str, config_name: str | None) -> str:
    """How to give the pipeline a local copy of the hub dataset `name` (for errors when it cannot be fetched)."""
    args = ", ".join(repr(a) for a in (name, config_name) if a)
    return (
        f"Point at a local copy: data.hf_name=/path/to/dataset_dir (saved with `datasets.load_dataset({args})"
        ".save_to_disk('/path/to/dataset_dir')` where the hub is reachable), or fill the cache with hub access first"
    )


def map_columns(raw: pd.DataFrame, cfg: DataConfig, origin: str) -> pd.DataFrame:
    """Rename source columns to prompt/answer/completion, apply the prompt template and answer pattern."""
    wanted = [cfg.prompt_column, cfg.answer_column, *cfg.extra_columns]
    if cfg.completion_column:
        wanted.append(cfg.completion_column)
    if raw.empty:
        raise DataError(f"{origin} has no rows, so there is nothing to train on; check data.path / data.hf_name")
    missing = [c for c in wanted if c not in raw.columns]
    if missing:
        raise DataError(
            f"{origin} has no column(s) {missing}; available: {list(raw.columns)}. "
            "Map them with data.prompt_column / data.answer_column / data.extra_columns."
        )
    out = pd.DataFrame(index=raw.index)
    out["prompt"] = [format_prompt(cfg, v, origin) for v in raw[cfg.prompt_column]]
    answers = raw[cfg.answer_column].map(lambda v: None if _missing(v) else str(v))
    if cfg.answer_pattern:
        pattern = re.compile(cfg.answer_pattern, re.MULTILINE | re.DOTALL)
        answers = answers.map(lambda v: _extract(pattern, v))
    out["answer"] = answers
    out["completion"] = (
        raw[cfg.completion_column].map(lambda v: None if _missing(v) else _completion_text(chat.plain(v)))
        if cfg.completion_column
        else out["answer"]
    )
    for c in cfg.extra_columns:
        out[c] = _as_json_if_nested(raw[c])
    return out.reset_index(drop=True)


def _as_json_if_nested(column: pd.Series) -> pd.Series:
    """A column holding mappings or lists of containers, as JSON text (missing values and strings unchanged).

    Test columns of code datasets (APPS `input_output`, CodeContests `public_tests`, open-r1 `verification_info`)
    are such columns: decoded, their rows mix shapes (lists of strings, of lists) that one Parquet column cannot
    hold; as JSON they are the text these datasets publish, which the code_tests reward reads as well.
    """
    values = [None if _missing(v) or isinstance(v, str) else chat.plain(v) for v in column]
    nested = any(
        isinstance(v, dict) or (isinstance(v, list) and any(isinstance(x, dict | list) for x in v)) for v in values
    )
    if not nested:
        return column
    return pd.Series(
        [v if p is None else json.dumps(p) for v, p in zip(column, values, strict=True)], index=column.index
    )


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and v != v)


def _completion_text(value: Any) -> str:
    """An SFT target as text: a chat completion ([{"role": "assistant", "content": ...}]) gives its last content."""
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        return str(value[-1].get("content", ""))
    return str(value)


def format_prompt(cfg: DataConfig, value: Any, origin: str = "the data") -> str | None:
    """One row's prompt as stored in the splits: the templated question (prompt_format: text), or the JSON of its
    chat messages (prompt_format: chat; tasks/scoring/chat.py). A source value that already holds messages is kept as it
    is (the system prompt put first when it has none), and validation checks it."""
    if _missing(value):
        return None
    value = chat.plain(value)
    holds_messages = isinstance(value, list)
    if cfg.prompt_format == "text":
        if holds_messages:
            raise DataError(
                f"{origin}: column {cfg.prompt_column!r} holds chat messages, not text; set data.prompt_format=chat"
            )
        return cfg.prompt_template.format(prompt=value)
    if not holds_messages:
        return chat.encode_messages(chat.build_messages(cfg.prompt_template.format(prompt=value), cfg.system_prompt))
    first = value[0] if value else None
    if cfg.system_prompt and not (isinstance(first, dict) and first.get("role") == "system"):
        value = [{"role": "system", "content": cfg.system_prompt}, *value]
    return chat.encode_messages(value)


def _extract(pattern: re.Pattern, value: str | None) -> str | None:
    if value is None:
        return None
    m = pattern.search(value)
    return m.group(1).strip().replace(",", "") if m else None


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


def describe_source(cfg: DataConfig) -> str:
    """The configured source in words, for error messages."""
    if cfg.source == "file":
        return f"data file {cfg.path}"
    if cfg.source == "hf":
        return f"dataset {cfg.hf_name} (split {cfg.hf_split!r})"
    return "the synthetic task"


def load_source(cfg: DataConfig) -> pd.DataFrame:
    """All rows of the configured source, mapped to the standard columns."""
    if cfg.source == "synthetic":
        make = synthetic_functions if cfg.synthetic.kind == "functions" else synthetic_arithmetic
        df = make(cfg.synthetic, cfg.num_train + cfg.num_eval + cfg.num_probe, cfg.seed)
        df["prompt"] = [format_prompt(cfg, p) for p in df["prompt"]]
        df["completion"] = df["answer"]
        return df
    if cfg.source == "file":
        return map_columns(read_table(cfg.path), cfg, origin=describe_source(cfg))
    return map_columns(load_hf(cfg.hf_name, cfg.hf_config, cfg.hf_split), cfg, origin=describe_source(cfg))


def _source_content(params: Mapping[str, Any]) -> dict[str, str]:
    """A local source file or dataset directory is keyed by its content: fixing a bad row in place and rerunning
    must prepare the data again, not reuse the splits of the old file."""
    cfg: DataConfig = params["cfg"]
    local = cfg.path if cfg.source == "file" else cfg.hf_name if cfg.source == "hf" else None
    if local and Path(local).exists():
        return {"source": fingerprint_path(local)}
    return {}


@stage("data", external=_source_content)
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
        train = slip_carries(train, cfg.synthetic.teacher_carry_slip, cfg.seed)
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
    with atomic_dir(out) as tmp:
        for name, frame in splits.items():
            frame.to_parquet(tmp / f"{name}.parquet", index=False)
    logger.info("prepared %s rows in %s", ", ".join(f"{len(f)} {name}" for name, f in splits.items()), out)
    files = {name: out / f"{name}.parquet" for name in splits}
    return DatasetRefs(**{name: Ref(path=str(f), fingerprint=fingerprint_path(f)) for name, f in files.items()})
