"""The TRL path end to end on a local stand-in: GRPOTrainer with `tools=[calculator]` (built from the recipe by
agents/trainer_args.py) on a tiny Qwen2 model whose tokenizer carries Qwen2.5-Instruct's tool-calling template.

A freshly built model never writes a tool call, so the test first teaches it one (a few hundred steps of plain
next-token training on one prompt and its tool call, seconds on a CPU); then one GRPO step generates, TRL parses
the call through the response template the pipeline set, runs the calculator, appends its result as a tool message,
generates again, and the reward function receives the whole episode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_pipeline.agents.calculator import calculator
from grpo_pipeline.agents.trainer_args import agent_args, trainer_agent_kwargs
from grpo_pipeline.configs.grpo import GRPOStageConfig
from tests.agent_models import qwen_tool_model

PROMPT = [{"role": "user", "content": "What is 123456789 * 987654321?"}]
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "123456789 * 987654321"}}\n</tool_call>'
ANSWER = "121932631112635269"


def teach_the_call(model_dir: Path, out: Path, steps: int = 300) -> Path:
    """Save to `out` the stand-in trained to answer PROMPT (rendered with the calculator's schema, as TRL renders
    it) with CALL: next-token loss on the call's tokens only."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    prompt_ids = tokenizer.apply_chat_template(
        PROMPT, tools=[calculator], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    call_ids = tokenizer(CALL + "<|im_end|>")["input_ids"]
    ids = torch.tensor([prompt_ids + call_ids])
    labels = ids.clone()
    labels[0, : len(prompt_ids)] = -100
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.01:
            break
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("agent-trl")
    return teach_the_call(qwen_tool_model(root / "stand-in"), root / "taught")


def grpo_args(out: Path, cfg: GRPOStageConfig) -> Any:
    """One GRPO step of two generations, nearly greedy, on the CPU."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(out), max_steps=1, per_device_train_batch_size=2, num_generations=2,
        max_completion_length=96, temperature=0.05, learning_rate=1e-4, logging_steps=1, save_strategy="no",
        report_to="none", use_cpu=True, bf16=False, seed=0, **agent_args(cfg),
    )  # fmt: skip


def test_a_tool_call_runs_and_its_result_reaches_the_reward(model_dir: Path, tmp_path: Path) -> None:
    from trl import GRPOTrainer

    cfg = GRPOStageConfig(tools=["calculator"], max_tool_turns=2)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    seen: list[list[dict[str, Any]]] = []

    def episode_reward(prompts: list, completions: list, **kwargs: Any) -> list[float]:
        """1 when a calculator result is among the completion's messages (what TRL hands rewards)."""
        seen.extend(completions)
        return [float(any(m.get("role") == "tool" for m in c)) for c in completions]

    args = grpo_args(tmp_path / "out", cfg)
    assert args.max_tool_calling_iterations == 2
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=[episode_reward],
        args=args,
        train_dataset=Dataset.from_list([{"prompt": PROMPT}] * 4),
        processing_class=tokenizer,
        **trainer_agent_kwargs(cfg, tokenizer),
    )
    trainer.train()

    assert seen, "the reward was never called"
    episode = seen[0]
    call = episode[0]["tool_calls"][0]["function"]
    assert call == {"name": "calculator", "arguments": {"expression": "123456789 * 987654321"}}
    assert episode[1] == {"role": "tool", "name": "calculator", "content": ANSWER}
    assert len(episode) >= 3 and episode[2]["role"] == "assistant"  # the model's next turn, after the result
    history = trainer.state.log_history[0]
    assert history["tools/call_frequency"] >= 1 and history["tools/failure_frequency"] == 0
    assert history["reward"] == 1.0


# An environment whose one tool is the calculator: it keeps each result, and scores the rollout by whether the last
# one is the row's answer (`get_reward`, which TRL adds as a reward named after the class).
ENV_MODULE = """
from typing import Any

from grpo_pipeline.agents.calculator import calculator as _calculator


class CalculatorEnv:
    def reset(self, **row: Any) -> None:
        self.answer, self.results = row["answer"], []

    def calculator(self, expression: str) -> str:
        result = _calculator(expression)
        self.results.append(result)
        return result

    calculator.__doc__ = _calculator.__doc__  # the schema the model was taught with

    def get_reward(self) -> float:
        return float(bool(self.results) and self.results[-1] == self.answer)
"""


def test_an_environment_runs_its_tools_and_scores_the_rollout(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """environment_factory: reset(**row) with the dataset row, its method called as the tool (contained), its
    get_reward() one more reward, and the instances handed to the rewards."""
    from trl import GRPOTrainer

    (tmp_path / "calc_env.py").write_text(ENV_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    cfg = GRPOStageConfig(environment="calc_env:CalculatorEnv", max_tool_turns=2)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    kwargs = trainer_agent_kwargs(cfg, tokenizer)
    seen: list[Any] = []

    def sees_environments(prompts: list, completions: list, environments: list, **kwargs: Any) -> list[float]:
        seen.extend(environments)
        return [0.0] * len(completions)

    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=[sees_environments],
        args=grpo_args(tmp_path / "out", cfg),
        train_dataset=Dataset.from_list([{"prompt": PROMPT, "answer": ANSWER}] * 4),
        processing_class=tokenizer,
        **kwargs,
    )
    trainer.train()
    assert seen and all(env.results[0] == ANSWER for env in seen)
    history = trainer.state.log_history[0]
    assert history["rewards/CalculatorEnv/mean"] == 1.0 and history["tools/failure_frequency"] == 0
