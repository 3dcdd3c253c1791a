"""Evaluation's generation through transformers' `generate` and through vLLM, side by side in one run, on the same
checkpoint, prompts and sampling settings: what `eval.backend` changes. Runs in the vLLM environment
(`make test-vllm` builds .venv-vllm; on a GPU machine, the `gpu` extra):

  .venv-vllm/bin/python benchmarks/generation.py                         # the embedded tiny model, CPU
  .venv-vllm/bin/python benchmarks/generation.py --model /path/to/Qwen2.5-0.5B-Instruct --chat --max-new-tokens 256

For each backend: the time to get ready (load the model; vLLM also builds its engine), then greedy and sampled
generation timed apart, in generated tokens per second; then the ratios and how many greedy completions agree.
The last line is machine-readable: `greedy_speedup=<hf s / vllm s> sampled_speedup=<...> greedy_agree=<fraction>`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# The results are this script's stdout, its last line the figures; vLLM's log (stdout by default) goes to stderr.
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")

from grpo_pipeline.configs.schema import load_config  # noqa: E402
from grpo_pipeline.tasks.scoring.generation import generate_with_ids  # noqa: E402
from grpo_pipeline.tasks.scoring.vllm_generation import VLLMGenerator  # noqa: E402
from grpo_pipeline.tasks.sources.synthetic import synthetic_arithmetic  # noqa: E402
from grpo_pipeline.tasks.training.tiny_model import build_tiny_model  # noqa: E402
from grpo_pipeline.tasks.training.trainer import load_tokenizer  # noqa: E402


def prompts_for(args: argparse.Namespace) -> list[str]:
    if args.chat:
        question = "Natalia sold clips to {} of her friends in April, and then she sold half as many in May. How many?"
        return [json.dumps([{"role": "user", "content": question.format(i)}]) for i in range(args.problems)]
    cfg = load_config(None).data.synthetic
    return synthetic_arithmetic(cfg, args.problems, seed=0)["prompt"].tolist()


def timed(fn, **kw) -> tuple[float, list[list[str]], int]:
    start = time.perf_counter()
    texts, ids = fn(**kw)
    return time.perf_counter() - start, texts, sum(len(c) for per in ids for c in per)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a checkpoint directory (default: the embedded tiny model, built here)")
    parser.add_argument("--chat", action="store_true", help="chat prompts (the model's template)")
    parser.add_argument("--problems", type=int, default=256)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=256, help="transformers' sequences per call (eval's)")
    args = parser.parse_args()

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = args.model or str(build_tiny_model(load_config(None).model.tiny, Path(tempfile.mkdtemp()) / "tiny", 0))
    tokenizer = load_tokenizer(path)
    tokenizer.padding_side = "left"
    prompts = prompts_for(args)
    common = {"prompts": prompts, "max_new_tokens": args.max_new_tokens}
    sampled = {"n": args.n, "temperature": 1.0, "top_p": 1.0}
    device = "cuda" if torch.cuda.is_available() else "cpu"

    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path).to(device).eval()
    hf_ready = time.perf_counter() - start

    def hf(**kw):
        return generate_with_ids(model, tokenizer, batch_size=args.batch_size, **kw)

    hf_greedy = timed(hf, **common)
    hf_sampled = timed(hf, **common, **sampled)

    start = time.perf_counter()
    engine = VLLMGenerator(
        path, tokenizer, seed=0, max_len=min(AutoConfig.from_pretrained(path).max_position_embeddings, 4096)
    )
    vllm_ready = time.perf_counter() - start
    vllm_greedy = timed(engine.generate_with_ids, **common)
    vllm_sampled = timed(engine.generate_with_ids, **common, **sampled)

    agree = sum(a == b for a, b in zip(hf_greedy[1], vllm_greedy[1], strict=True)) / len(prompts)
    print(f"\n{path} on {device}: {len(prompts)} prompts, greedy + n={args.n} samples, ", end="")
    print(f"max_new_tokens={args.max_new_tokens}")
    print(f"{'':24}{'transformers':>14}{'vLLM':>14}{'ratio':>8}")
    print(f"{'ready (s)':24}{hf_ready:14.1f}{vllm_ready:14.1f}")
    rows = [("greedy", hf_greedy, vllm_greedy), (f"sampled (n={args.n})", hf_sampled, vllm_sampled)]
    for name, (hs, _, ht), (vs, _, vt) in rows:
        print(f"{name + ' (s)':24}{hs:14.2f}{vs:14.2f}{hs / vs:8.2f}")
        print(f"{name + ' (tokens/s)':24}{ht / hs:14.0f}{vt / vs:14.0f}")
    print(f"greedy completions that agree: {agree:.3f}")
    print(f"greedy_speedup={hf_greedy[0] / vllm_greedy[0]:.2f} sampled_speedup={hf_sampled[0] / vllm_sampled[0]:.2f} "
          f"greedy_agree={agree:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
