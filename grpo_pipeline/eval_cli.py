"""`grpo-pipeline eval`: score any checkpoint or registered version on a recipe's eval split or a benchmark file,
outside the pipeline, optionally against another model on the same items (paired bootstrap CI).

Each model's per-item scores go to their own directory under `<run dir>/eval/`, keyed by the model's identity, the
eval data's fingerprint and the eval settings: a later evaluation of another model never writes over the items an
earlier report points to, and `--compare` reads the items of the model it names."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from grpo_pipeline.configs.metrics import Metric
from grpo_pipeline.configs.schema import ConfigError, EvalConfig, load_config
from grpo_pipeline.rewards.registry import RewardError
from grpo_pipeline.tasks.core.common import Ref, atomic_dir, fingerprint_path
from grpo_pipeline.tasks.core.runtime import setup
from grpo_pipeline.tasks.core.tracking import REGISTRY_PREFIX
from grpo_pipeline.tasks.release.registered import fetch_registered, resolve_registered
from grpo_pipeline.tasks.sources import DataError

# The commands import the pipeline's modules inside their bodies, not here: `--help` and the quick commands start
# without loading Prefect, torch or MLflow, and `setup()` applies Prefect's import-time settings first
# (tasks/core/runtime.py).

if TYPE_CHECKING:
    from grpo_pipeline.tasks.core.common import Ref
    from grpo_pipeline.tasks.scoring.results import EvalResult

console = Console(stderr=True)
RECIPE_SUFFIXES = (".yaml", ".yml")


def _fail(message: str) -> typer.Exit:
    console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    return typer.Exit(2)


def resolve_model(spec: str, run_dir: Path) -> str:
    """A local directory as it is; `models:/<name>@<alias>` or `models:/<name>/<version>` fetched from MLflow (once
    per version, under the run directory); anything else is passed to `from_pretrained` as a hub name."""

    if spec.startswith(REGISTRY_PREFIX):
        version = resolve_registered(spec, str(run_dir))
        out = run_dir.resolve() / "eval-models" / f"{version.name}-v{version.version}"
        if not (out / "config.json").exists():
            fetch_registered(version, str(run_dir), out)
        console.print(f"{spec} is version {version.version} of {version.name} -> {out}")
        return str(out)
    path = Path(spec).expanduser()
    if path.exists() and not (path / "config.json").exists():
        raise _fail(f"--model {spec} is a path without config.json; is it a saved Hugging Face model?")
    if not path.exists() and spec.startswith(("/", ".", "~")):
        raise _fail(f"--model {spec} does not exist; give a model directory, models:/<name>@<alias> or a hub name")
    return str(path.resolve()) if path.exists() else spec


def eval_split(data: Path, fmt: str, limit: int | None, run_dir: Path) -> tuple[Ref, EvalConfig, str]:
    """The eval rows (a Ref to Parquet), the eval settings and a description: a recipe's held-out split with its
    `eval` section, or a benchmark file mapped by its format with default settings."""
    from grpo_pipeline.tasks.data import prepare_data

    if data.suffix in RECIPE_SUFFIXES:
        cfg = load_config(data, [f"run_dir={run_dir}"])
        setup(cfg)
        held_out = prepare_data(cfg.data, cfg.run_dir).eval
        return held_out, cfg.eval, f"recipe {cfg.name}, held-out split"
    from grpo_pipeline.tasks.scoring.formats import correctness_reward_for, load_eval_rows

    rows, found = load_eval_rows(data, fmt, limit=limit)
    digest = fingerprint_path(data)[:12]
    out = run_dir.resolve() / "eval-data" / f"{data.name}-{found}-{limit or 'all'}-{digest}"
    if not (out / "eval.parquet").exists():
        with atomic_dir(out) as tmp:
            rows.to_parquet(tmp / "eval.parquet", index=False)
    held_out = Ref(path=str(out / "eval.parquet"), fingerprint=fingerprint_path(out / "eval.parquet"))
    settings = EvalConfig(n_samples=10, k=[1, 5, 10], correctness_reward=correctness_reward_for(found))
    return held_out, settings, f"{data} ({found}, {len(rows)} rows)"


def model_identity(model_path: str) -> str:
    """What names one model's weights: a local directory by its resolved path and the names, sizes and modification
    times of its files (rewritten weights are another model; reading them all to hash would take longer), anything
    else (a hub name) by its name."""
    path = Path(model_path)
    if not path.is_dir():
        return model_path
    files = sorted(p for p in path.rglob("*") if p.is_file())
    stats = [(str(f.relative_to(path)), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    return json.dumps([str(path.resolve()), stats])


def items_dir(run_dir: Path, model_path: str, held_out: Ref, cfg: EvalConfig, seed: int) -> Path:
    """Where a model's per-item scores go: `<run dir>/eval/<model name>-<key>`, the key a hash of the model's
    identity, the eval data's fingerprint, the eval settings and the seed."""
    key = {"model": model_identity(model_path), "data": held_out.fingerprint, "eval": cfg.model_dump(mode="json")}
    digest = hashlib.sha256(json.dumps({**key, "seed": seed}, sort_keys=True).encode()).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(model_path).name or model_path).strip("-.")[:48] or "model"
    return run_dir.resolve() / "eval" / f"{name}-{digest}"


