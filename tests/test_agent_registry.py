"""The tool registry and the trainer's arguments for tool use (agents/registry.py, agents/trainer_args.py): names
and dotted paths resolved, tools TRL cannot describe refused with a fix, user tools contained, environments checked,
chat templates that cannot carry tool calls refused, and the user's tool code in the stage key."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from transformers import AutoTokenizer
from transformers.utils import get_json_schema
from trl.chat_template_utils import parse_response

from grpo_pipeline.agents import python_tool
from grpo_pipeline.agents.calculator import calculator
from grpo_pipeline.agents.chat_tools import ChatToolLoop
from grpo_pipeline.agents.failure import ToolFailure
from grpo_pipeline.agents.python_tool import python
from grpo_pipeline.agents.registry import ToolError, UserToolLimits, contain, resolve_tool
from grpo_pipeline.agents.trainer_args import (
    agent_args,
    check_agent_config,
    check_tokenizer,
    trainer_agent_kwargs,
)
from grpo_pipeline.configs.grpo import GRPOStageConfig
from grpo_pipeline.configs.schema import PipelineConfig
from grpo_pipeline.rewards import code as code_reward
from grpo_pipeline.rewards.registry import RewardError
from grpo_pipeline.rewards.sandbox import Sandbox, bwrap_status
from grpo_pipeline.rewards.sandbox import host as sandbox_host
from grpo_pipeline.tasks.grpo import tool_code
from tests.agent_models import qwen_tool_model

USER_TOOLS = '''
import time


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def undocumented(a: int) -> int:
    return a


def untyped(a):
    """Echo.

    Args:
        a: Anything.
    """
    return a


def hangs(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return "woke"


def floods(n: int) -> str:
    """Return n characters.

    Args:
        n: How many.
    """
    return "x" * n


def raises(a: int) -> str:
    """Fail.

    Args:
        a: Anything.
    """
    raise RuntimeError("boom")


class Counter:
    """Counts up to a target set by the row."""

    def reset(self, target: int = 3, **row) -> str:
        self.count, self.target = 0, target
        return f" Count to {target}."

    def increment(self, by: int) -> str:
        """Add to the counter.

        Args:
            by: How much to add.
        """
        self.count += by
        return str(self.count)

    def get_reward(self) -> float:
        return float(self.count == self.target)


class NoReset:
    def poke(self, a: int) -> int:
        """Poke.

        Args:
            a: Anything.
        """
        return a


class Untyped:
    def reset(self, **row):
        return None

    def poke(self, a):
        return a
'''


@pytest.fixture
def user_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A user module `my_tools` on sys.path, imported afresh by each test; yields its name."""
    (tmp_path / "my_tools.py").write_text(USER_TOOLS)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_tools", None)
    yield "my_tools"
    sys.modules.pop("my_tools", None)


def test_builtin_names_resolve_to_the_builtin_tools() -> None:
    assert resolve_tool("calculator") is calculator and resolve_tool("python") is python


def test_unknown_name_suggests_the_close_one() -> None:
    with pytest.raises(ToolError, match=r"grpo.tools: 'calculater' is neither a built-in tool .* did you mean 'calcu"):
        resolve_tool("calculater")


def test_dotted_tool_resolves_contained_with_its_schema(user_tools: str) -> None:
    add = resolve_tool(f"{user_tools}:add")
    assert add(a=2, b=3) == "5"
    assert get_json_schema(add)["function"]["parameters"]["required"] == ["a", "b"]


@pytest.mark.parametrize(
    ("attr", "says"),
    [
        ("undocumented", "Google-style docstring"),
        ("untyped", "type hint on every argument"),
        ("missing", "has no attribute 'missing'"),
        ("Counter", "not a function"),
    ],
)
def test_tools_trl_cannot_use_are_refused_with_a_fix(user_tools: str, attr: str, says: str) -> None:
    with pytest.raises(ToolError, match=says):
        resolve_tool(f"{user_tools}:{attr}", "grpo.tools[0]")


def test_unimportable_module_says_where_to_put_it() -> None:
    with pytest.raises(ToolError, match=r"put no_such_pkg/tools.py beside the recipe"):
        resolve_tool("no_such_pkg.tools:fn")


