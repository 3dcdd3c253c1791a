"""`grpo-pipeline rehearse --config <recipe>`: a real recipe's whole DAG on CPU in a few minutes, to find every error
that does not need a GPU before a GPU is paid for.

What stays the recipe's own: its data source and column mapping (hub data pointed at a local copy with
`data.source=file data.path=...`), its eval suites (a suite's hub dataset read from a local copy of the same columns,
`<run_dir>/rehearsal/local-data/<suite name>.jsonl`, where one is there or the hub cannot give it), prompt format and
system prompt, rewards, evaluation metrics, gate and guards, LoRA adapters, SFT and GRPO objective, number of
processes (at most 2). What changes: the model becomes a tiny one of the
same family (tasks/training/family_model.py: the same architecture class, a byte-level BPE trained on the recipe's
data with the family's special tokens and chat template, the instruct checkpoint's generation defaults); rows, steps
and sequence lengths shrink; runs go to `<run_dir>/rehearsal`, registrations to `<experiment>-rehearsal` and
`<model_name>-rehearsal`, never the recipe's own. What cannot run here is replaced and said so. The run's config
carries all of it (`rehearsal:`), so the summary and the model card say it too.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from grpo_pipeline.configs.algorithm import PolicyLossConfig, vllm_corrections_set
from grpo_pipeline.configs.schema import ConfigError, PipelineConfig, RehearsalConfig, split_metric
from grpo_pipeline.tasks.core.chat import decode_messages
from grpo_pipeline.tasks.core.common import load_tokenizer
from grpo_pipeline.tasks.core.hub import dataset_problem
from grpo_pipeline.tasks.scoring import vllm_generation  # through the modules: tests stand in for CUDA, vllm
from grpo_pipeline.tasks.training import trainer

# The commands import the pipeline's modules inside their bodies, not here: `--help` and the quick commands start
# without loading Prefect, torch or MLflow, and `setup()` applies Prefect's import-time settings first
# (tasks/core/runtime.py).

SUFFIX = "-rehearsal"
# The rehearsal's scale: enough rows for a GRPO batch, a probe and a gate that compares (it needs 10 items); steps
# enough to probe and save twice; completions long enough to hold a tag or a line of code.
ROWS = {"num_train": 32, "num_eval": 16, "num_probe": 4}
PROMPTS_PER_STEP = 2
GRPO = {"steps_per_round": 4, "generations_per_prompt": 4, "max_completion_tokens": 32,
        "probe_problems": 4, "probe_every_steps": 2, "save_every_steps": 2, "log_every_steps": 1}  # fmt: skip
SFT = {"max_steps": 4, "probe_every_steps": 2, "save_every_steps": 2}
SFT_BATCH = 4
EVAL = {"max_problems": 16, "max_new_tokens": 32, "batch_size": 16}
MAX_ROUNDS, MAX_SAMPLES, MAX_PROCESSES = 2, 2, 2
# Local copies of the eval suites' hub datasets: `<run_dir>/rehearsal/local-data/<suite name><suffix>`, a file of the
# hub dataset's columns in any format the data stage reads (tasks/sources/tables.py).
LOCAL_DATA = "local-data"
LOCAL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet", ".csv", ".csv.gz")


def rehearsal_config(cfg: PipelineConfig) -> PipelineConfig:
    """The rehearsal of `cfg`: a tiny model of its family built (once) under `<run_dir>/rehearsal/models`, the
    config shrunk, and `rehearsal:` saying what changed and what could not be rehearsed."""
    if cfg.rehearsal is not None:
        raise ConfigError(f"this config already rehearses {cfg.rehearsal.recipe}; rehearse the recipe itself")
    if cfg.model.base == "tiny":
        raise ConfigError(
            f"{cfg.name} runs on the embedded tiny model, on CPU, as it is: `grpo-pipeline run --config <recipe>`. "
            "rehearse stands in for a hub model (model.base)"
        )
    data = _data_problem(cfg)
    if data:
        raise ConfigError(data)
    copies = _local_copies(cfg)
    spec = cfg.model_dump(mode="json", exclude_unset=True)
    changed: list[str] = []

    def put(path: str, value: Any) -> None:
        """Set `path` (e.g. 'grpo.steps_per_round') in the spec, noting old -> new where it changes."""
        *parents, leaf = path.split(".")
        node, current = spec, cfg
        for part in parents:
            node, current = node.setdefault(part, {}), getattr(current, part)
        old = getattr(current, leaf)
        if old != value:
            node[leaf] = value
            changed.append(f"{path}: {_short(old)} -> {_short(value)}")

    not_rehearsed = _replace_gpu_only(cfg, put)
    model_dir, family = _stand_in(cfg)
    spec.setdefault("model", {})["base"] = str(model_dir)
    changed.append(
        f"model.base: {cfg.model.base} -> a tiny {family} ({model_dir}): the same architecture class and chat "
        "template, a byte-level BPE trained on the recipe's data, random weights"
    )
    _shrink(cfg, put)
    if cfg.eval.suites:
        spec.setdefault("eval", {})["suites"] = _rehearsed_suites(cfg, copies, changed)
    put("name", cfg.name + SUFFIX)
    put("run_dir", str(Path(cfg.run_dir) / "rehearsal"))
    put("registry.experiment", cfg.registry.experiment + SUFFIX)
    put("registry.model_name", cfg.registry.model_name + SUFFIX)
    demonstrated = _tool_demonstrations(cfg, model_dir)
    spec["rehearsal"] = RehearsalConfig(
        recipe=cfg.name, changed=changed, not_rehearsed=not_rehearsed, demonstrated=demonstrated
    ).model_dump()
    try:
        return PipelineConfig.model_validate(spec)
    except ValueError as e:
        raise ConfigError(f"the rehearsal of {cfg.name} is not a valid config ({e}); please report this") from e


def _data_problem(cfg: PipelineConfig) -> str | None:
    problem = dataset_problem(cfg.data)
    if problem is None:
        return None
    return (
        f"{problem}. A rehearsal reads the recipe's own data; point it at a local file of the same columns: "
        "grpo-pipeline rehearse --config <recipe> data.source=file data.path=<file.jsonl|.parquet>"
    )


def local_data_dir(cfg: PipelineConfig) -> Path:
    """Where a rehearsal of `cfg` looks for local copies of its eval suites' hub datasets."""
    return Path(cfg.run_dir) / "rehearsal" / LOCAL_DATA


