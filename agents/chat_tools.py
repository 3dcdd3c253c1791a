"""Tool episodes through the chat template, for a policy that TRL's own loop trains (a model whose chat template
carries tool calls: Qwen2.5-Instruct and the others of docs/agents.md).

Training runs TRL 1.16's loop (`GRPOTrainer._tool_call_loop`); scoring the policy on single completions would score
something it was never trained to produce (a tool call, not an answer). So `ChatToolLoop` is how the one episode loop
(agents/episodes.py `run_episodes`) takes and answers a chat turn, step for step as TRL does: the prompt rendered with
the tools' schemas (`apply_chat_template(tools=)`, with TRL's training template where the model's own is not
prefix-preserving), each turn parsed with TRL's `parse_response` (the tokenizer's response template, arguments typed
by the tools' schemas), every call run and counted as TRL counts it (agents/failure.py: a call that raised failed,
and the model reads `{'error': ...}`), the tool messages appended as ids (the template's suffix for them, TRL's
`_get_tool_suffix_ids`), one more turn generated, at most `max_turns` times; tool results that would pass the token
budget are rolled back and the episode ends there (their calls still count, as in TRL). `text` is the last assistant
message's content, what `completion_text` gives the rewards in training. tests/test_episode_parity.py runs TRL's own
loop and this one on the same scripted model and compares them.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grpo_pipeline.agents.episodes import Episode, Message, run_episodes
from grpo_pipeline.agents.failure import run_call
from grpo_pipeline.agents.registry import (
    DEFAULT_USER_LIMITS,
    ToolError,
    UserToolLimits,
    contained_environment,
    load_environment,
    public_methods,
    resolve_tool,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from grpo_pipeline.agents.episodes import GenerateFn


@dataclass(frozen=True)
class ChatToolLoop:
    """The tools an episode may call through the chat template (`grpo.tools` entries), the environment whose
    methods it may call too (`grpo.environment`, a fresh instance per episode, as TRL gives each rollout its own),
    and how many turns of calls."""

    names: tuple[str, ...]
    max_turns: int
    environment: str | None = None
    limits: UserToolLimits = DEFAULT_USER_LIMITS  # how long an environment method may take, how much it may say
    params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, hash=False)  # eval.tool_params

    @functools.cached_property
    def functions(self) -> list[Callable[..., Any]]:
        """The tools as TRL gets them: built-in functions (built from their params), user tools contained
        (agents/registry.py)."""
        return [
            resolve_tool(name, f"eval.tools[{i}]", dict(self.params.get(name) or {}), "eval.tool_params")
            for i, name in enumerate(self.names)
        ]

    @functools.cached_property
    def environment_class(self) -> type | None:
        """The environment class with its tool methods contained, as training gets it (agents/trainer_args.py)."""
        if self.environment is None:
            return None
        return contained_environment(load_environment(self.environment, "eval.environment"), self.limits)

    def tools_of(self, episode: Episode) -> list[Callable[..., Any]]:
        """What `episode` may call: the standalone tools, then its environment instance's methods (TRL's order)."""
        if episode.environment is None:
            return self.functions
        instance = episode.environment
        return self.functions + [getattr(instance, name) for name in public_methods(type(instance))]

    def begin(
        self, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[Any], rows: Sequence[Mapping[str, Any]] | None
    ) -> tuple[list[list[int]], list[Episode]]:
        """Each episode's prompt ids and its Episode. With an environment each episode gets a new instance, reset with
        its row (the prompt as messages, as TRL passes the row); text that reset returns extends the last message, and
        the prompt is rendered with that instance's tools (GRPOTrainer._generate_and_score_completions)."""
        if self.environment_class is None:
            return self.prompt_ids(tokenizer, prompts), [Episode() for _ in prompts]
        if rows is None or len(rows) != len(prompts):
            raise ToolError(f"eval.environment: {self.environment!r} needs each prompt's row to reset an instance with")
        episodes, ids = [], []
        for prompt, row in zip(prompts, rows, strict=True):
            messages = _chat_messages(prompt)
            episode = Episode(environment=self.environment_class())
            observation = episode.environment.reset(**{**row, "prompt": messages})
            if isinstance(observation, str):
                messages = [*messages[:-1], {**messages[-1], "content": messages[-1]["content"] + observation}]
            ids.append(self._render(tokenizer, messages, self.tools_of(episode)))
            episodes.append(episode)
        return ids, episodes

    def prompt_ids(self, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[Any]) -> list[list[int]]:
        """Each chat prompt rendered with the tools' schemas, as GRPOTrainer._tokenize_prompts renders it."""
        return [self._render(tokenizer, _chat_messages(prompt), self.functions) for prompt in prompts]

    def _render(
        self, tokenizer: PreTrainedTokenizerBase, messages: list[Message], tools: list[Callable[..., Any]]
    ) -> list[int]:
        return tokenizer.apply_chat_template(
            messages, tools=tools or None, chat_template=training_template(tokenizer), add_generation_prompt=True,
            tokenize=True, return_dict=False,
        )  # fmt: skip

    def turn_stop(
        self, tokenizer: PreTrainedTokenizerBase, width: int, episodes: list[Episode], may_call: list[bool]
    ) -> None:
        """None: a chat turn ends at its stop token (EOS), as in TRL's generation."""
        return None

    def take(
        self, tokenizer: PreTrainedTokenizerBase, episode: Episode, turn: list[int], context: list[int],
        stop: Sequence[int], may_call: bool,
    ) -> list[Mapping[str, Any]]:  # fmt: skip
        """Append the turn and its message, parsed by TRL's `parse_response` with the tools the prompt was rendered
        with; its tool calls, [] when it asks for none or the turns are spent (a turn-limit hit). A later turn cut
        to nothing adds no message (TRL appends none)."""
        from trl.chat_template_utils import parse_response

        episode.extend(turn, "", by_model=True)
        if not turn and episode.turns:
            return []
        message = parse_response(tokenizer, turn, prefix=context, tools=self.tools_of(episode))
        episode.messages.append(message)
        calls = list(message.get("tool_calls") or [])
        if calls and not may_call:
            episode.hit_turn_limit = True
            return []
        return calls

    def answer(
        self, tokenizer: PreTrainedTokenizerBase, episode: Episode, calls: list[Mapping[str, Any]], max_new_tokens: int
    ) -> bool:
        """Run `calls` and count them; append their tool messages and ids (masked), or, when those would pass
        `max_new_tokens`, nothing, and the episode ends (TRL rolls them back; their calls stay counted)."""
        results = self.run_calls(calls, episode)
        episode.calls += len(results)
        episode.errors += sum(failed for _, _, failed in results)
        messages = [{"role": "tool", "name": name, "content": content} for name, content, _ in results]
        suffix = tool_suffix_ids(tokenizer, messages)
        if len(episode.completion_ids) + len(suffix) > max_new_tokens:
            return False
        episode.turns += 1
        episode.extend(suffix, "", by_model=False)
        episode.messages.extend(messages)
        return True

    def finish(self, episode: Episode) -> None:
        """The episode's text (its last assistant message) and its environment's reward."""
        episode.text = next((m["content"] for m in reversed(episode.messages) if m["role"] == "assistant"), "")
        episode.env_reward = environment_reward(episode)

    def episodes(
        self, generate: GenerateFn, tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]], *,
        max_new_tokens: int, stop: Sequence[int], started: list[Episode] | None = None,
    ) -> list[Episode]:  # fmt: skip
        return run_episodes(generate, tokenizer, prompts, self, max_new_tokens=max_new_tokens, stop=stop,
                            started=started)  # fmt: skip

    def run_calls(
        self, calls: Sequence[Mapping[str, Any]], episode: Episode | None = None
    ) -> list[tuple[str, Any, bool]]:
        """(tool name, content, failed) for each of one turn's calls, as `_tool_call_loop` runs them: the standalone
        tools and `episode`'s environment methods by name, a failure (agents/failure.py: an exception, an unknown tool,
        an unsupported call type) told as `{'error': ...}`, the coroutine tools' results after the others (TRL
        gathers them last); content as TRL puts it in the tool message (`str(result)`, or its content blocks)."""
        by_name = {fn.__name__: fn for fn in (self.tools_of(episode) if episode else self.functions)}
        done: list[tuple[str, Any, bool]] = []
        pending: list[tuple[str, Any]] = []
        for call in calls:
            if call.get("type") != "function":
                done.append((call.get("name", "unknown"), {"error": f"Unsupported tool call type: {call.get('type')}"},
                             True))  # fmt: skip
                continue
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            fn = by_name.get(name, _unknown(name))
            result, failure = run_call(fn, arguments)
            if failure is not None:
                done.append((name, {"error": str(failure)}, True))
            elif inspect.iscoroutine(result):
                pending.append((name, result))
            else:
                done.append((name, result, False))
        if pending:
            gathered = asyncio.run(_gather([coroutine for _, coroutine in pending]))
            for (name, _), r in zip(pending, gathered, strict=True):
                done.append((name, {"error": str(r)}, True) if isinstance(r, Exception) else (name, r, False))
        return [(name, r if isinstance(r, list) else str(r), failed) for name, r, failed in done]

    def call(self, call: Mapping[str, Any], episode: Episode | None = None) -> tuple[str, Any, bool]:
        """(tool name, content, failed) for one parsed tool call of `episode` (`run_calls`)."""
        (result,) = self.run_calls([call], episode)
        return result


