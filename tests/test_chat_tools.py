"""Tool episodes through the chat template (agents/chat_tools.py), as TRL's GRPOTrainer runs them in training, on a
local Qwen2 stand-in with Qwen2.5-Instruct's tool template: the prompt, parsing, the tool messages' ids (the same as
TRL's), the turn limit and the budget, and evaluation of a chat tool recipe through the same loop."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from grpo_pipeline.agents.chat_tools import ChatToolLoop, tool_suffix_ids, turn_limit_hits
from grpo_pipeline.agents.episodes import conversation, hf_generate
from grpo_pipeline.agents.loops import eval_tool_loop
from grpo_pipeline.configs.sampling import Sampling
from grpo_pipeline.tasks.scoring.episodes import EpisodeGenerator
from tests.agent_models import qwen_tool_model

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call><|im_end|>'
QUESTION = [{"role": "user", "content": "What is 2+3?"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return qwen_tool_model(tmp_path_factory.mktemp("qwen") / "model")


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    return tok


def scripted(tokenizer, script: dict[str, str]):
    """A GenerateFn that continues each row with the text `script` gives for the end of its context (pads after)."""

    def generate(rows, max_new_tokens, criteria):
        out = []
        for row in rows:
            text = tokenizer.decode(row)
            key = next(k for k in sorted(script, key=len, reverse=True) if text.rstrip().endswith(k))
            new = tokenizer(script[key], add_special_tokens=False)["input_ids"]
            out.append((new + [tokenizer.pad_token_id] * max_new_tokens)[:max_new_tokens])
        return out

    return generate


def episode(tokenizer, script: dict[str, str], max_turns: int = 2, budget: int = 200):
    loop = eval_tool_loop(
        Sampling(temperature=None, max_new_tokens=8, tools=("calculator",), max_tool_turns=max_turns), tokenizer
    )
    assert isinstance(loop, ChatToolLoop)  # a template that carries tool calls gets TRL's loop, not the text one
    ids = loop.prompt_ids(tokenizer, [QUESTION])
    assert "calculator" in tokenizer.decode(ids[0])  # the tools' schemas are in the prompt, as in training
    (done,) = loop.episodes(scripted(tokenizer, script), tokenizer, ids, max_new_tokens=budget,
                            stop=[tokenizer.eos_token_id])  # fmt: skip
    return done


def test_a_call_is_run_its_result_masked_and_the_answer_is_the_last_turn(tokenizer) -> None:
    done = episode(tokenizer, {"<|im_start|>assistant": CALL, "</tool_response><|im_end|>\n<|im_start|>assistant":
                               "The answer is 5.<|im_end|>"})  # fmt: skip
    assert [m["role"] for m in done.messages] == ["assistant", "tool", "assistant"]
    assert done.messages[1] == {"role": "tool", "name": "calculator", "content": "5"}
    assert done.text == "The answer is 5." and (done.calls, done.errors, done.hit_turn_limit) == (1, 0, False)
    tool_tokens = [t for t, m in zip(done.completion_ids, done.env_mask, strict=True) if not m]
    assert "<tool_response>\n5\n</tool_response>" in tokenizer.decode(tool_tokens)
    assert conversation(done, tokenizer) is done.messages


def test_an_episode_still_calling_when_the_turns_are_spent_hits_the_limit(tokenizer) -> None:
    done = episode(tokenizer, {"<|im_start|>assistant": CALL}, max_turns=2)
    assert (done.calls, done.hit_turn_limit) == (2, True)
    assert turn_limit_hits([done.messages], 2) == [True] and turn_limit_hits([done.messages], 3) == [False]
    assert turn_limit_hits(["plain text"], 2) is None


def test_a_result_past_the_budget_is_rolled_back_and_is_no_turn_limit_hit(tokenizer) -> None:
    first = len(tokenizer(CALL, add_special_tokens=False)["input_ids"])
    done = episode(tokenizer, {"<|im_start|>assistant": CALL}, budget=first + 2)
    # the call ran and counts (TRL counts it before rolling its result back), but nothing of it was appended
    assert (done.calls, done.turns, done.hit_turn_limit, len(done.messages)) == (1, 0, False, 1)
    assert done.env_mask == [1] * first


def test_unknown_tools_and_refusals_are_errors_the_model_reads(tokenizer) -> None:
    loop = ChatToolLoop(("calculator",), 1)
    assert loop.call({"type": "function", "function": {"name": "search", "arguments": {}}})[1:] == (
        "{'error': 'Tool search not found.'}", True,
    )  # fmt: skip
    refused = loop.call({"type": "function", "function": {"name": "calculator", "arguments": {"expression": "1/0"}}})
    assert refused == ("calculator", "{'error': 'division by zero'}", True)  # a refusal is a failed call, as in TRL


def test_the_tool_messages_ids_are_trls(tokenizer) -> None:
    from trl import GRPOTrainer

    messages = [{"role": "tool", "name": "calculator", "content": "5"}]
    trainer = SimpleNamespace(processing_class=tokenizer, _tokenizer=tokenizer, _is_vlm=False, chat_template=None,
                              chat_template_kwargs={})  # fmt: skip
    assert tool_suffix_ids(tokenizer, messages) == GRPOTrainer._get_tool_suffix_ids(trainer, messages)


def test_evaluation_of_a_chat_tool_recipe_runs_the_episodes(model_dir: Path, tmp_path: Path) -> None:
    from grpo_pipeline.configs.schema import EvalConfig
    from grpo_pipeline.tasks.core.chat import encode_messages
    from grpo_pipeline.tasks.core.common import Ref
    from grpo_pipeline.tasks.scoring.evaluation import evaluate_model

    rows = pd.DataFrame({"prompt": [encode_messages(QUESTION)] * 2, "answer": ["5", "5"]})
    rows.to_parquet(tmp_path / "eval.parquet")
    cfg = EvalConfig(n_samples=2, k=[1, 2], max_new_tokens=12, tools=["calculator"], max_tool_turns=1, batch_size=4)
    result = evaluate_model(str(model_dir), Ref(path=str(tmp_path / "eval.parquet"), fingerprint="x"), cfg, seed=0,
                            out=tmp_path / "e")  # fmt: skip
    assert set(result.tools) >= {"tools/greedy_call_frequency", "tools/sampled_turn_limit_share"}
    items = result.items()
    assert len(items["sample_conversations"][0]) == 2 and items["greedy_conversation"][0][0]["role"] == "assistant"


def test_hf_generate_without_a_call_stop(model_dir: Path, tokenizer) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    generate = hf_generate(model, tokenizer.pad_token_id, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    (row,) = generate([tokenizer("hi")["input_ids"]], 3, None)
    assert len(row) <= 3 and EpisodeGenerator


def test_the_completions_table_shows_whole_conversations() -> None:
    from grpo_pipeline.tasks.release.logged_model import completions_table

    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2+3"}}}
    turns = [{"role": "assistant", "content": "", "tool_calls": [call]},
             {"role": "tool", "name": "calculator", "content": "5"}, {"role": "assistant", "content": "5"}]  # fmt: skip
    items = pd.DataFrame([{"id": "a", "prompt": "2+3?", "samples": ["5"], "sample_correct": [1.0],
                           "sample_conversations": [turns], "sample_tool_calls": [1]}])  # fmt: skip
    table = completions_table(items)
    assert table["conversation"] == ['[assistant]\n-> calculator({"expression": "2+3"})\n\n[tool calculator]\n5'
                                     "\n\n[assistant]\n5"]  # fmt: skip
    assert (table["completion"], table["correct"], table["tool_calls"]) == (["5"], [True], [1])
    assert "conversation" not in completions_table(items.drop(columns=["sample_conversations"]))
