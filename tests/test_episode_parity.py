"""The evaluation's episode loop against TRL's own: GRPOTrainer (built from the recipe's tools as training builds it,
agents/trainer_args.py) runs its `_tool_call_loop` through `_generate_and_score_completions`, the method each
training step calls, and evaluation's `EpisodeGenerator` runs the one episode loop (agents/episodes.py), both on the
same scripted model (its `generate` answers each context with a scripted turn) and the same tokenizer, with
Qwen2.5-Instruct's tool template. The prompts' ids, the completions' ids, their tool masks, the conversations and
the tool metrics must be the same: a TRL upgrade that changes its loop fails here, not in a user's evaluation.

The script covers what the loop decides: a call answered, refused calls (the calculator's refusal, a python program
that raises, a user tool that raises, an unknown tool: each a failed call, counted alike in training and evaluation),
two calls in one turn, a call on every turn (the turn limit), no call, and a result too long for the token budget
(rolled back; its call still counted)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_pipeline.agents.episodes import episode_stats
from grpo_pipeline.agents.loops import eval_tool_loop
from grpo_pipeline.agents.trainer_args import agent_args, trainer_agent_kwargs
from grpo_pipeline.configs.grpo import GRPOStageConfig
from grpo_pipeline.tasks.core.chat import encode_messages
from grpo_pipeline.tasks.scoring.episodes import EpisodeGenerator
from tests.agent_models import qwen_tool_model

BUDGET = 512  # max_completion_length, and evaluation's max_new_tokens


def lookup(key: str) -> str:
    """Look a key up in the table.

    Args:
        key: The key to look up.
    """
    raise KeyError(f"no key {key!r}")


def call(name: str, **arguments: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


TWO_FAILING_CALLS = f"{call('python', code='print(1 / 0)')}\n{call('lookup', key='x')}"  # in one turn
# question -> the model's turns, in order (the last one repeats); (calls, failed calls, turn-limit hit) it makes
SCRIPT: dict[str, tuple[list[str], tuple[int, int, bool]]] = {
    "What is 2+3?": ([call("calculator", expression="2+3"), "The answer is 5."], (1, 0, False)),
    "What is 1/0?": ([call("calculator", expression="1/0"), TWO_FAILING_CALLS, "It fails."], (3, 3, False)),
    "Count for ever.": ([call("calculator", expression="1+1")], (2, 0, True)),
    "Say hi.": (["Hi."], (0, 0, False)),
    "Search the web.": ([call("search", query="news"), "I cannot search."], (1, 1, False)),
    "What is 9**900?": ([call("calculator", expression="9**900"), "Big."], (1, 0, False)),
}
TOOLS = ["calculator", "python", f"{__name__}:lookup"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return qwen_tool_model(tmp_path_factory.mktemp("parity") / "model")


def scripted_generate(tokenizer: Any) -> Any:
    """`model.generate` of a model that answers each row (left-padded ids) with its question's next scripted turn,
    ended by <|im_end|>, cut to max_new_tokens; rows padded on the right."""
    eos = tokenizer.eos_token

    def generate(input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        max_new = kwargs.get("max_new_tokens") or kwargs["generation_config"].max_new_tokens
        new_rows = []
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist(), strict=True):
            context = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
            question = next(q for q in SCRIPT if f"{q}{eos}" in context)
            turn = context.rpartition(question)[2].count("<|im_start|>assistant") - 1
            turns = SCRIPT[question][0]
            new_rows.append(tokenizer(turns[min(turn, len(turns) - 1)] + eos, add_special_tokens=False)["input_ids"])
        new_rows = [row[:max_new] for row in new_rows]
        width = max(map(len, new_rows))
        padded = [row + [tokenizer.pad_token_id] * (width - len(row)) for row in new_rows]
        return torch.cat([input_ids, torch.tensor(padded, dtype=input_ids.dtype)], dim=1)

    return generate


def trl_episodes(model_dir: Path, tmp_path: Path, cfg: GRPOStageConfig) -> tuple[dict[str, Any], dict[str, float]]:
    """One training step's generation by TRL's GRPOTrainer (two rollouts per prompt): per question, its prompt ids,
    completion ids, tool mask and conversation; and the step's tool metrics."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    seen: dict[str, Any] = {}

    def capture(prompts: list, completions: list, completion_ids: list, **kwargs: Any) -> list[float]:
        """Keeps what TRL hands the rewards: the conversations and their ids."""
        seen.update(completions=completions, completion_ids=completion_ids)
        return [0.0] * len(completions)

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    questions = [q for q in SCRIPT for _ in range(2)]
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"), per_device_train_batch_size=len(questions), num_generations=2,
        max_completion_length=BUDGET, report_to="none", use_cpu=True, bf16=False, seed=0, **agent_args(cfg),
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=str(model_dir), reward_funcs=[capture], args=args, processing_class=tokenizer,
        train_dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": q}]} for q in questions]),
        **trainer_agent_kwargs(cfg, tokenizer),
    )  # fmt: skip
    trainer.model.generate = scripted_generate(tokenizer)
    trainer.model.train()
    out = trainer._generate_and_score_completions([{"prompt": [{"role": "user", "content": q}]} for q in questions])
    result = {}
    for row, question in enumerate(questions[::2]):
        i = 2 * row
        ids = seen["completion_ids"][i]
        result[question] = {
            "prompt_ids": out["prompt_ids"][i][out["prompt_mask"][i].bool()].tolist(),
            "completion_ids": list(ids),
            "mask": out["tool_mask"][i][: len(ids)].tolist(),
            "messages": seen["completions"][i],
        }
    metrics = {name: values[-1] for name, values in trainer._metrics["train"].items() if name.startswith("tools/")}
    return result, metrics


