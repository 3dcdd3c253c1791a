"""Environments (`grpo.environment`) outside training: evaluation, the GRPO probe, SFT's bar probe and the difficulty
filter run each episode with a fresh instance, reset with its row, its methods as the tools and its get_reward()
reported, through the same episode loop as grpo.tools (agents/chat_tools.py), on the local Qwen2 stand-in with
Qwen2.5-Instruct's tool template. The model's turns are scripted where a test needs a given behaviour."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from grpo_pipeline.agents.calculator import calculator as _calculator
from grpo_pipeline.agents.chat_tools import ChatToolLoop
from grpo_pipeline.agents.episodes import episode_stats
from grpo_pipeline.agents.loops import eval_tool_loop
from grpo_pipeline.agents.registry import ToolError, UserToolLimits
from grpo_pipeline.configs.sampling import Sampling
from grpo_pipeline.tasks.core.chat import encode_messages
from grpo_pipeline.tasks.scoring.episodes import EpisodeGenerator
from tests.agent_models import qwen_tool_model

HERE = "tests.test_agent_environments"
ENV_EPISODES = Sampling(temperature=None, max_new_tokens=8, environment=f"{HERE}:CalcEnv")  # no tools of its own
QUESTION = [{"role": "user", "content": "What is 2+3?"}]
ROWS = [{"prompt": encode_messages(QUESTION), "answer": "5"}, {"prompt": encode_messages(QUESTION), "answer": "5"}]
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call><|im_end|>'
NO_CALL = "The answer is 5.<|im_end|>"  # right, but without the tool the environment asks for
RESETS: list[Any] = []  # every instance's reset, in order: (instance, row)


class CalcEnv:
    """Scores an episode 1.0 when its last calculator result is the row's answer: the tool must have been called."""

    def reset(self, **row: Any) -> str:
        RESETS.append((self, row))
        self.answer, self.results = row["answer"], []
        return " Use the calculator."

    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: The expression, e.g. 2+3.
        """
        result = self._compute(expression)
        self.results.append(result)
        return result

    def _compute(self, expression: str) -> str:
        return _calculator(expression)

    def get_reward(self) -> float:
        return float(bool(self.results) and self.results[-1] == self.answer)


class WrongCalcEnv(CalcEnv):
    """CalcEnv's wrong twin: its calculator is off by one."""

    def _compute(self, expression: str) -> str:
        return str(int(_calculator(expression)) + 1)


class RaisingEnv(CalcEnv):
    def _compute(self, expression: str) -> str:
        raise RuntimeError("the ledger is locked")


class HangingEnv(CalcEnv):
    def _compute(self, expression: str) -> str:
        time.sleep(5)
        return _calculator(expression)