def _local_copies(cfg: PipelineConfig) -> dict[str, Path]:
    """The local copy of each hub suite's dataset, by suite name: the file named after the suite in the local-data
    folder where there is one; none where the hub (or its cache) can give the dataset. A hub suite with neither is
    an error that lists every such suite and where to put its copy."""

    folder = local_data_dir(cfg)
    copies: dict[str, Path] = {}
    missing = []
    for suite in cfg.eval.suites:
        if suite.source != "hf":
            continue
        found = next((p for p in (folder / f"{suite.name}{s}" for s in LOCAL_SUFFIXES) if p.is_file()), None)
        if found is not None:
            copies[suite.name] = found.resolve()
            continue
        problem = dataset_problem(suite.data_config())
        if problem is not None:
            # the hub's reason, without the fix it gives for data.hf_name (a suite's copy goes in the folder)
            why = problem.partition(" cannot be fetched: ")[2].partition(". Point at a local copy")[0] or problem
            missing.append(f"  - eval.suites[{suite.name}]: {_hub_name(suite)} cannot be fetched: {why}")
    if missing:
        raise ConfigError(
            "a rehearsal scores every eval suite, and these suites' hub datasets cannot be had here:\n"
            + "\n".join(missing)
            + f"\nPut a local copy of each, with the hub dataset's columns, in {folder}/ named after its suite "
            f"(e.g. {folder / (cfg.eval.suites[0].name + '.jsonl')}; {', '.join(LOCAL_SUFFIXES)} are read)"
        )
    return copies


def _hub_name(suite: Any) -> str:
    config = f"config {suite.hf_config!r}, " if suite.hf_config else ""
    return f"{suite.hf_name} ({config}split {suite.hf_split!r})"


