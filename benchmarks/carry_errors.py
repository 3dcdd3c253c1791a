"""Where an addition checkpoint of the default recipe is wrong: every two-digit sum (10..99 + 10..99, the 8100 problems
the default's data are drawn from), greedy and sampled.

Printed: greedy accuracy over all 8100; the wrong greedy answers counted by their offset from the sum (-10: the carry
into the tens dropped, +10: one added where none belongs); the greedy errors per pair of units digits (row: the first
operand's units digit, column: the second's; each cell has 81 problems), which shows whether the errors sit at the
carry threshold (units digits summing to about 10); and, from `--samples` samples per problem at temperature 1.0,
the sampled accuracy and how many of the greedy-wrong problems no sample solves (prompts a GRPO group cannot learn
from). This is the analysis behind "Seed 0's first round" in benchmarks/LEARNING.md.

Usage:
  python benchmarks/carry_errors.py RUN_DIR/grpo-round1/<hash>          # a checkpoint folder of a run
  python benchmarks/carry_errors.py RUN_DIR/sft/<hash> --samples 0       # greedy only
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from grpo_pipeline.tasks.scoring.generation import generate  # noqa: E402

PROBLEMS = [(a, b) for a in range(10, 100) for b in range(10, 100)]


def offset_label(answer: str, total: int) -> str:
    """A wrong answer's offset from the sum when it is 10 or 1 either way (-10: a carry into the tens dropped, +10:
    one added where none belongs, -1/+1: the units digit one off), else 'other' (any other offset, or not a number)."""
    offset = int(answer) - total if answer.lstrip("-").isdigit() else None
    return f"{offset:+d}" if offset in (-10, 10, -1, 1) else "other"


def offset_counts(answers: list[str]) -> Counter[str]:
    """The wrong answers among `answers` (one per problem of PROBLEMS) by `offset_label`."""
    return Counter(offset_label(ans, a + b) for (a, b), ans in zip(PROBLEMS, answers, strict=True) if ans != str(a + b))


def units_grid(answers: list[str]) -> list[list[int]]:
    """Wrong answers per (first units digit, second units digit)."""
    grid = [[0] * 10 for _ in range(10)]
    for (a, b), answer in zip(PROBLEMS, answers, strict=True):
        grid[a % 10][b % 10] += answer != str(a + b)
    return grid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="A checkpoint folder (model and tokenizer) of a run.")
    parser.add_argument("--samples", type=int, default=8, help="Samples per problem at T 1.0 (0: greedy only).")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint).eval()
    prompts = [f"{a}+{b}=" for a, b in PROBLEMS]
    greedy = [c[0].strip() for c in generate(model, tokenizer, prompts, max_new_tokens=5, batch_size=512)]
    wrong = [i for i, (a, b) in enumerate(PROBLEMS) if greedy[i] != str(a + b)]
    print(f"{args.checkpoint}: greedy accuracy {1 - len(wrong) / len(PROBLEMS):.3f} on all {len(PROBLEMS)} problems")
    print("wrong greedy answers by offset from the sum:", dict(offset_counts(greedy).most_common()))
    print("greedy errors per pair of units digits (row: first operand's, column: second's; 81 problems a cell):")
    print("    " + " ".join(f"{col:3d}" for col in range(10)))
    for row, cells in enumerate(units_grid(greedy)):
        print(f"{row:3d} " + " ".join(f"{x:3d}" for x in cells))
    if args.samples:
        samples = generate(model, tokenizer, prompts, max_new_tokens=5, batch_size=512, n=args.samples, temperature=1.0)
        solved = [sum(s.strip() == str(a + b) for s in row) for (a, b), row in zip(PROBLEMS, samples, strict=True)]
        print(
            f"sampled accuracy (T 1.0, {args.samples} samples) {sum(solved) / (len(PROBLEMS) * args.samples):.3f}; "
            f"greedy-wrong problems that no sample solves: {sum(solved[i] == 0 for i in wrong)} of {len(wrong)}"
        )


if __name__ == "__main__":
    main()