def compare(ours: EvalResult, theirs: EvalResult, seed: int) -> dict[str, dict[str, float]]:
    """For each metric with per-item scores: both means and the paired bootstrap CI of (ours - theirs) over the items
    both models have a score for (`n`; an item unscored for either is left out). Tool-use statistics (`tools/*`) have
    no per-item scores and are left out."""
    from grpo_pipeline.tasks.release.gate import item_metric
    from grpo_pipeline.tasks.scoring.metrics import paired_bootstrap_ci

    a, b = ours.items(), theirs.items()
    out: dict[str, dict[str, float]] = {}
    for metric in filter(None, map(Metric.read, ours.metrics())):
        mine = item_metric(a, metric)
        other = item_metric(b, metric).reindex(mine.index)
        both = mine.notna() & other.notna()
        if not both.any():
            continue
        mine, other = mine[both], other[both]
        delta, low, high = paired_bootstrap_ci(other.tolist(), mine.tolist(), seed=seed)
        out[metric.name] = {
            "model": mine.mean(), "other": other.mean(), "delta": delta, "ci_low": low, "ci_high": high,
            "n": int(both.sum()),
        }  # fmt: skip
    return out


def _table(result: EvalResult, title: str) -> Table:
    """Each metric, over how many items it was computed, and how many it could not score."""
    caption = result.unscored_line() or f"every completion scored by {result.config.correctness_reward.name!r}"
    table = Table(title=title, caption=escape(caption))
    for col in ("metric", "value", "items scored", "unscored"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for name, value in result.metrics().items():
        shown = f"{value:.4f}"
        if name == "accuracy":
            shown += f"  [{result.accuracy_ci[0]:.4f}, {result.accuracy_ci[1]:.4f}]"
        unscored = result.unscored.get(name, 0)
        table.add_row(name, shown, f"{result.scored(name)}/{result.num_problems}", str(unscored))
    return table


def _comparison_table(diff: dict[str, dict[str, float]], other: str) -> Table:
    table = Table(title=f"against {other} (same items, scored for both; paired bootstrap 95% CI)")
    for col in ("metric", "this model", "other", "difference", "95% CI", "n"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for name, d in diff.items():
        ci = f"[{d['ci_low']:+.4f}, {d['ci_high']:+.4f}]"
        table.add_row(name, f"{d['model']:.4f}", f"{d['other']:.4f}", f"{d['delta']:+.4f}", ci, str(d["n"]))
    return table


ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="A model directory, models:/<name>@<alias> or models:/<name>/<version>.")
]
DataOpt = Annotated[
    Path,
    typer.Option(
        "--data",
        "-d",
        help="A recipe (its held-out split and eval settings) or a benchmark file (jsonl[.gz], parquet, json, csv).",
    ),
]
FormatOpt = Annotated[
    str,
    typer.Option(
        "--format",
        help="Benchmark file format: auto (detected from the columns) or a format's name (a wrong one lists them).",
    ),
]
CompareOpt = Annotated[
    str | None,
    typer.Option("--compare", help="Also score this model on the same items and report the paired difference."),
]
RunDirOpt = Annotated[
    Path, typer.Option("--run-dir", help="Where fetched models, eval data and per-item scores are kept.")
]


