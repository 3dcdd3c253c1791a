"""Stage prepare_suite: one evaluation suite's problems, loaded, mapped and validated like training data.

A suite (`eval.suites`, configs/eval.py) is a named benchmark: GSM8K's test split, HumanEval's 164 problems, a
synthetic task of another shape than training's. Each is prepared by its own keyed stage, so adding a suite prepares
and scores that suite alone. The `heldout` suite is the held-out split of the training source (prepare_data's
`eval.parquet`) and needs no stage of its own. Rows go through the data contract (tasks/sources/contract.py) before any
policy is scored on them: a suite with a blank prompt or answer, or a prompt twice, stops the run naming the rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grpo_pipeline.configs.eval import HELDOUT, EvalConfig, EvalSuiteConfig
from grpo_pipeline.tasks.core.common import Ref, atomic_dir, fingerprint_path, logger
from grpo_pipeline.tasks.core.stage import stage
from grpo_pipeline.tasks.sources import DataError
from grpo_pipeline.tasks.sources.contract import DataValidationError, validate_frames
from grpo_pipeline.tasks.sources.load import describe_source, load_source, source_content

SUITE_FILE = "suite.parquet"


def _suite_content(params: Mapping[str, Any]) -> dict[str, str]:
    """A local benchmark file is keyed by its content, as training data is."""
    return source_content({"cfg": params["suite"].data_config()})


@stage("suite-{suite.name}", external=_suite_content)
def prepare_suite(suite: EvalSuiteConfig, run_dir: str, *, out: Path) -> Ref:
    """The suite's rows (at most `max_problems`, in the source's order) as `suite.parquet` in `out`."""
    if suite.source == HELDOUT:
        raise ValueError(f"suite {suite.name!r} is the held-out split, which prepare_data writes")
    cfg = suite.data_config()
    origin = f"eval suite {suite.name!r} ({describe_source(cfg)})"
    try:
        rows = load_source(cfg)
    except DataError as e:
        raise DataError(f"{origin}: {e}") from None
    if suite.source == "synthetic":
        rows = rows.head(suite.num_problems)
    if suite.max_problems:
        rows = rows.head(suite.max_problems)
    rows = rows.reset_index(drop=True)
    if rows.empty:
        raise DataError(f"{origin} has no rows to score")
    try:
        validate_frames(rows.iloc[:0], rows, cfg)
    except DataValidationError as e:
        message = str(e).replace("  - eval row", "  - row").replace("no_prompt_in_both_train_and_eval", "")
        raise DataValidationError(f"{origin}: {message}", e.failures) from None
    with atomic_dir(out) as tmp:
        rows.to_parquet(tmp / SUITE_FILE, index=False)
    logger.info("prepared %s: %d rows", origin, len(rows))
    path = out / SUITE_FILE
    return Ref(path=str(path), fingerprint=fingerprint_path(path))


def suite_sources(cfg: EvalConfig, held_out: Ref, prepared: Mapping[str, Ref]) -> dict[str, Ref]:
    """Every suite's rows by name, in the configured order: the held-out split for `heldout` suites, else the
    suite's prepared file."""
    return {name: held_out if cfg.suite(name).source == HELDOUT else prepared[name] for name in cfg.suite_names()}
