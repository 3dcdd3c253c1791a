"""Can the Hugging Face hub models and datasets a recipe names be had here? Asked once, before anything runs.

A recipe such as configs/qwen2.5-0.5b-gsm8k.yaml names `model.base: Qwen/Qwen2.5-0.5B-Instruct` and
`data.hf_name: openai/gsm8k`. Left to the libraries, a machine without the hub fails late and slowly: the data
stage first (after Prefect's server has started), through huggingface_hub's five retries with backoff (about 25 s
per file when DNS fails), with an error that says neither which config field to change nor how to use a local copy.
So the preflight (tasks/preflight.check_config) asks here first, in about a second:

  - offline (`HF_HUB_OFFLINE=1`) or the hub unreachable (one HEAD request, no retries): the model or dataset must be
    in the local Hugging Face cache, which is looked at without the network;
  - online: one metadata request each, which also catches a misspelt or gated name.

Each problem is one line that names the field, the model or dataset, why, and how to point at a local copy.
"""

from __future__ import annotations

import os
from pathlib import Path

from grpo_pipeline.configs.schema import DataConfig
from grpo_pipeline.tasks.core.tracking import REGISTRY_PREFIX

# One HEAD request to the hub's endpoint; a refused or unresolved connection answers at once, a black hole after this.
HEAD_TIMEOUT_S = 3.0


def offline() -> bool:
    """Whether HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE / HF_DATASETS_OFFLINE) forbids the hub to this process."""
    from huggingface_hub import constants

    flags = (os.environ.get("HF_DATASETS_OFFLINE") or "").upper() in {"1", "ON", "YES", "TRUE"}
    return constants.is_offline_mode() or flags


def why_unreachable() -> str | None:
    """Why the hub's endpoint (HF_ENDPOINT) cannot be reached from here, or None when it answers (any status)."""
    import httpx
    from huggingface_hub import constants

    try:
        httpx.head(constants.ENDPOINT, timeout=HEAD_TIMEOUT_S)
    except httpx.HTTPError as e:
        return f"the hub ({constants.ENDPOINT}) cannot be reached from here ({type(e).__name__}: {e})"
    return None


def _why_not(kind: str, name: str) -> str | None:
    """Why the hub `kind` ('model' or 'dataset') `name` cannot be fetched, or None when it can (or is cached)."""
    from huggingface_hub import HfApi, constants

    cached = _in_cache(kind, name)
    if offline():
        return None if cached else "HF_HUB_OFFLINE is set and it is not in the local Hugging Face cache"
    why = why_unreachable()
    if why is not None:
        return None if cached else f"{why}, and it is not in the local Hugging Face cache"
    api = HfApi()
    info = api.model_info if kind == "model" else api.dataset_info
    try:
        info(name, timeout=10)
    except Exception as e:  # not found, gated, a server error: the hub's own words say which
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"the hub at {constants.ENDPOINT} answered {type(e).__name__}: {message}"
    return None


def _in_cache(kind: str, name: str) -> bool:
    """Whether a copy of the hub model / dataset `name` is in the local cache (looked at without the network)."""
    from huggingface_hub import constants, try_to_load_from_cache

    if kind == "model":
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    import datasets

    # `datasets` keeps the raw files in the hub cache and the prepared Arrow tables under its own cache.
    hub_copy = Path(constants.HF_HUB_CACHE) / f"datasets--{name.replace('/', '--')}"
    prepared = Path(datasets.config.HF_DATASETS_CACHE) / name.replace("/", "___")
    return hub_copy.is_dir() or prepared.is_dir()


def model_problem(base: str) -> str | None:
    """One line saying why `model.base` (a hub name) cannot be fetched and how to use a local copy, or None."""
    if base == "tiny" or base.startswith(REGISTRY_PREFIX) or looks_local(base):
        return None
    why = _why_not("model", base)
    if why is None:
        return None
    return (
        f"model.base {base!r} cannot be fetched: {why}. Point at a local copy: model.base=/path/to/model_dir "
        f"(`hf download {base} --local-dir /path/to/model_dir` where the hub is reachable), or fill the cache "
        "with hub access first"
    )


def dataset_problem(cfg: DataConfig) -> str | None:
    """One line saying why `data.hf_name` (a hub dataset) cannot be fetched and how to use a local copy, or None."""
    name = cfg.hf_name
    if cfg.source != "hf" or not name or Path(name).exists():
        return None
    why = _why_not("dataset", name)
    if why is None:
        return None
    config = f" (config {cfg.hf_config!r})" if cfg.hf_config else ""
    return f"data.hf_name {name!r}{config} cannot be fetched: {why}. {dataset_fix(name, cfg.hf_config)}"


def looks_local(base: str) -> bool:
    """Whether `model.base` names a directory on this machine rather than a hub model: a hub name is `name` or
    `org/name` (one slash at most, never a leading `/`, `.` or `~`)."""
    return not base.startswith(REGISTRY_PREFIX) and (
        base.startswith(("/", ".", "~")) or base.count("/") > 1 or "\\" in base or Path(base).exists()
    )


def check_base_path(base: str) -> None:
    """Raise FileNotFoundError when `model.base` is a local path that is not a saved Hugging Face model directory.

    Without this a missing directory would be taken for a hub name and fail only when SFT loads it."""
    if base == "tiny" or not looks_local(base):
        return
    local = Path(base)
    if not local.is_dir():
        raise FileNotFoundError(
            f"model.base {base!r} does not exist (or is not a directory); set model.base to the directory of a saved "
            "Hugging Face model (config.json, weights, tokenizer), 'tiny', a hub name or models:/<name>@<alias>"
        )
    if not (local / "config.json").exists():
        raise FileNotFoundError(
            f"model.base {base!r} is a directory without config.json; point it at a model saved with "
            "save_pretrained (model and tokenizer)"
        )


def dataset_fix(name: str, config_name: str | None) -> str:
    """How to give the pipeline a local copy of the hub dataset `name` (for errors when it cannot be fetched)."""
    args = ", ".join(repr(a) for a in (name, config_name) if a)
    return (
        f"Point at a local copy: data.hf_name=/path/to/dataset_dir (saved with `datasets.load_dataset({args})"
        ".save_to_disk('/path/to/dataset_dir')` where the hub is reachable), or fill the cache with hub access first"
    )
