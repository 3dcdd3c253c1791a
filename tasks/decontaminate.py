"""decontaminate: leave out of training every row whose prompt overlaps a benchmark's prompts (data.decontaminate).

A training prompt overlaps a benchmark suite (a named Parquet file of prompts, the columns of the eval split) when
the two share a run of n consecutive words, n = `data.decontaminate_ngram` (13 by default). What was followed:

- Words, as GPT-3 defines a gram for its training-set filtering (Brown et al. 2020, arXiv:2005.14165, appendix C:
  13-grams, "a lowercase, whitespace delimited word with no punctuation"): the text lowercased (casefolded), every
  punctuation mark and symbol deleted (lm-evaluation-harness's `Janitor` deletes `string.punctuation`, the ASCII
  ones, lm_eval/decontamination/janitor.py), then split on whitespace. The text is NFKC-normalised first, so that
  a full-width digit or a ligature is the same word as its plain form.
- One lookup of the benchmark side, scanned once per training row, as open-r1's scripts/decontaminate.py does
  (`build_ngram_lookup`: every word n-gram of the benchmark problems -> the problems that have it; `word_ngrams`:
  the words joined by spaces, `len(words) - n + 1` of them). Its `normalize_string` lowercases and collapses
  whitespace but keeps punctuation; GPT-3's rule is followed instead, so that a copy with other commas still counts.
- Texts shorter than n words have no n-gram, so by that rule nothing could ever match them. GPT-3 set N per
  benchmark to the 5th-percentile example length (min 8, max 13) and says examples under 8 words were ignored in
  its filtering (appendix C, "Overlap results"); for arithmetic it searched the training data for each whole
  problem (`<NUM1> + <NUM2> =`, sec. 3.9.1). The project's own tasks are that short (`47+38=`), so here, when
  either prompt has fewer than n words, the shorter one must appear whole, as a run of consecutive tokens, inside
  the other (equal to it, or contained in it). For these, punctuation is kept as tokens of their own (`47+38=` is
  `47 + 38 =`; case and spacing are still ignored): deleting it, as the n-gram rule does, would make `47+38=`,
  `47-38=` and `4+738=` the one word `4738`, and in a short text the marks carry the question. (So a short
  copy with a comma more or less is missed; the long copies of benchmark problems are what the n-grams are for.)
- Chat prompts (data.prompt_format: chat, stored as the JSON of their messages, tasks/core/chat.py) are compared
  by what they ask: the content of their non-system messages, never the JSON around it. A system prompt is left
  out because it is the same on every row: shared by both sides, 13 words of it would make every row overlap.

- What a prompt asks is compared, not what the recipe wraps around it: the literal text of each side's
  `prompt_template` (`Solve step by step: {prompt}`) is taken off its prompts first. An instruction of 13 words or
  more in a template would otherwise make every training row overlap every suite that uses it (the held-out split
  always does).

A row that overlaps two suites counts for both; it is dropped once.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
from pydantic import BaseModel

from grpo_pipeline.tasks.core import chat
from grpo_pipeline.tasks.core.common import Ref, atomic_dir, fingerprint_path, logger
from grpo_pipeline.tasks.core.stage import stage
from grpo_pipeline.tasks.sources import DataError

MODES = ("drop", "error", "off")
SHOWN = 5  # offending training prompts an error shows
PREVIEW_CHARS = 80

# Punctuation and symbols: neither a letter, a digit nor whitespace (`_` is a word character to `\w`).
_MARK = r"[^\w\s]|_"
_MARKS = re.compile(_MARK)
_TOKENS = re.compile(rf"[^\W_]+|{_MARK}")


# ----------------------------------------------------------------------------- text


def visible_text(prompt: str) -> str:
    """What a prompt asks: the text of a plain prompt, the non-system messages' content of a chat prompt."""
    messages = chat.decode_messages(prompt)
    if messages is None:
        return prompt
    return "\n".join(m["content"] for m in messages if m["role"] != "system")


def question(prompt: str, template: str = "{prompt}") -> str:
    """What a prompt asks without its template's own text: `visible_text`, less the literal text before and after
    `{prompt}` in `template` where the prompt carries it."""
    text = visible_text(prompt)
    parts = [literal for literal, field, _, _ in string.Formatter().parse(template)]
    fields = [field for _, field, _, _ in string.Formatter().parse(template) if field is not None]
    if fields != ["prompt"]:  # a template of another shape: compared as it is
        return text
    before, after = parts[0], "".join(parts[1:])
    if text.startswith(before) and text.endswith(after) and len(text) >= len(before) + len(after):
        return text[len(before) : len(text) - len(after)]
    return text