def evaluation_episodes(model_dir: Path, cfg: GRPOStageConfig) -> tuple[dict[str, Any], dict[str, float]]:
    """The same prompts as evaluation runs them (stored chat prompts, `EpisodeGenerator`, greedy), per question."""
    from transformers import AutoModelForCausalLM

    from grpo_pipeline.tasks.core.common import load_tokenizer

    tokenizer = load_tokenizer(str(model_dir))
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.generate = scripted_generate(tokenizer)
    loop = eval_tool_loop(cfg.sampling, tokenizer)
    generator = EpisodeGenerator(model, tokenizer, loop)
    prompts = [encode_messages([{"role": "user", "content": q}]) for q in SCRIPT]
    generator(prompts, max_new_tokens=BUDGET, batch_size=4)
    episodes = [group[0] for group in generator.runs[-1]]
    ids = loop.prompt_ids(tokenizer, [[{"role": "user", "content": q}] for q in SCRIPT])
    result = {
        q: {"prompt_ids": p, "completion_ids": e.completion_ids, "mask": e.env_mask, "messages": e.messages,
            "counts": (e.calls, e.errors, e.hit_turn_limit)}
        for q, p, e in zip(SCRIPT, ids, episodes, strict=True)
    }  # fmt: skip
    return result, episode_stats(episodes)


@pytest.fixture(scope="module")
def both(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, dict, dict]:
    """TRL's episodes and metrics, then evaluation's, for the same recipe's tools."""
    cfg = GRPOStageConfig(tools=TOOLS, max_tool_turns=2)
    return (*trl_episodes(model_dir, tmp_path_factory.mktemp("trl"), cfg), *evaluation_episodes(model_dir, cfg))


def test_evaluation_runs_trls_loop(both: tuple[dict, dict, dict, dict]) -> None:
    trl, _, ours, _ = both
    for question in SCRIPT:
        mine = {k: v for k, v in ours[question].items() if k != "counts"}
        assert mine == trl[question], question
    tool_messages = [m for m in ours["What is 1/0?"]["messages"] if m["role"] == "tool"]
    assert [m["name"] for m in tool_messages] == ["calculator", "python", "lookup"]
    assert "ZeroDivisionError" in tool_messages[1]["content"] and "KeyError" in tool_messages[2]["content"]
    assert len(ours["What is 9**900?"]["messages"]) == 1  # the result was rolled back: the call is all there is


def test_a_failed_call_counts_alike_in_training_and_evaluation(both: tuple[dict, dict, dict, dict]) -> None:
    """One definition of a failed call (agents/failure.py): the calculator's refusal, a python traceback, a user tool
    that raises and an unknown tool each count once, in TRL's metrics and in evaluation's."""
    _, trl_metrics, ours, our_metrics = both
    assert {q: ours[q]["counts"] for q in SCRIPT} == {q: counts for q, (_, counts) in SCRIPT.items()}
    calls = sum(counts[0] for _, counts in SCRIPT.values())
    failed = sum(counts[1] for _, counts in SCRIPT.values())
    assert trl_metrics["tools/call_frequency"] == pytest.approx(calls / len(SCRIPT))
    assert trl_metrics["tools/failure_frequency"] == pytest.approx(failed / calls)
    for name in ("tools/call_frequency", "tools/failure_frequency"):
        assert our_metrics[name] == pytest.approx(trl_metrics[name]), name
