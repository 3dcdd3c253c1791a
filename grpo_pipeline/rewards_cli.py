"""`grpo-pipeline rewards ...`: try rewards on your own completions before training."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from grpo_pipeline.configs.schema import ConfigError, load_config
from grpo_pipeline.rewards import build_reward
from grpo_pipeline.rewards.registry import DEFAULT_TIMEOUT_S, RewardError
from grpo_pipeline.tasks.core.runtime import setup

# The commands import the pipeline's modules inside their bodies, not here: `--help` and the quick commands start
# without loading Prefect, torch or MLflow, and `setup()` applies Prefect's import-time settings first
# (tasks/core/runtime.py).

if TYPE_CHECKING:  # the reward modules import their libraries; load them only when a command needs them
    from grpo_pipeline.rewards.registry import RewardFn

rewards_app = typer.Typer(help="Score completions with rewards, outside training.", no_args_is_help=True)
console = Console(stderr=True)


def _read_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open() as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise typer.BadParameter(f"{path}:{line_no}: not valid JSON ({e})", param_hint="--input") from None
            if not isinstance(row, dict) or "completion" not in row:
                raise typer.BadParameter(
                    f"{path}:{line_no}: a row must be an object with a 'completion' field", param_hint="--input"
                )
            rows.append(row)
    if not rows:
        raise typer.BadParameter(f"{path} has no rows", param_hint="--input")
    return rows


def summarize(scores: list[float | None]) -> dict[str, float | int | None]:
    """mean/std/min/max over the scored rows (None = not applicable is left out), and how many were None."""
    values = [s for s in scores if s is not None]
    if not values:
        return {"n": 0, "none": len(scores), "mean": None, "std": None, "min": None, "max": None}
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return {
        "n": len(values),
        "none": len(scores) - len(values),
        "mean": mean,
        "std": std,
        "min": min(values),
        "max": max(values),
    }


@rewards_app.command("score")
def score(
    input: Annotated[
        Path,
        typer.Option(
            "--input",
            "-i",
            exists=True,
            dir_okay=False,
            help="JSONL rows: prompt, completion, plus the columns rewards need "
            "(answer, test, entry_point, test_list, ...).",
        ),
    ],
    config: Annotated[Path | None, typer.Option("--config", "-c", help="Recipe whose grpo.rewards to use.")] = None,
    rewards: Annotated[
        str | None,
        typer.Option(
            "--rewards", "-r", help="Comma-separated reward names or pkg.module:fn paths, with default params."
        ),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write each row back with one field per reward score (JSONL).")
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    """Score every row with every reward; print per-reward mean/std/min/max."""
    if (config is None) == (rewards is None):
        raise typer.BadParameter("give exactly one of --config and --rewards")
    fns = _build_rewards(config, rewards, verbose)
    rows = _read_rows(input)
    table = _score_rows(fns, rows, input)
    if output is not None:
        with output.open("w") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
        console.print(f"wrote {len(rows)} scored rows to {output}")
    Console().print(table)


def _build_rewards(config: Path | None, names: str | None, verbose: bool) -> list[RewardFn]:
    """The rewards of a recipe (with its params) or of a comma-separated list of names (default params)."""

    if config is not None:
        try:
            cfg = load_config(config)
        except ConfigError as e:
            console.print(f"[red]error:[/red] {e}")
            raise typer.Exit(2) from None
        setup(cfg, verbose=verbose)
        specs = [(s.name, dict(s.params), s.timeout_s) for s in cfg.grpo.rewards]
    else:
        setup(verbose=verbose)
        specs = [(name.strip(), {}, DEFAULT_TIMEOUT_S) for name in (names or "").split(",") if name.strip()]
    try:
        return [build_reward(name, params, timeout_s) for name, params, timeout_s in specs]
    except RewardError as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from None


def _score_rows(fns: list[RewardFn], rows: list[dict[str, Any]], origin: Path) -> Table:
    """Add one field per reward to every row; return the table of per-reward statistics."""
    prompts = [r.get("prompt") for r in rows]
    completions = [r["completion"] for r in rows]
    keys = sorted({k for r in rows for k in r} - {"prompt", "completion"})
    columns = {k: [r.get(k) for r in rows] for k in keys}
    table = Table(title=f"rewards on {origin} ({len(rows)} rows)")
    for col in ("reward", "scored", "None", "mean", "std", "min", "max"):
        table.add_column(col, justify="left" if col == "reward" else "right")
    fields: list[str] = []
    for fn in fns:
        field = fn.__name__
        while field in fields or field in rows[0]:
            field = f"{field}_"
        fields.append(field)
        with console.status(f"scoring {field}"):
            try:
                scores = fn(prompts=prompts, completions=completions, **columns)
            except (TypeError, ValueError, KeyError) as e:  # e.g. a column the reward needs is missing
                console.print(f"[red]error:[/red] reward {field!r} failed on {origin}: {type(e).__name__}: {e}")
                raise typer.Exit(1) from None
        for row, s in zip(rows, scores, strict=True):
            row[field] = s
        _explain_nones(field, fn, rows, scores)
        st = summarize(scores)
        cells = ("-" if st[k] is None else f"{st[k]:.4f}" for k in ("mean", "std", "min", "max"))
        table.add_row(field, str(st["n"]), str(st["none"]), *cells)
    return table


def _explain_nones(field: str, fn: RewardFn, rows: list[dict[str, Any]], scores: list[float | None]) -> None:
    """Why rows scored None, where the reward says (`fn.none_reasons`, one entry per row): printed once per reason
    with its count, and kept beside the score as `<field>_why`."""
    reasons = getattr(fn, "none_reasons", None)
    if not isinstance(reasons, list) or len(reasons) != len(scores):
        return
    counts: dict[str, int] = {}
    for row, score, why in zip(rows, scores, reasons, strict=True):
        if score is None and why:
            row[f"{field}_why"] = why
            counts[why] = counts.get(why, 0) + 1
    for why, n in counts.items():
        console.print(f"[yellow]{field}: {n} row(s) scored None[/yellow]: {why}")