def eval_command(
    model: ModelOpt,
    data: DataOpt,
    n: Annotated[int | None, typer.Option("--n", help="Samples per item for pass@k and maj@k.")] = None,
    k: Annotated[str | None, typer.Option("--k", help="Comma-separated k values, e.g. 1,5,10 (each <= n).")] = None,
    fmt: FormatOpt = "auto",
    limit: Annotated[int | None, typer.Option("--limit", help="Score only the first N items.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option("--max-new-tokens", help="Longest completion (tokens).")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the report as JSON here.")] = None,
    compare_with: CompareOpt = None,
    run_dir: RunDirOpt = Path("runs/eval"),
    seed: Annotated[int, typer.Option("--seed", help="Sampling seed.")] = 0,
    max_unscored: Annotated[
        float | None,
        typer.Option(
            "--max-unscored-fraction",
            help="Largest share of completions the correctness reward may leave unscored (eval.max_unscored_fraction).",
        ),
    ] = None,
) -> None:
    """Evaluate a checkpoint or registered version: greedy accuracy (95% CI), pass@k, maj@k."""
    from grpo_pipeline.tasks.scoring.evaluation import evaluate_model

    setup()
    try:
        held_out, cfg, described = eval_split(data, fmt, limit, run_dir)
        cfg = _with_options(cfg, n, k, max_new_tokens, limit if data.suffix in RECIPE_SUFFIXES else None, max_unscored)
        models = {"model": resolve_model(model, run_dir)}
        if compare_with:
            models["other"] = resolve_model(compare_with, run_dir)
    except (ConfigError, DataError, FileNotFoundError, ValueError) as e:
        raise _fail(str(e)) from None
    console.print(f"evaluating {model} on {described}")
    results = {}
    for role, path in models.items():
        out = items_dir(run_dir, path, held_out, cfg, seed)
        try:
            results[role] = evaluate_model(path, held_out, cfg, seed=seed, out=out, label=role)
        except RewardError as e:  # a reward that cannot be built, or too many completions left unscored
            raise _fail(str(e)) from None
    console.print(_table(results["model"], f"{model} on {described}"))
    scores = results["model"].model_dump(mode="json")
    report: dict[str, Any] = {**scores, "model": model, "model_path": scores["model"], "data": str(data)}
    if compare_with:
        diff = compare(results["model"], results["other"], seed)
        console.print(_comparison_table(diff, compare_with))
        other = results["other"]
        report["compare"] = {
            "model": compare_with, "model_path": other.model, "items_path": other.items_path,
            "unscored": other.unscored, "unscored_completions": other.unscored_completions, "metrics": diff,
        }  # fmt: skip
    if output:
        output.write_text(json.dumps(report, indent=2))
        console.print(f"report written to {output}")


def _with_options(
    cfg: EvalConfig,
    n: int | None,
    k: str | None,
    max_new_tokens: int | None,
    limit: int | None,
    max_unscored: float | None = None,
) -> EvalConfig:
    updates: dict[str, Any] = {} if max_unscored is None else {"max_unscored_fraction": max_unscored}
    if n is not None:
        updates["n_samples"] = n
        # a generation batch holds at least one whole group of n samples
        updates["batch_size"] = max(cfg.batch_size, n)
    if k is not None:
        try:
            updates["k"] = [int(x) for x in k.split(",") if x.strip()]
        except ValueError:
            raise ConfigError(f"--k {k!r} is not a comma-separated list of integers, e.g. 1,5,10") from None
    elif n is not None:
        updates["k"] = sorted({1, n, *(x for x in (5, 10) if x <= n)})
    if max_new_tokens is not None:
        updates["max_new_tokens"] = max_new_tokens
    if limit is not None:
        updates["max_problems"] = limit
    try:
        return EvalConfig.model_validate({**cfg.model_dump(), **updates})
    except Exception as e:
        raise ConfigError(f"eval options: {e}") from None