def _unknown(name: str) -> Callable[..., Any]:
    """A tool that fails as TRL fails a call of a tool it does not have."""

    def unknown(**arguments: Any) -> Any:
        raise ValueError(f"Tool {name} not found.")

    return unknown


async def _gather(coroutines: list[Any]) -> list[Any]:
    return await asyncio.gather(*coroutines, return_exceptions=True)


def _chat_messages(prompt: Any) -> list[Message]:
    """A chat prompt's messages, or ToolError: TRL's loop reads tool calls from assistant messages only."""
    if not isinstance(prompt, list):
        raise ToolError(
            "eval.tools: tool calls through the chat template need chat prompts (TRL's loop reads tool calls from "
            "assistant messages only); set data.prompt_format=chat"
        )
    return prompt


def environment_reward(episode: Episode) -> float | None:
    """The episode's environment's `get_reward()` once it has ended (awaited when it is a coroutine), as TRL scores
    a rollout; None without an environment or without `get_reward`. A failure there is the environment's and raises."""
    get_reward = getattr(episode.environment, "get_reward", None)
    if get_reward is None:
        return None
    reward = asyncio.run(get_reward()) if inspect.iscoroutinefunction(get_reward) else get_reward()
    return None if reward is None else float(reward)


def training_template(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The chat template GRPOTrainer trains with: the model's own (None) where appending a tool message leaves
    earlier turns unchanged, else TRL's patched one (GRPOTrainer.__init__)."""
    from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving

    return None if is_chat_template_prefix_preserving(tokenizer) else get_training_chat_template(tokenizer)


def tool_suffix_ids(tokenizer: PreTrainedTokenizerBase, tool_messages: list[Message]) -> list[int]:
    """The ids the template renders for `tool_messages` after an assistant turn, up to the next assistant header:
    GRPOTrainer._get_tool_suffix_ids (a dummy exchange rendered with and without them; the prefix cut at its EOS)."""
    calls = [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]
    dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": calls}]
    template = training_template(tokenizer)
    prefix = tokenizer.apply_chat_template(dummy, add_generation_prompt=False, tokenize=True, chat_template=template,
                                           return_dict=False)  # fmt: skip
    full = tokenizer.apply_chat_template(dummy + tool_messages, add_generation_prompt=True, tokenize=True,
                                         chat_template=template, return_dict=False)  # fmt: skip
    ends = [i for i, t in enumerate(prefix) if t == tokenizer.eos_token_id]
    prefix = prefix[: ends[-1] + 1] if ends else prefix
    if full[: len(prefix)] != prefix:
        raise ToolError("eval.tools: the chat template renders a tool exchange whose prefix is not its own prefix")
    return full[len(prefix) :]


def turn_limit_hits(completions: Sequence[Any], max_turns: int) -> list[bool] | None:
    """Per completion of TRL's loop (a list of messages), whether it still called a tool when `max_turns` turns of
    calls had been answered; None when the completions are not message lists (no tool loop ran)."""
    if not completions or not all(isinstance(c, list) for c in completions):
        return None
    hits = []
    for messages in completions:
        answered = sum(
            1
            for m, after in itertools.pairwise(messages)
            if m.get("role") == "assistant" and m.get("tool_calls") and after.get("role") == "tool"
        )
        last = messages[-1] if messages else {}
        hits.append(bool(last.get("role") == "assistant" and last.get("tool_calls")) and answered >= max_turns)
    return hits