def _normal(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


def words(text: str) -> list[str]:
    """GPT-3's grams: lowercase, whitespace-delimited words with punctuation and symbols deleted."""
    return _MARKS.sub("", _normal(text)).split()


def tokens(text: str) -> list[str]:
    """The words of a short text with its marks kept, one token each: `47+38=` -> ['47', '+', '38', '=']."""
    return _TOKENS.findall(_normal(text))


def word_ngrams(text_words: Sequence[str], n: int) -> set[str]:
    """Every run of `n` consecutive words, joined by spaces (none when there are fewer than `n` words)."""
    return {" ".join(text_words[i : i + n]) for i in range(len(text_words) - n + 1)}


# ----------------------------------------------------------------------------- the index and the scan


@dataclass(frozen=True)
class SuiteIndex:
    """The prompts of every benchmark suite, ready to look training prompts up in (`suite_index`)."""

    n: int
    # each word n-gram of a prompt of n words or more -> the suites that have it
    ngrams: Mapping[str, frozenset[str]]
    # the tokens of each prompt of fewer than n words, joined -> the suites that have it, by token count
    short: Mapping[int, Mapping[str, frozenset[str]]]
    # per suite, every prompt's tokens joined by spaces, framed by a space on each side, one prompt a line: where a
    # short training prompt is looked for as a run of whole tokens
    lines: Mapping[str, str]


def suite_index(suites: Mapping[str, Sequence[str]], n: int) -> SuiteIndex:
    """The index of the suites' prompts (`{suite name: prompts}`) for runs of `n` words."""
    if n < 1:
        raise ValueError(f"the n-gram size must be at least 1, not {n}")
    ngrams: dict[str, set[str]] = defaultdict(set)
    short: dict[int, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    lines: dict[str, str] = {}
    for suite, prompts in suites.items():
        framed = []
        for prompt in prompts:
            text = visible_text(prompt)
            toks = tokens(text)
            if not toks:
                continue
            framed.append(f" {' '.join(toks)} ")
            text_words = words(text)
            if len(text_words) >= n:
                for gram in word_ngrams(text_words, n):
                    ngrams[gram].add(suite)
            else:
                short[len(toks)][" ".join(toks)].add(suite)
        lines[suite] = "\n".join(framed)
    return SuiteIndex(
        n=n,
        ngrams={gram: frozenset(s) for gram, s in ngrams.items()},
        short={size: {seq: frozenset(s) for seq, s in seqs.items()} for size, seqs in short.items()},
        lines=lines,
    )


def overlapping_suites(index: SuiteIndex, prompt: str) -> set[str]:
    """The suites one training prompt overlaps (see the module docstring for the rule)."""
    text = visible_text(prompt)
    toks = tokens(text)
    if not toks:  # a blank prompt is contained in everything and asks nothing
        return set()
    found: set[str] = set()
    text_words = words(text)
    if len(text_words) >= index.n:
        for gram in word_ngrams(text_words, index.n):
            found |= index.ngrams.get(gram, frozenset())
    else:  # too short for an n-gram: the whole prompt inside a benchmark prompt
        needle = f" {' '.join(toks)} "
        found |= {suite for suite, lines in index.lines.items() if needle in lines}
    for size, whole in index.short.items():  # a short benchmark prompt inside this one
        for i in range(len(toks) - size + 1):
            found |= whole.get(" ".join(toks[i : i + size]), frozenset())
    return found


def contaminated(train_prompts: Sequence[str], suites: Mapping[str, Sequence[str]], n: int) -> dict[str, list[int]]:
    """Per suite, the indices (ascending) of the training prompts that overlap its prompts; every suite is a key."""
    index = suite_index(suites, n)
    hits: dict[str, list[int]] = {suite: [] for suite in suites}
    for i, prompt in enumerate(train_prompts):
        for suite in overlapping_suites(index, prompt):
            hits[suite].append(i)
    return hits


# ----------------------------------------------------------------------------- the stage


class Decontamination(BaseModel):
    """What the decontamination stage kept and dropped."""

    train: Ref  # the kept rows (the input itself when nothing was dropped or mode is off)
    dropped: dict[str, int]  # per suite compared, the training rows that overlap it (a row may count for two)
    rows: tuple[int, ...] = ()  # the input rows dropped, 0-based, ascending
    num_rows: int  # training rows before decontamination
    ngram: int
    mode: str
    split: str = "training"  # whose rows were compared: "training" (train, SFT's) or "probe" (GRPO's and SFT's probe)

    @property
    def total(self) -> int:
        """Distinct training rows dropped."""
        return len(self.rows)

    def line(self) -> str:
        """One sentence for the run summary and the logs."""
        grams = f"{self.ngram}-word n-grams"
        if self.mode == "off":
            return (
                f"decontamination: off (data.decontaminate=off): {self.split} rows not compared with benchmark prompts"
            )
        if not self.dropped:
            return f"decontamination: no benchmark suite to compare the {self.split} rows with"
        if not self.total:
            return (
                f"decontamination: no {self.split} row overlaps {_names(list(self.dropped), 'or')} "
                f"({self.num_rows} rows; {grams})"
            )
        dropped = f"dropped {self.total} of {self.num_rows} {self.split} rows"
        return f"decontamination: {dropped} ({self.overlaps()}; {grams})"

    def overlaps(self) -> str:
        """The suites overlapped, with how many rows each: '2 overlap gsm8k_test, 1 overlap heldout'."""
        return ", ".join(f"{k} overlap {suite}" for suite, k in self.dropped.items() if k)

    def tags(self) -> dict[str, str]:
        """MLflow tags: rows dropped in all and per suite, the n-gram size and the mode."""
        return {
            "decontam.dropped": str(self.total),
            **{f"decontam.{suite}": str(k) for suite, k in self.dropped.items()},
            "decontam.ngram": str(self.ngram),
            "decontam.mode": self.mode,
        }


def _names(names: list[str], last: str) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


def _offenders(prompts: Sequence[str], hits: Mapping[str, list[int]], rows: Sequence[int], split: str) -> str:
    """The first offending rows of `split`, one line each: row number, suites, the prompt cut short."""
    out = []
    for row in rows[:SHOWN]:
        suites = ", ".join(s for s, found in hits.items() if row in found)
        text = " ".join(visible_text(prompts[row]).split())
        cut = text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"
        out.append(f"  - {'train' if split == 'training' else split} row {row} ({suites}): {cut!r}")
    more = len(rows) - SHOWN
    return "\n".join(out + ([f"  ... and {more} more"] if more > 0 else []))


@stage("decontam")
def decontaminate(
    train: Ref,
    suites: dict[str, Ref],
    mode: str,
    ngram: int,
    run_dir: str,
    templates: dict[str, str] | None = None,
    split: str = "training",
    *,
    out: Path,
) -> Decontamination:
    """Compare the training split's prompts with every suite's and, by `mode` (data.decontaminate), drop the rows
    that overlap ('drop': the kept rows written to `out/train.parquet`), stop the run ('error'), or compare
    nothing ('off'). `templates` gives each side's prompt_template (`train` and the suites by name), whose own
    text is taken off its prompts before they are compared. `split` names the rows in messages: "training", or
    "probe" for the probe split (`train` is then the probe's rows), which chooses checkpoints and ends SFT and
    rounds, so a suite's prompt in it would choose by the benchmark."""
    if mode not in MODES:
        raise ValueError(f"data.decontaminate is {mode!r}; use one of {', '.join(MODES)}")
    if mode == "off":
        num_rows = pq.read_metadata(train.require()).num_rows
        return Decontamination(train=train, dropped={}, num_rows=num_rows, ngram=ngram, mode=mode, split=split)
    df = pd.read_parquet(train.require())
    prompts = df["prompt"].tolist()
    hits = _hits(prompts, suites, templates or {}, ngram)
    dropped = {name: len(found) for name, found in hits.items()}
    rows = tuple(sorted({row for found in hits.values() for row in found}))
    result = Decontamination(
        train=train, dropped=dropped, rows=rows, num_rows=len(df), ngram=ngram, mode=mode, split=split
    )
    if not rows:
        logger.info(result.line())
        return result
    _refuse(result, prompts, hits)
    result = result.model_copy(update={"train": _kept(df, rows, out)})
    logger.warning("%s; the first:\n%s", result.line(), _offenders(prompts, hits, rows, split))
    return result


def _hits(
    prompts: Sequence[str], suites: Mapping[str, Ref], templates: Mapping[str, str], ngram: int
) -> dict[str, list[int]]:
    """`contaminated` on what each side asks: every prompt without its side's template (`train`, or the suite's
    name), the suites' prompts read from their files."""
    asked = [question(p, templates.get("train", "{prompt}")) for p in prompts]
    benchmark = {
        name: [question(p, templates.get(name, "{prompt}")) for p in pd.read_parquet(ref.require())["prompt"]]
        for name, ref in suites.items()
    }
    return contaminated(asked, benchmark, ngram)


def _refuse(result: Decontamination, prompts: Sequence[str], hits: Mapping[str, list[int]]) -> None:
    """Stop the run (DataError) when the overlapping rows may not be dropped: mode 'error' asks to stop, and rows
    that all overlap would leave nothing to train on."""
    rows, num_rows, ngram, split = result.rows, result.num_rows, result.ngram, result.split
    if result.mode == "error":
        raise DataError(
            f"{len(rows)} of {num_rows} {split} rows overlap benchmark prompts ({result.overlaps()}; {ngram}-word "
            f"n-grams):\n{_offenders(prompts, hits, rows, split)}\nRemove them from the data source, or set "
            f"data.decontaminate=drop to leave them out of the {split} rows"
        )
    if len(rows) == num_rows:
        raise DataError(
            f"every one of the {num_rows} {split} rows overlaps benchmark prompts ({result.overlaps()}; {ngram}-word "
            f"n-grams), so none is left: are the suites the {split} data itself? Check eval.suites "
            "and the data source, or set data.decontaminate=off"
        )


def _kept(df: pd.DataFrame, rows: Sequence[int], out: Path) -> Ref:
    """The rows of `df` not in `rows` (renumbered from 0), written atomically to `out/train.parquet`."""
    dropped = set(rows)
    kept = df.iloc[[i not in dropped for i in range(len(df))]].reset_index(drop=True)
    with atomic_dir(out) as tmp:
        kept.to_parquet(tmp / "train.parquet", index=False)
    path = out / "train.parquet"
    return Ref(path=str(path), fingerprint=fingerprint_path(path))