def _rehearsed_suites(cfg: PipelineConfig, copies: dict[str, Path], changed: list[str]) -> list[dict[str, Any]]:
    """The recipe's eval suites, each hub dataset with a local copy read from it, and each suite's rows, samples and
    lengths down to the rehearsal's scale (never up); one line in `changed` for every difference."""
    needs_k = _gate_ks(cfg)
    suites = []
    for suite in cfg.eval.suites:
        spec = suite.model_dump(mode="json", exclude_unset=True)
        where = f"eval.suites[{suite.name}]"
        if suite.name in copies:
            for field in ("hf_name", "hf_config", "hf_split"):
                spec.pop(field, None)
            spec |= {"source": "file", "path": str(copies[suite.name])}
            changed.append(f"{where}: {_hub_name(suite)} -> {copies[suite.name]}, a local copy of the same columns")
        scored = cfg.eval.for_suite(suite.name)
        n = min(scored.n_samples, max(MAX_SAMPLES, needs_k.get(suite.name, 1)))
        limits = {
            "max_problems": min(scored.max_problems or EVAL["max_problems"], EVAL["max_problems"]),
            "max_new_tokens": min(scored.max_new_tokens, EVAL["max_new_tokens"]),
            "n_samples": n,
            "k": sorted({k for k in scored.k if k <= n} | {1}),
        }
        for field, value in limits.items():
            spec[field] = value  # the suite's own: what it would take from the shrunk eval section may not fit it
            if value != getattr(scored, field):
                changed.append(f"{where}.{field}: {_short(getattr(scored, field))} -> {_short(value)}")
        suites.append(spec)
    return suites


def _gate_ks(cfg: PipelineConfig) -> dict[str, int]:
    """The largest k that the gating metric and the guards read from each suite (pass_at_<k>, maj_at_<k>)."""
    ks: dict[str, int] = {}
    for metric in [cfg.registry.gating_metric, *cfg.registry.guard]:
        suite, read = split_metric(metric, cfg.eval.suite_names())
        ks[suite] = max(ks.get(suite, 1), read.k or 1)
    return ks


def _replace_gpu_only(cfg: PipelineConfig, put: Any) -> list[str]:
    """Swap what needs CUDA for what runs here; one line each saying what was not rehearsed and what ran instead."""

    lines = []
    if cfg.model.load_in_4bit and not trainer.has_cuda():
        put("model.load_in_4bit", False)
        lines.append("4-bit base weights (model.load_in_4bit) need CUDA and bitsandbytes: rehearsed as LoRA on "
                     "full-precision weights")  # fmt: skip
    if cfg.grpo.use_vllm is not False and not trainer.vllm_available():
        lines.append(_rollouts_here(cfg, put))
    if cfg.eval.backend != "hf" and not vllm_generation.vllm_installed():
        lines.append(f"evaluation through vLLM (eval.backend: {cfg.eval.backend}): vllm is not installed here, so "
                     "transformers' generate evaluated (make test-vllm's environment evaluates through vLLM's CPU "
                     "build)")  # fmt: skip
    if cfg.model.dtype in ("bfloat16", "float16") and not trainer.has_cuda():
        lines.append(f"{cfg.model.dtype} autocast needs CUDA: training computed in float32")
    if cfg.distributed.accelerate_config and not trainer.has_cuda():
        put("distributed.accelerate_config", None)
        lines.append(f"{cfg.distributed.accelerate_config} (GPU processes) needs CUDA: rehearsed as plain data "
                     "parallel on gloo")  # fmt: skip
        if cfg.model.train_precision == "pure" and cfg.model.dtype == "float16" and cfg.model.lora is None:
            # float16 weights train only where DeepSpeed or FSDP keep float32 master weights (configs/schema.py)
            put("model.train_precision", "mixed")
            lines.append("pure float16 training (model.train_precision: pure) needs the master weights that "
                         "DeepSpeed or FSDP keep: rehearsed in mixed precision")  # fmt: skip
    if cfg.distributed.num_processes > MAX_PROCESSES:
        put("distributed.num_processes", MAX_PROCESSES)
    if cfg.monitors.fail_fast or cfg.monitors.sft_not_learned == "error":
        put("monitors.fail_fast", False)
        put("monitors.sft_not_learned", "warn")
        lines.append("fatal health alarms: a model with random weights trips them, so they are reported, never fatal")
    if cfg.grpo.tools or cfg.grpo.environment:
        lines.append(_tools_line(cfg))
    lines.append("memory and speed at the recipe's scale: benchmarks/gpu_throughput.py measures them on a GPU")
    return lines


