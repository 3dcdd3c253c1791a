"""What does vLLM buy GRPO on a GPU, and what does a step of the real recipes cost? Measured on a model with the
shape of Qwen2.5-0.5B (the base of configs/qwen2.5-0.5b-gsm8k.yaml), built here with random weights, so nothing
is downloaded and the numbers depend on the shape only:

  (hf)    rollouts with transformers' `generate` (what GRPO uses without vLLM): tokens/s;
  (vllm)  the same rollouts with vLLM (`LLM.generate`, n samples per prompt): tokens/s;
  (grpo)  GRPO steps as the pipeline configures them (tasks/grpo.trl_grpo_args: bf16, vLLM colocated in the
          training process): seconds per optimizer step (median after warm-up) and peak GPU memory, both as
          PyTorch's allocator in the training process sees it and device-wide (which includes vLLM's share).

Random weights never pick the end-of-text token on purpose, so every completion runs to the token limit: rollouts
have a known length, and the step's memory is the worst case of the recipe's settings. Each part runs in a process
of its own, so one part's memory and vLLM's engine do not leak into the next.

The shape of Qwen2.5-0.5B (its config.json on the hub): hidden 896, 24 layers, 14 query heads and 2 KV heads
(grouped-query attention), MLP 4864, vocabulary 151,936, tied embeddings, 32,768 positions, RoPE theta 1e6, RMSNorm
eps 1e-6; 494,032,768 parameters, the 0.49B the model card gives (tests/test_recipes.py counts them on CPU).

Usage (a CUDA GPU with the `gpu` extra: pip install -e ".[gpu]"):
  python benchmarks/gpu_throughput.py
  python benchmarks/gpu_throughput.py --prompts-per-step 8 --completion-tokens 256 --steps 8
The last line is machine-readable: `vllm_speedup=<vllm tokens/s / hf tokens/s> step_s=<s> peak_gib=<device GiB>`.
On a machine without CUDA it says so and exits 0, having measured nothing.

Per GPU and per node: on a machine with several GPUs the rollouts are also measured on each GPU in turn; with
`--ray ADDRESS` (a cluster's head, or `local`) only the rollouts run, once on every node of the cluster that offers
a GPU (a Ray task of one GPU pinned to the node, which builds the model there), one line per node and a last line
`nodes=<n> hf_tokens_per_s=<min>..<max> vllm_tokens_per_s=<min>..<max>`; the machine running it needs no GPU.
  python benchmarks/gpu_throughput.py --ray HEAD:6379 --completion-tokens 256
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import string
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# Qwen2.5-0.5B's config.json values that set the cost of a step (the rest are Qwen2Config's defaults).
QWEN25_05B: dict[str, Any] = {
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
}
QWEN25_05B_PARAMETERS = 494_032_768
# A small Qwen2 for checks rather than figures (tests/test_gpu.py, benchmarks/gpu_check.py): head_dim 64 (128 / 2
# heads), a size every vLLM attention backend supports; the vocabulary holds the byte tokenizer's 259 tokens.
SMALL_QWEN2: dict[str, Any] = {
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 256,
    "vocab_size": 320,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
}
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # Qwen2.5's: pad, chat turns, end of turn
GIB = 1024**3


# ----------------------------------------------------------------------------- the model, built locally


def build_byte_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer (the kind Qwen2 checkpoints use, so AutoTokenizer and vLLM load it as Qwen2's)
    whose vocabulary fills all `vocab_size` ids: the 256 byte symbols, Qwen's three special tokens, then filler
    tokens `<xN>`. Text encodes one token per byte; every id the model can sample decodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    names = [*symbols, *SPECIAL_TOKENS]
    if vocab_size < len(names):
        raise ValueError(f"vocab_size {vocab_size} is below the {len(names)} byte and special tokens")
    names += [f"<x{i}>" for i in range(len(names), vocab_size)]
    tokenizer = Tokenizer(models.BPE(vocab={name: i for i, name in enumerate(names)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>", padding_side="left"
    )


def build_qwen2(out_dir: str | Path, shape: dict[str, Any], seed: int = 0, dtype: str = "bfloat16") -> Path:
    """Save a randomly initialised Qwen2ForCausalLM of `shape` (Qwen2Config fields) and its tokenizer to `out_dir`,
    as an ordinary Hugging Face directory that transformers, TRL and vLLM load by path."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_byte_tokenizer(shape["vocab_size"])
    config = Qwen2Config(
        **shape,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        use_sliding_window=False,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return Path(out_dir)


def random_prompts(n: int, chars: int, seed: int) -> list[str]:
    """`n` distinct prompts of `chars` lowercase letters and spaces (one token each with the byte tokenizer)."""
    rng = random.Random(seed)
    return ["".join(rng.choice(string.ascii_lowercase + " ") for _ in range(chars)) + f" {i}" for i in range(n)]


# ----------------------------------------------------------------------------- the parts, one process each


def part_hf(model_dir: Path, args: argparse.Namespace) -> dict[str, float]:
    """Rollout tokens/s with transformers' generate: all prompts x n samples in one left-padded batch."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    batch = tokenizer(random_prompts(args.rollout_prompts, args.prompt_tokens, 1), return_tensors="pt", padding=True)
    batch = batch.to("cuda")
    kwargs = {
        "do_sample": True,
        "temperature": 1.0,
        "max_new_tokens": args.completion_tokens,
        "min_new_tokens": args.completion_tokens,
        "num_return_sequences": args.generations,
        "pad_token_id": tokenizer.pad_token_id,
    }
    with torch.inference_mode():
        model.generate(**batch, **{**kwargs, "max_new_tokens": 8, "min_new_tokens": 8})  # warm-up (kernels, cache)
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate(**batch, **kwargs)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    tokens = (out.shape[1] - batch["input_ids"].shape[1]) * out.shape[0]
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def part_vllm(model_dir: Path, args: argparse.Namespace) -> dict[str, float]:
    """Rollout tokens/s with vLLM on the same prompts (as token ids) and sample counts."""
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer(random_prompts(args.rollout_prompts, args.prompt_tokens, 1))["input_ids"]
    llm = LLM(
        model=str(model_dir),
        dtype="bfloat16",
        gpu_memory_utilization=args.vllm_gpu_memory_utilization,
        max_model_len=args.prompt_tokens + args.completion_tokens + 64,
        seed=0,
    )
    params = SamplingParams(
        n=args.generations,
        temperature=1.0,
        max_tokens=args.completion_tokens,
        min_tokens=args.completion_tokens,
        ignore_eos=True,
    )
    prompts = [{"prompt_token_ids": p} for p in ids]
    llm.generate(prompts[:2], SamplingParams(n=2, max_tokens=8), use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


class _DevicePeak:
    """Device-wide GPU memory in use (every process, vLLM's share included), sampled every 20 ms in a thread;
    `peak_gib` is the highest reading above the level at start."""

    def __init__(self) -> None:
        import torch

        free, total = torch.cuda.mem_get_info()
        self.base, self.peak = total - free, total - free
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        import torch

        while not self._stop.wait(0.02):
            free, total = torch.cuda.mem_get_info()
            self.peak = max(self.peak, total - free)

    def __enter__(self) -> _DevicePeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_gib(self) -> float:
        return (self.peak - self.base) / GIB


def step_timer() -> Any:
    """A trainer callback that records each optimizer step's seconds in `.seconds`, the GPU synchronised at both
    ends so that a step's queued kernels count in it."""
    import torch
    from transformers import TrainerCallback

    class StepTimes(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []

        def on_step_begin(self, *_: Any, **__: Any) -> None:
            torch.cuda.synchronize()
            self._start = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            torch.cuda.synchronize()
            self.seconds.append(time.perf_counter() - self._start)

    return StepTimes()


def part_grpo(model_dir: Path, args: argparse.Namespace) -> dict[str, float]:
    """Seconds per GRPO optimizer step and peak memory, with the pipeline's own mapping onto TRL's GRPOConfig."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from grpo_pipeline.configs.schema import GRPOStageConfig, ModelConfig
    from grpo_pipeline.tasks.grpo import trl_grpo_args
    from grpo_pipeline.tasks.training.trainer import precision_args

    cfg = GRPOStageConfig(
        steps_per_round=args.steps,
        prompts_per_step=args.prompts_per_step,
        generations_per_prompt=args.generations,
        max_completion_tokens=args.completion_tokens,
        learning_rate=1e-6,
        use_vllm=not args.no_vllm,
        vllm_gpu_memory_utilization=args.vllm_gpu_memory_utilization,
        log_every_steps=1,
    )
    rng = random.Random(0)

    def noise(prompts: list, completions: list, **_: Any) -> list[float]:
        """A random reward: groups need a spread for a non-zero advantage; its values do not change the cost."""
        return [rng.random() for _ in completions]

    with tempfile.TemporaryDirectory() as scratch:
        common = {
            "output_dir": scratch,
            "save_strategy": "no",
            "report_to": [],
            "seed": 0,
            "dataloader_num_workers": 0,
            **precision_args(ModelConfig(base=str(model_dir), dtype="bfloat16")),
        }
        dataset = Dataset.from_dict(
            {"prompt": random_prompts(args.prompts_per_step * args.steps, args.prompt_tokens, 2)}
        )
        times = step_timer()
        torch.cuda.reset_peak_memory_stats()
        with _DevicePeak() as device:
            trainer = GRPOTrainer(
                model=str(model_dir),
                reward_funcs=[noise],
                args=trl_grpo_args(cfg, common, [1.0]),
                train_dataset=dataset,
                processing_class=AutoTokenizer.from_pretrained(model_dir),
                callbacks=[times],
            )
            trainer.train()
    warm = times.seconds[args.warmup_steps :] or times.seconds
    return {
        "steps": len(times.seconds),
        "step_s": statistics.median(warm),
        "first_step_s": times.seconds[0],
        "torch_peak_gib": torch.cuda.max_memory_reserved() / GIB,
        "device_peak_gib": device.peak_gib,
        "use_vllm": float(trainer.use_vllm),
    }


PARTS = {"hf": part_hf, "vllm": part_vllm, "grpo": part_grpo}


# ----------------------------------------------------------------------------- orchestration


def run_part(
    name: str, model_dir: Path, argv: list[str], work: Path, env: dict[str, str] | None = None
) -> dict[str, float]:
    """Run one part in a fresh process (with `env` added to its environment) and read back its result."""
    result = work / f"{name}.json"
    cmd = [sys.executable, __file__, *argv, "--part", name, "--model-dir", str(model_dir), "--result", str(result)]
    print(f"[{name}] running ...", flush=True)
    subprocess.run(cmd, check=True, env={**os.environ, **(env or {})})
    return json.loads(result.read_text())


# ----------------------------------------------------------------------------- per GPU and per node


def rollouts(model_dir: Path, argv: list[str], work: Path, env: dict[str, str] | None = None) -> dict[str, float]:
    """Rollout tokens/s with generate and (where installed) vLLM on the GPU(s) `env` leaves visible."""
    import importlib.util

    row = {"hf": run_part("hf", model_dir, argv, work, env)["tokens_per_s"], "vllm": float("nan")}
    if importlib.util.find_spec("vllm") is not None:
        row["vllm"] = run_part("vllm", model_dir, argv, work, env)["tokens_per_s"]
    return row


def per_device(model_dir: Path, argv: list[str], work: Path, devices: int) -> list[dict[str, Any]]:
    """The rollouts on each of this machine's GPUs in turn (CUDA_VISIBLE_DEVICES), one row each."""
    import torch

    rows = []
    for i in range(devices):
        row = rollouts(model_dir, argv, work, {"CUDA_VISIBLE_DEVICES": str(i)})
        rows.append({"where": f"gpu {i}", "gpus": torch.cuda.get_device_name(i), **row})
    return rows


def node_rollouts(argv: list[str]) -> dict[str, Any]:
    """One Ray node's row: builds the model in a scratch folder there and measures its rollouts on the GPU Ray
    gave this task (the script's path must be the same on every node: one image or shared storage)."""
    import socket

    import torch

    with tempfile.TemporaryDirectory(prefix="gpu-throughput-node-") as tmp:
        model_dir = build_qwen2(Path(tmp) / "model", QWEN25_05B)
        row = rollouts(model_dir, argv, Path(tmp))
    return {"where": socket.gethostname(), "gpus": torch.cuda.get_device_name(0), **row}


def gpu_nodes(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The live nodes of `ray.nodes()` that offer Ray a GPU."""
    return [n for n in nodes if n["Alive"] and n["Resources"].get("GPU", 0) > 0]


def per_node(address: str, argv: list[str]) -> list[dict[str, Any]]:
    """One Ray task of one GPU per GPU node of the cluster at `address`, pinned to its node; their rows."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=None if address == "local" else address)
    try:
        nodes = gpu_nodes(ray.nodes())
        task = ray.remote(num_gpus=1)(node_rollouts)
        pinned = [
            task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(argv)
            for n in nodes
        ]
        return ray.get(pinned)
    finally:
        ray.shutdown()


def rows_table(rows: list[dict[str, Any]]) -> str:
    """Rollout tokens/s per GPU or node, and a machine-readable last line over them."""
    lines = [f"{'where':24} {'GPU':28} {'hf tokens/s':>12} {'vLLM tokens/s':>14}"]
    lines += [f"{r['where']:24} {r['gpus']:28} {r['hf']:12.0f} {r['vllm']:14.0f}" for r in rows]
    hf, vllm = [r["hf"] for r in rows], [r["vllm"] for r in rows]
    spread = f"hf_tokens_per_s={min(hf):.0f}..{max(hf):.0f} vllm_tokens_per_s={min(vllm):.0f}..{max(vllm):.0f}"
    lines.append(f"nodes={len(rows)} {spread}")
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # Defaults: the shape of a step of configs/qwen2.5-0.5b-gsm8k.yaml (4 prompts x 8 completions of 512 tokens).
    parser.add_argument("--prompts-per-step", type=int, default=4, help="GRPO prompts per optimizer step.")
    parser.add_argument("--generations", type=int, default=8, help="Completions per prompt (GRPO's G).")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="Prompt length (tokens).")
    parser.add_argument("--completion-tokens", type=int, default=512, help="Completion length (tokens).")
    parser.add_argument("--rollout-prompts", type=int, default=32, help="Prompts in the rollout comparison.")
    parser.add_argument("--steps", type=int, default=6, help="GRPO steps timed.")
    parser.add_argument("--warmup-steps", type=int, default=2, help="First steps left out of the median.")
    parser.add_argument("--vllm-gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--no-vllm", action="store_true", help="GRPO steps with transformers' generate instead.")
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="Measure the rollouts on every GPU node of the Ray cluster at ADDRESS (one task pinned to each node), "
        "one line per node, instead of this machine's parts.",
    )
    parser.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main_ray(args: argparse.Namespace, argv: list[str]) -> int:
    """`--ray ADDRESS`: the per-node rollout rows of a cluster (this machine needs no GPU)."""
    rows = per_node(args.ray, argv)  # the parts' processes ignore --ray (they run with --part)
    if not rows:
        print(f"gpu_throughput: no node of the Ray cluster at {args.ray} offers a GPU, so nothing was measured")
        return 0
    print(rows_table(rows))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.ray and not args.part:
        return main_ray(args, argv)
    import torch

    if not torch.cuda.is_available():
        print(
            "gpu_throughput: no CUDA device here (torch.cuda.is_available() is False), so nothing was measured; "
            'run it on a GPU machine with the gpu extra installed (pip install -e ".[gpu]")'
        )
        return 0
    if args.part:  # a child process: one measurement
        args.result.write_text(json.dumps(PARTS[args.part](args.model_dir, args)))
        return 0

    import importlib.util

    has_vllm = importlib.util.find_spec("vllm") is not None
    if not has_vllm:
        print('vllm is not installed (pip install -e ".[gpu]"): rollouts and GRPO steps without it only')
        argv = [*argv, "--no-vllm"]
    with tempfile.TemporaryDirectory(prefix="gpu-throughput-") as tmp:
        work = Path(tmp)
        start = time.perf_counter()
        model_dir = build_qwen2(work / "model", QWEN25_05B)
        print(f"built a random Qwen2.5-0.5B-shaped model in {time.perf_counter() - start:.0f} s ({model_dir})")
        hf = run_part("hf", model_dir, argv, work)
        vllm = run_part("vllm", model_dir, argv, work) if has_vllm else None
        grpo = run_part("grpo", model_dir, argv, work)
        devices = torch.cuda.device_count()
        if devices > 1:  # the same rollouts on each GPU: a slow or throttled one shows up here
            print(f"\nrollouts per GPU of this node:\n{rows_table(per_device(model_dir, argv, work, devices))}")

    device = torch.cuda.get_device_name(0)
    rollouts = f"{args.rollout_prompts} prompts x {args.generations} samples x {args.completion_tokens} tokens"
    print(f"\n{device}, torch {torch.__version__}; rollouts: {rollouts} (prompts of {args.prompt_tokens} tokens)")
    print(f"{'rollouts':40} {'tokens':>9} {'seconds':>8} {'tokens/s':>10}")
    for label, r in (("(hf) transformers generate", hf), ("(vllm) vLLM", vllm)):
        if r is not None:
            print(f"{label:40} {r['tokens']:9.0f} {r['seconds']:8.2f} {r['tokens_per_s']:10.0f}")
    speedup = vllm["tokens_per_s"] / hf["tokens_per_s"] if vllm else float("nan")
    generator = "vLLM colocated" if grpo["use_vllm"] else "transformers generate"
    step = f"{args.prompts_per_step} prompts x {args.generations} completions of {args.completion_tokens} tokens"
    print(f"\nGRPO step ({step}, bf16, rollouts by {generator}):")
    warm = f"median of steps {args.warmup_steps + 1}..{grpo['steps']:.0f}; the first took {grpo['first_step_s']:.2f} s"
    print(f"  {'seconds per step':36} {grpo['step_s']:8.2f}   ({warm})")
    print(f"  {'peak GiB, PyTorch in the trainer':36} {grpo['torch_peak_gib']:8.1f}   (reserved by its allocator)")
    print(f"  {'peak GiB, device-wide':36} {grpo['device_peak_gib']:8.1f}   (vLLM's share included)")
    print(f"vllm_speedup={speedup:.2f} step_s={grpo['step_s']:.2f} peak_gib={grpo['device_peak_gib']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
