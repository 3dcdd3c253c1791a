"""How much does batched generation buy the evaluation? The default recipe's tiny model on the same prompts and
sample counts, two ways, in one run:

  (loop)    one prompt at a time: a greedy call, then a call for its n samples (num_return_sequences=n);
  (batched) `scoring.generation.generate` as the evaluate stage runs it: eval.batch_size sequences a call, left-padded.

Both produce the same number of completions; greedy completions are compared one by one (left padding must not
change them). Each way runs --repeat times, the two ways alternating; the table gives each way's fastest and slowest
run. On a machine shared with other work, single runs of each gave anything from 4.7x to 32.8x (load that comes or
goes between the two ways moves the ratio), so the ratio is taken between the fastest runs, the least disturbed. The
last line is machine-readable: `speedup=<fastest loop seconds / fastest batched seconds>`.

Usage:
  python benchmarks/eval.py                      # 200 problems, n=8 (the default recipe's eval settings), 3 runs each
  python benchmarks/eval.py --problems 500 --n 8 --repeat 5
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from grpo_pipeline.configs.schema import load_config  # noqa: E402
from grpo_pipeline.tasks.scoring.generation import generate  # noqa: E402
from grpo_pipeline.tasks.sources.synthetic import synthetic_arithmetic  # noqa: E402
from grpo_pipeline.tasks.training.tiny_model import build_tiny_model  # noqa: E402
from grpo_pipeline.tasks.training.trainer import load_tokenizer  # noqa: E402


def one_at_a_time(model, tokenizer, prompts: list[str], n: int, max_new_tokens: int, temperature: float):
    greedy, sampled = [], []
    for prompt in prompts:
        greedy += generate(model, tokenizer, [prompt], max_new_tokens=max_new_tokens, batch_size=1)
        sampled += generate(
            model, tokenizer, [prompt], max_new_tokens=max_new_tokens, batch_size=n, n=n, temperature=temperature
        )
    return greedy, sampled


def batched(model, tokenizer, prompts: list[str], n: int, max_new_tokens: int, temperature: float, batch_size: int):
    greedy = generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size)
    sampled = generate(
        model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size, n=n, temperature=temperature
    )
    return greedy, sampled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=200)
    parser.add_argument("--n", type=int, default=None, help="Samples per problem (default: eval.n_samples).")
    parser.add_argument("--repeat", type=int, default=3, help="Runs of each way, alternating (1: one run each).")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    cfg = load_config(REPO / "configs" / "tiny-arith.yaml", [])
    n = args.n or cfg.eval.n_samples
    prompts = synthetic_arithmetic(cfg.data.synthetic, args.problems, seed=1)["prompt"].tolist()
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_model(cfg.model.tiny, Path(tmp) / "tiny", seed=0)
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        tokenizer = load_tokenizer(str(path))
        tokenizer.padding_side = "left"
    settings = (n, cfg.eval.max_new_tokens, cfg.eval.temperature)
    print(
        f"tiny model ({cfg.model.tiny.num_layers} layers, width {cfg.model.tiny.hidden_size}), {len(prompts)} prompts, "
        f"greedy + n={n} samples each, max {cfg.eval.max_new_tokens} new tokens, {torch.get_num_threads()} threads"
    )
    batched(model, tokenizer, prompts[:8], *settings, cfg.eval.batch_size)  # warm-up (allocator, kernels)

    loop_s, batch_s = [], []
    for _ in range(args.repeat):
        start = time.perf_counter()
        loop_greedy, loop_sampled = one_at_a_time(model, tokenizer, prompts, *settings)
        loop_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        batch_greedy, batch_sampled = batched(model, tokenizer, prompts, *settings, cfg.eval.batch_size)
        batch_s.append(time.perf_counter() - start)

    completions = len(prompts) * (1 + n)
    assert sum(map(len, loop_sampled)) == sum(map(len, batch_sampled)) == len(prompts) * n
    same = sum(a == b for a, b in zip(loop_greedy, batch_greedy, strict=True))
    print(f"\n{'way':36} {'fastest s':>10} {'slowest s':>10} {'completions/s':>14}")
    for way, times in (
        ("(loop) one prompt at a time", loop_s),
        (f"(batched) {cfg.eval.batch_size} sequences per call", batch_s),
    ):
        print(f"{way:36} {min(times):10.2f} {max(times):10.2f} {completions / min(times):14.1f}")
    print(f"greedy completions identical in both ways: {same} of {len(prompts)}")
    print(f"runs of each way: {args.repeat}")
    print(f"speedup={min(loop_s) / min(batch_s):.1f}")


if __name__ == "__main__":
    main()