def _tools_line(cfg: PipelineConfig) -> str:
    """What a rehearsal of a tool recipe runs of its tools: every path (the tools in the prompt, TRL's loop or the text
    one, evaluated episodes), but a stand-in with random weights seldom writes a well-formed call, so its own
    episodes seldom call; the demonstrations (`_tool_demonstrations`) run each built-in tool from a scripted call."""
    tools = ", ".join([*cfg.grpo.tools, *([cfg.grpo.environment] if cfg.grpo.environment else [])])
    return (
        f"tool calls ({tools}): the episodes ran (tools rendered into the prompt, each completion parsed for calls, "
        "evaluation through the same loop), but a stand-in with random weights seldom writes a well-formed call, so "
        "its own episodes seldom called; each built-in tool was run from a scripted first turn instead (rehearsal."
        "demonstrated)"
    )


def _tool_demonstrations(cfg: PipelineConfig, model_dir: Path) -> list[str]:
    """For each of the recipe's built-in tools, one episode on the stand-in whose first turn is a scripted call
    (agents/demonstration.py): parsed, run and answered as in training, then the stand-in's next turn; a line each
    with its calls, failures and result. A user's tool or an environment is named as not demonstrated."""
    if not cfg.grpo.sampling.uses_tools:
        return []
    from transformers import AutoModelForCausalLM

    from grpo_pipeline.agents.demonstration import EXAMPLE_CALLS, demonstrate, first_result, tokens_after_result
    from grpo_pipeline.agents.loops import eval_tool_loop
    from grpo_pipeline.tasks.scoring.episodes import EpisodeGenerator

    tokenizer, model = load_tokenizer(str(model_dir)), AutoModelForCausalLM.from_pretrained(model_dir)
    loop = eval_tool_loop(cfg.grpo.sampling.model_copy(update={"environment": None}), tokenizer)  # the tools alone
    # the later turns greedy, as evaluation generates them
    greedy, stop = EpisodeGenerator(model, tokenizer, loop).turns(max_new_tokens=64, temperature=None, top_p=1.0)
    lines = []
    for name in cfg.grpo.tools:
        if name not in EXAMPLE_CALLS:
            lines.append(f"{name}: not demonstrated (a user's tool: the rehearsal has no arguments to call it with)")
            continue
        episode = demonstrate(greedy, stop, tokenizer, loop, name, cfg.data.system_prompt)
        result = first_result(episode, tokenizer)
        lines.append(f"{name}: a scripted call with {EXAMPLE_CALLS[name]} ran {episode.calls} call(s), "
                     f"{episode.errors} failed, result {result!r}; the stand-in then wrote "
                     f"{tokens_after_result(episode)} tokens")  # fmt: skip
    if cfg.grpo.environment is not None:
        lines.append(f"{cfg.grpo.environment}: not demonstrated (an environment is reset with a training row)")
    return lines


def _rollouts_here(cfg: PipelineConfig, put: Any) -> str:
    """vLLM rollouts without CUDA: colocated on vLLM's CPU build where it is installed, else transformers' generate.
    What only vLLM uses is set back with them (a server, the corrections of vLLM's probabilities, off-policy masking
    that would have no off-policy sample to mask), so that the rehearsal is a valid config of its own."""

    grpo = cfg.grpo
    server = grpo.vllm_mode == "server"
    if server:  # a server takes its weights over NCCL, which needs CUDA (and its own GPU)
        put("grpo.vllm_mode", "colocate")
    if vllm_generation.vllm_installed():
        put("grpo.use_vllm", True)
        return (
            "vLLM rollouts on CUDA: they ran colocated on vLLM's CPU build (its linear layers on live weights, which "
            "take each step's weights in place); "
            + ("the vLLM server (grpo.vllm_mode: server), its weight transfer (NCCL), " if server else "")
            + "CUDA kernels and the GPU memory split were not rehearsed"
        )
    put("grpo.use_vllm", False)
    skipped = [f"the vLLM server (grpo.vllm_mode: server, {_server_address(cfg)})"] if server else []
    if corrections := vllm_corrections_set(grpo):
        for name in corrections:
            put(f"grpo.{name}", PolicyLossConfig.model_fields[name].default)
        skipped.append(f"the correction of vLLM's probabilities ({', '.join(f'grpo.{n}' for n in corrections)})")
    if grpo.off_policy_mask_threshold is not None and not grpo.reuses_rollouts:
        put("grpo.off_policy_mask_threshold", None)
        skipped.append("off-policy masking (grpo.off_policy_mask_threshold), which has no off-policy sample to mask "
                       "when each generation serves one on-policy step")  # fmt: skip
    return (
        "vLLM rollouts (grpo.use_vllm) need CUDA and the vllm package: GRPO generated with transformers' generate "
        "(make test-vllm's environment rehearses them on vLLM's CPU build)"
        + (f"; without vLLM, neither {' nor '.join(skipped)} was rehearsed" if skipped else "")
    )