class NoRewardEnv:
    def reset(self, **row: Any) -> None:
        pass

    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: The expression, e.g. 2+3.
        """
        return _calculator(expression)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return qwen_tool_model(tmp_path_factory.mktemp("qwen") / "model")


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path):
    from grpo_pipeline.agents.trainer_args import check_tokenizer
    from grpo_pipeline.tasks.core.common import load_tokenizer

    tok = load_tokenizer(str(model_dir))
    check_tokenizer(tok)  # TRL's response template, as eval_tool_loop sets it
    return tok


def scripted(tokenizer, first: str):
    """A GenerateFn whose first turn is `first` and whose turn after a tool result states that result as the
    answer (a model that trusts its tool)."""

    def generate(rows: list[list[int]], max_new_tokens: int, criteria: Any) -> list[list[int]]:
        out = []
        for row in rows:
            episode = tokenizer.decode(row).rpartition("<|im_start|>user")[2]
            results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", episode, re.S)
            reply = f"The answer is {results[-1]}.<|im_end|>" if results else first
            ids = tokenizer(reply, add_special_tokens=False)["input_ids"]
            out.append((ids + [tokenizer.pad_token_id] * max_new_tokens)[:max_new_tokens])
        return out

    return generate


def run(tokenizer, env: str, first: str = CALL, n: int = 1, limits: UserToolLimits | None = None):
    """`n` episodes per row of ROWS with environment `env` (a class of this module) and the scripted model."""
    loop = ChatToolLoop((), 2, f"{HERE}:{env}", limits or UserToolLimits())
    generator = EpisodeGenerator(None, tokenizer, loop, ROWS)
    texts, _ = generator.run(scripted(tokenizer, first), [r["prompt"] for r in ROWS], max_new_tokens=200,
                             batch_size=3, n=n, stop=[tokenizer.eos_token_id], desc="test")  # fmt: skip
    return texts, [e for group in generator.runs[-1] for e in group]


def test_each_episode_gets_a_fresh_instance_reset_with_its_row(tokenizer) -> None:
    RESETS.clear()
    texts, episodes = run(tokenizer, "CalcEnv", n=2)
    assert texts == [["The answer is 5."] * 2] * 2
    instances = [instance for instance, _ in RESETS]
    assert len(instances) == 4 and len({id(i) for i in instances}) == 4  # one per episode, none reused
    assert [e.environment for e in episodes] == instances
    assert all(row["answer"] == "5" and row["prompt"] == QUESTION for _, row in RESETS)  # the row, prompt as messages
    assert all(e.calls == 1 and e.errors == 0 and e.env_reward == 1.0 for e in episodes)
    assert episodes[0].messages[1] == {"role": "tool", "name": "calculator", "content": "5"}
    assert episode_stats(episodes)["tools/environment_reward"] == 1.0


def test_reset_text_extends_the_prompt_and_the_methods_are_the_tools(tokenizer) -> None:
    loop = ChatToolLoop((), 2, f"{HERE}:CalcEnv")
    (ids,), (episode,) = loop.begin(tokenizer, [QUESTION], [ROWS[0]])
    prompt = tokenizer.decode(ids)
    assert "What is 2+3? Use the calculator.<|im_end|>" in prompt  # reset's text, appended as TRL appends it
    assert '"name": "calculator"' in prompt  # the instance's method, described as a tool
    assert [fn.__name__ for fn in loop.tools_of(episode)] == ["calculator"]  # _compute and get_reward are not tools


def test_a_wrong_twin_scores_lower(tokenizer) -> None:
    from grpo_pipeline.rewards import build_reward
    from grpo_pipeline.tasks.scoring.items import judge

    rows = pd.DataFrame(ROWS)
    scores = {}
    for env in ("CalcEnv", "WrongCalcEnv"):
        texts, episodes = run(tokenizer, env)
        judged, _ = judge(build_reward("correctness"), rows, texts)
        scores[env] = (sum(g[0] is True for g in judged), episode_stats(episodes)["tools/environment_reward"])
    assert scores == {"CalcEnv": (2, 1.0), "WrongCalcEnv": (0, 0.0)}


def test_an_answer_without_the_tool_is_not_rewarded_by_the_environment(tokenizer) -> None:
    texts, episodes = run(tokenizer, "CalcEnv", first=NO_CALL)
    assert texts == [["The answer is 5."]] * 2  # the correctness reward would pass it...
    assert all(e.calls == 0 and e.env_reward == 0.0 for e in episodes)  # ...the environment, which wants the call, not
    assert episode_stats(episodes)["tools/environment_reward"] == 0.0


@pytest.mark.parametrize(("env", "said"), [("RaisingEnv", "RuntimeError: the ledger is locked"),
                                           ("HangingEnv", "did not return within 0.2 s")])  # fmt: skip
def test_a_method_that_raises_or_hangs_is_contained(tokenizer, env: str, said: str) -> None:
    started = time.monotonic()
    _, episodes = run(tokenizer, env, limits=UserToolLimits(timeout_s=0.2))
    assert time.monotonic() - started < 4  # a hang is abandoned at the limit, not waited for
    for episode in episodes:
        assert said in episode.messages[1]["content"] and (episode.calls, episode.errors) == (1, 1)
        assert episode.env_reward == 0.0  # the environment saw no result


def test_without_get_reward_no_environment_reward_is_reported(tokenizer) -> None:
    _, episodes = run(tokenizer, "NoRewardEnv")
    assert all(e.env_reward is None for e in episodes)
    assert "tools/environment_reward" not in episode_stats(episodes)


def test_an_environment_on_a_model_without_a_tool_template_is_refused() -> None:
    from grpo_pipeline.tasks.training.tiny_model import build_tokenizer

    with pytest.raises(ToolError, match=r"eval\.environment"):
        eval_tool_loop(ENV_EPISODES, build_tokenizer())


def test_evaluation_reports_the_environment_reward(model_dir: Path, tmp_path: Path) -> None:
    from grpo_pipeline.configs.schema import EvalConfig
    from grpo_pipeline.tasks.core.common import Ref
    from grpo_pipeline.tasks.scoring.evaluation import evaluate_model

    pd.DataFrame(ROWS).to_parquet(tmp_path / "eval.parquet")
    RESETS.clear()
    cfg = EvalConfig(n_samples=2, k=[1, 2], max_new_tokens=12, tools=[], environment=f"{HERE}:CalcEnv",
                     max_tool_turns=1, batch_size=4)  # fmt: skip
    result = evaluate_model(str(model_dir), Ref(path=str(tmp_path / "eval.parquet"), fingerprint="x"), cfg, seed=0,
                            out=tmp_path / "e")  # fmt: skip
    assert len(RESETS) == 2 * (1 + 2)  # greedy and two samples per row, each its own instance
    assert 0.0 <= result.tools["tools/greedy_environment_reward"] <= 1.0
    assert "tools/sampled_environment_reward" in result.tools
    items = result.items()
    assert items["greedy_env_reward"].notna().all() and len(items["sample_env_rewards"][0]) == 2
    assert result.settings()["eval_environment"] == f"{HERE}:CalcEnv"


def test_sft_bar_probe_gets_the_environment(tokenizer, tmp_path: Path) -> None:
    from grpo_pipeline.configs.eval import CORRECTNESS
    from grpo_pipeline.configs.sft import SFTStageConfig
    from grpo_pipeline.tasks.core.common import Ref
    from grpo_pipeline.tasks.sft import bar_probe

    pd.DataFrame(ROWS).to_parquet(tmp_path / "probe.parquet")
    probe = Ref(path=str(tmp_path / "probe.parquet"), fingerprint="x")
    sampling = ENV_EPISODES.model_copy(update={"max_tool_turns": 2})
    (callback,) = bar_probe(SFTStageConfig(stop_at_accuracy=0.5), tokenizer, probe, CORRECTNESS, sampling, [])
    assert isinstance(callback.tools, ChatToolLoop) and callback.tools.environment == f"{HERE}:CalcEnv"


def test_the_probe_and_the_difficulty_filter_run_the_environment(model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_pipeline.configs.eval import CORRECTNESS
    from grpo_pipeline.rewards import build_reward
    from grpo_pipeline.tasks.core.common import Checkpoint
    from grpo_pipeline.tasks.difficulty import pass_rates
    from grpo_pipeline.tasks.scoring.rollouts import Rollouts
    from grpo_pipeline.tasks.training.probe import greedy_correct

    rows = pd.DataFrame(ROWS)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    RESETS.clear()
    loop = eval_tool_loop(ENV_EPISODES, tokenizer)
    assert len(greedy_correct(model, tokenizer, rows, build_reward("correctness"), 8, loop)) == 2
    assert len(RESETS) == 2
    sampled = ENV_EPISODES.model_copy(update={"temperature": 1.0})
    rollouts = Rollouts(sampling=sampled, batch_size=4, correctness_reward=CORRECTNESS)
    policy = Checkpoint(path=str(model_dir), fingerprint="x")
    assert [scored for _, scored in pass_rates(policy, rows, 2, rollouts, 0, "test")] == [2, 2]
    assert len(RESETS) == 2 + 4


def test_eval_takes_the_environment_of_grpo_unless_told_otherwise() -> None:
    from grpo_pipeline.configs.schema import PipelineConfig

    env = f"{HERE}:CalcEnv"
    assert PipelineConfig.model_validate({"grpo": {"environment": env}}).eval.environment == env
    assert PipelineConfig.model_validate({"grpo": {"environment": env}, "eval": {"tools": []}}).eval.environment is None