def test_user_tools_are_contained(user_tools: str) -> None:
    limits = UserToolLimits(timeout_s=0.5, max_chars=100)
    import my_tools  # type: ignore[import-not-found]

    start = time.monotonic()
    with pytest.raises(ToolFailure, match=r"^the tool did not return within 0.5 s$"):
        contain(my_tools.hangs, limits)(seconds=5)
    assert time.monotonic() - start < 2
    with pytest.raises(ToolFailure, match=r"^RuntimeError: boom$"):
        contain(my_tools.raises, limits)(a=1)
    assert len(contain(my_tools.floods, limits)(n=10_000_000)) <= 100
    # the model's wrong arguments are a failed call too, told to the model, never a crash of the trainer
    with pytest.raises(ToolFailure, match=r"^TypeError"):
        contain(my_tools.add, limits)(x=1)


def test_environment_is_loaded_checked_and_contained(user_tools: str) -> None:
    cfg = GRPOStageConfig(environment=f"{user_tools}:Counter")
    factory = trainer_agent_kwargs_without_tokenizer(cfg)["environment_factory"]
    env = factory()
    assert env.reset(target=2) == " Count to 2."
    assert env.increment(by=2) == "2" and env.get_reward() == 1.0
    with pytest.raises(ToolFailure, match=r"^TypeError"):  # contained: a failed call the model is told about
        env.increment(by="x")


@pytest.mark.parametrize(("cls", "says"), [("NoReset", "no reset"), ("Untyped", "type hint"), ("add", "not a class")])
def test_bad_environments_are_refused(user_tools: str, cls: str, says: str) -> None:
    problems = check_agent_config(GRPOStageConfig(environment=f"{user_tools}:{cls}"))
    assert len(problems) == 1 and problems[0].startswith("grpo.environment") and says in problems[0]


def test_check_agent_config_lists_every_problem(user_tools: str) -> None:
    cfg = GRPOStageConfig(tools=["calculator", "calculater", f"{user_tools}:untyped"])
    problems = check_agent_config(cfg)
    assert [p.split(":")[0] for p in problems] == ["grpo.tools[1]", "grpo.tools[2]"]


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host where bubblewrap cannot start; every sandbox is built afresh (default_sandbox caches one per config)."""
    monkeypatch.setattr(sandbox_host, "bwrap_status", lambda python=None: (False, "bwrap is not installed"))
    monkeypatch.setattr(python_tool, "default_sandbox", Sandbox)
    monkeypatch.setattr(code_reward, "default_sandbox", Sandbox)


def test_python_tool_takes_the_code_rewards_isolation_and_its_refusal(no_bwrap: None) -> None:
    """`isolation: bwrap` refuses the python tool before training where bubblewrap cannot start, with the code
    reward's own refusal, in training (grpo.tools), preflight and evaluation (eval.tools) alike."""
    with pytest.raises(RewardError) as reward_refusal:
        code_reward.code_tests_reward(isolation="bwrap")
    refusal = str(reward_refusal.value).removeprefix("reward 'code_tests': ")
    assert "bubblewrap" in refusal or "bwrap" in refusal
    with pytest.raises(ToolError) as tool_refusal:
        resolve_tool("python", "grpo.tools[0]", {"isolation": "bwrap"})
    assert str(tool_refusal.value) == f"grpo.tool_params.python: {refusal}"
    cfg = GRPOStageConfig(tools=["python"], tool_params={"python": {"isolation": "bwrap"}})
    assert check_agent_config(cfg) == [f"grpo.tool_params.python: {refusal}"]
    loop = ChatToolLoop(("python",), 1, params={"python": {"isolation": "bwrap"}})
    with pytest.raises(ToolError, match=r"^eval\.tool_params\.python: sandbox isolation 'bwrap' was requested"):
        loop.functions  # noqa: B018


@pytest.mark.skipif(not bwrap_status()[0], reason="bubblewrap unavailable here")
def test_python_tool_with_bwrap_runs_and_keeps_its_schema() -> None:
    tool = resolve_tool("python", "grpo.tools[0]", {"isolation": "bwrap"})
    assert tool("print(6 * 7)") == "42\n"
    assert get_json_schema(tool) == get_json_schema(python)  # what the model is shown does not change


@pytest.mark.parametrize(
    ("name", "params", "says"),
    [
        ("python", {"isolaton": "bwrap"}, "unexpected keyword argument 'isolaton'; the tool's params are (isolation"),
        ("python", {"isolation": "strict"}, "sandbox isolation must be one of"),
        ("calculator", {"digits": 5}, "only built-in tools take params (python); 'calculator' takes none"),
    ],
)
def test_bad_tool_params_are_refused(name: str, params: dict, says: str) -> None:
    with pytest.raises(ToolError, match=f"^grpo.tool_params.{name}: ") as refused:
        resolve_tool(name, "grpo.tools[0]", params)
    assert says in str(refused.value)