def _server_address(cfg: PipelineConfig) -> str:
    grpo = cfg.grpo
    return grpo.vllm_server_base_url or f"{grpo.vllm_server_host}:{grpo.vllm_server_port}"


def _shrink(cfg: PipelineConfig, put: Any) -> None:
    """Rows, steps, batches and sequence lengths down to the rehearsal's scale (never up)."""
    processes = min(cfg.distributed.num_processes, MAX_PROCESSES)
    for field, n in ROWS.items():
        have = getattr(cfg.data, field)
        put(f"data.{field}", min(have, n) if have else 0)
    put("grpo.rounds", min(cfg.grpo.rounds, MAX_ROUNDS))
    for field, n in GRPO.items():
        put(f"grpo.{field}", min(getattr(cfg.grpo, field), n))
    # Batch fields are global and split evenly across processes (configs/schema.py checks it).
    put("grpo.prompts_per_step", processes * max(1, min(cfg.grpo.prompts_per_step, PROMPTS_PER_STEP) // processes))
    if cfg.sft.enabled:
        for field, n in SFT.items():
            have = getattr(cfg.sft, field)
            put(f"sft.{field}", n if have < 0 else min(have, n))  # max_steps -1: by epochs
        put("sft.batch_size", processes * max(1, min(cfg.sft.batch_size, SFT_BATCH) // processes))
        put("sft.stop_at_accuracy", None)
    put("eval.max_problems", min(cfg.eval.max_problems or EVAL["max_problems"], EVAL["max_problems"]))
    for field in ("max_new_tokens", "batch_size"):
        put(f"eval.{field}", min(getattr(cfg.eval, field), EVAL[field]))
    gate_k = max(_gate_ks(cfg).values())  # a suite without k of its own reads the eval section's
    n = min(cfg.eval.n_samples, max(MAX_SAMPLES, gate_k))
    put("eval.n_samples", n)
    put("eval.k", sorted({k for k in cfg.eval.k if k <= n} | {1}))


def _stand_in(cfg: PipelineConfig) -> tuple[Path, str]:
    """The tiny model of `cfg.model.base`'s family, built once per base, data and seed."""
    from grpo_pipeline.tasks.data import load_source
    from grpo_pipeline.tasks.training.family_model import build_family_model, family_of

    family = family_of(cfg.model.base)
    texts = _texts(load_source(cfg.data), cfg.data.system_prompt)
    digest = hashlib.sha256(json.dumps([cfg.model.base, cfg.seed, texts]).encode()).hexdigest()[:12]
    out = Path(cfg.run_dir) / "rehearsal" / "models" / f"{family.model_type}-{digest}"
    if not (out / "config.json").is_file():
        build_family_model(cfg.model.base, texts, out, cfg.seed)
    return out, family.architecture


def _texts(df: Any, system_prompt: str | None) -> list[str]:
    """Every text the recipe's data holds (chat prompts by their messages' contents): the tokenizer's corpus."""

    texts = [system_prompt] if system_prompt else []
    for column in ("prompt", "answer", "completion"):
        for value in df.get(column, []):
            if not isinstance(value, str):
                continue
            messages = decode_messages(value) if column == "prompt" else None
            texts += [str(m["content"]) for m in messages] if messages else [value]
    return texts


def _short(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, list | dict) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."
