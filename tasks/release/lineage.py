"""Provenance of a registered version: what it was evaluated on and with, and the code and libraries behind it.

The pipeline adds the lineage it knows (parent version or base model, the parent's MLflow run, round, config hash,
training data); these tags add what the evaluation and the environment say, so every version can be traced and
reproduced from its tags alone.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from grpo_pipeline.tasks.core.stage import code_version
from grpo_pipeline.tasks.scoring.results import EvalResult

LIBRARIES = ("torch", "transformers", "trl", "vllm", "peft")
PIPELINE_MODULE = "grpo_pipeline.flows.grpo_pipeline"


def provenance_tags(result: EvalResult) -> dict[str, str]:
    """Eval settings (eval-set fingerprint, n, k, sampling, seed), the pipeline's code version (package version and
    a hash of the source the pipeline runs) and the versions of the training libraries that are installed."""
    tags = {k: str(v) for k, v in result.settings().items()}
    tags["code_version"] = f"{_installed('grpo-pipeline') or 'dev'}+{code_version(PIPELINE_MODULE)[:12]}"
    for name in LIBRARIES:
        found = _installed(name)
        if found is not None:
            tags[f"{name}_version"] = found
    return tags


def _installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None