def test_tool_params_name_listed_tools_and_reach_evaluation() -> None:
    with pytest.raises(ValueError, match=r"grpo.tool_params has params for \['python'\], which grpo.tools does not"):
        GRPOStageConfig(tools=["calculator"], tool_params={"python": {"isolation": "bwrap"}})
    params = {"python": {"isolation": "bwrap"}}
    cfg = PipelineConfig.model_validate({"grpo": {"tools": ["python"], "tool_params": params}})
    assert cfg.eval.tools == ["python"] and cfg.eval.tool_params == params


def test_config_rejects_malformed_entries() -> None:
    with pytest.raises(ValueError, match=r"grpo.tools\[0\] is 'my tools'"):
        GRPOStageConfig(tools=["my tools"])
    with pytest.raises(ValueError, match="lists a tool twice"):
        GRPOStageConfig(tools=["python", "python"])
    with pytest.raises(ValueError, match=r"dotted path 'pkg\.module:Class'"):
        GRPOStageConfig(environment="Counter")
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        GRPOStageConfig(max_tool_turns=0)


def test_agent_args_map_the_turn_limit_only_with_tools() -> None:
    assert agent_args(GRPOStageConfig()) == {}
    assert agent_args(GRPOStageConfig(tools=["calculator"], max_tool_turns=2)) == {"max_tool_calling_iterations": 2}


def test_no_tools_no_trainer_kwargs() -> None:
    assert trainer_agent_kwargs(GRPOStageConfig(), tokenizer=None) == {}  # type: ignore[arg-type]


def test_tool_code_keys_user_tools_not_builtins(user_tools: str, tmp_path: Path) -> None:
    cfg = GRPOStageConfig(tools=["calculator", f"{user_tools}:add"], environment=f"{user_tools}:Counter")
    before = tool_code(cfg)
    assert set(before) == {f"{user_tools}:add", f"{user_tools}:Counter"}
    (tmp_path / "my_tools.py").write_text(USER_TOOLS + "\n\ndef more() -> None:\n    pass\n")
    assert tool_code(cfg)[f"{user_tools}:add"] != before[f"{user_tools}:add"]
    assert tool_code(GRPOStageConfig(tools=["calculator"])) == {}


# ----------------------------------------------------------------------------- the tokenizer and chat template


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return qwen_tool_model(tmp_path_factory.mktemp("qwen-tools") / "model")


def test_qwen_template_passes_and_gets_trls_response_template(qwen_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(qwen_dir)
    kwargs = trainer_agent_kwargs(GRPOStageConfig(tools=["calculator"]), tokenizer)
    assert kwargs == {"tools": [calculator]}
    assert tokenizer.response_template is not None
    text = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1 + 2"}}\n</tool_call><|im_end|>'
    prompt = [{"role": "user", "content": "What is 1 + 2?"}]
    prefix = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
    parsed = parse_response(tokenizer, tokenizer(text)["input_ids"], prefix=prefix, tools=kwargs["tools"])
    assert parsed["tool_calls"][0]["function"] == {"name": "calculator", "arguments": {"expression": "1 + 2"}}


def test_a_template_without_tool_calls_is_refused(qwen_dir: Path) -> None:
    from grpo_pipeline.tasks.training.family_model import CHATML

    tokenizer = AutoTokenizer.from_pretrained(qwen_dir)
    tokenizer.chat_template = CHATML  # Qwen2.5's template without its tool branches (the rehearsal stand-in's)
    with pytest.raises(ToolError, match=r"cannot carry tool calls .* leave grpo\.tools empty"):
        check_tokenizer(tokenizer)


def test_a_template_trl_cannot_parse_is_refused(qwen_dir: Path) -> None:
    from trl.chat_template_utils import qwen2_5_chat_template

    tokenizer = AutoTokenizer.from_pretrained(qwen_dir)
    tokenizer.chat_template = qwen2_5_chat_template.replace("You are Qwen", "You are a model")  # unknown to TRL
    with pytest.raises(ToolError, match="cannot parse tool calls"):
        check_tokenizer(tokenizer)


def trainer_agent_kwargs_without_tokenizer(cfg: GRPOStageConfig) -> dict:
    """`trainer_agent_kwargs` with the tokenizer check passed (the environment tests need no model)."""
    from grpo_pipeline.agents import trainer_args

    original = trainer_args.check_tokenizer
    trainer_args.check_tokenizer = lambda tokenizer: None
    try:
        return trainer_agent_kwargs(cfg, tokenizer=None)  # type: ignore[arg-type]
    finally:
        trainer_args.check_tokenizer = original
