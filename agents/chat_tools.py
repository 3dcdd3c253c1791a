"""Tool episodes through the chat template, for evaluation, the probe and the difficulty filter of a policy that TRL's
own loop trained (a model whose chat template carries tool calls: Qwen2.5-Instruct and the others of docs/agents.md).

Training runs TRL 1.16's loop (`GRPOTrainer._tool_call_loop`); scoring the policy on single completions would score
something it was never trained to produce (a tool call, not an answer). So this module runs the same loop outside
the trainer, step for step as TRL does it: the prompt rendered with the tools' schemas (`apply_chat_template(tools=)`,
with TRL's training template where the model's own is not prefix-preserving), each completion parsed with TRL's
`parse_response` (the tokenizer's response template, arguments typed by the tools' schemas), every call run, the tool
messages appended as ids (the template's suffix for them, TRL's `_get_tool_suffix_ids`), one more completion
generated, at most `max_turns` times; a tool result that would pass the token budget is rolled back and the episode
ends there. Episodes are `text_tools.Episode`s, so the counts (calls, errors, turn-limit hits) and the tables are the
text loop's; `text` is the last assistant message's content, what `completion_text` gives the rewards in training.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

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

    from grpo_pipeline.agents.text_tools import Episode, GenerateFn

Message = dict[str, Any]


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
        from grpo_pipeline.agents.text_tools import Episode

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

    def episodes(
        self, generate: GenerateFn, tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]], *,
        max_new_tokens: int, stop: Sequence[int], started: list[Episode] | None = None,
    ) -> list[Episode]:  # fmt: skip
        return run_chat_episodes(generate, tokenizer, prompts, self, max_new_tokens=max_new_tokens, stop=stop,
                                 started=started)  # fmt: skip

    def call(self, call: Mapping[str, Any], episode: Episode | None = None) -> tuple[str, str, bool]:
        """(tool name, result text, failed) for one parsed tool call of `episode` (its environment's methods too), as
        `_tool_call_loop` runs it: an exception or an unknown tool becomes `{'error': ...}`; a tool's own refusal
        (`error: ...`, also a contained method that raised or did not return in time) counts as failed too."""
        by_name = {fn.__name__: fn for fn in (self.tools_of(episode) if episode else self.functions)}
        if call.get("type") != "function":
            return call.get("name", "unknown"), str({"error": f"Unsupported tool call type: {call.get('type')}"}), True
        name, arguments = call["function"]["name"], call["function"].get("arguments") or {}
        try:
            if name not in by_name:
                raise ValueError(f"Tool {name} not found.")
            result = str(by_name[name](**arguments))
        except Exception as e:  # TRL's loop turns any exception into the message the model reads
            return name, str({"error": str(e)}), True
        return name, result, result.startswith("error")


def _chat_messages(prompt: Any) -> list[Message]:
    """A stored chat prompt as messages, or ToolError: TRL's loop reads tool calls from assistant messages only."""
    from grpo_pipeline.tasks.core.chat import decode_messages

    messages = decode_messages(prompt)
    if messages is None:
        raise ToolError(
            "eval.tools: tool calls through the chat template need chat prompts (TRL's loop reads tool calls from "
            "assistant messages only); set data.prompt_format=chat"
        )
    return messages


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


def run_chat_episodes(
    generate: GenerateFn,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[int]],
    loop: ChatToolLoop,
    *,
    max_new_tokens: int,
    stop: Sequence[int],
    started: list[Episode] | None = None,
) -> list[Episode]:
    """One episode per prompt (ids rendered by `loop.begin`, with `started` its episodes, or by `loop.prompt_ids`),
    TRL's `_tool_call_loop` outside the trainer: parse each completion; for those with tool calls run them, append
    the tool messages' ids (masked) and generate again, at most `loop.max_turns` times. A result that would pass
    `max_new_tokens` is rolled back and the episode ends; an episode still calling when the turns are spent is a
    turn-limit hit. An episode with an environment is scored by its `get_reward()` at the end (`env_reward`)."""
    from grpo_pipeline.agents.text_tools import Episode

    episodes = started if started is not None else [Episode() for _ in prompts]
    active = list(range(len(prompts)))
    _generate_turn(generate, tokenizer, prompts, episodes, active, loop, max_new_tokens, stop)
    active = [i for i in active if _pending_calls(episodes[i])]
    for _ in range(loop.max_turns):
        active = [i for i in active if _answer_calls(tokenizer, episodes[i], loop, max_new_tokens)]
        if not active:
            break
        _generate_turn(generate, tokenizer, prompts, episodes, active, loop, max_new_tokens, stop)
        active = [i for i in active if _pending_calls(episodes[i])]
    else:
        for i in active:  # the turns are spent and the last turn calls again: the call is not run
            episodes[i].hit_turn_limit = True
    for episode in episodes:
        episode.text = next((m["content"] for m in reversed(episode.messages) if m["role"] == "assistant"), "")
        episode.env_reward = environment_reward(episode)
    return episodes


def _generate_turn(
    generate: GenerateFn, tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]], episodes: list[Episode],
    rows: list[int], loop: ChatToolLoop, max_new_tokens: int, stop: Sequence[int],
) -> None:  # fmt: skip
    """One assistant turn for each of `rows`: generated from prompt + episode so far, cut at its first stop token and
    at the budget (as TRL cuts a post-tool turn), parsed by TRL's `parse_response` and appended to the episode."""
    from trl.chat_template_utils import parse_response

    from grpo_pipeline.tasks.scoring.generation import completion_ids

    contexts = [prompts[i] + episodes[i].completion_ids for i in rows]
    budgets = [max_new_tokens - len(episodes[i].completion_ids) for i in rows]
    new_rows = generate(contexts, max(budgets), None)
    for i, context, budget, new in zip(rows, contexts, budgets, new_rows, strict=True):
        ids = completion_ids(new, stop)[:budget]
        episodes[i].extend(ids, "", by_model=True)
        if ids:  # TRL appends no message for a turn cut to nothing
            tools = loop.tools_of(episodes[i])
            episodes[i].messages.append(parse_response(tokenizer, ids, prefix=context, tools=tools))


def _pending_calls(episode: Episode) -> list[Mapping[str, Any]]:
    """The tool calls of the episode's last message when it is an assistant turn that asks for them."""
    last = episode.messages[-1] if episode.messages else {}
    return list(last.get("tool_calls") or []) if last.get("role") == "assistant" else []


def _answer_calls(tokenizer: PreTrainedTokenizerBase, episode: Episode, loop: ChatToolLoop, budget: int) -> bool:
    """Run the episode's pending calls and append their tool messages (ids masked out); False, with nothing
    appended, when the results would pass the token budget (TRL rolls them back and ends the episode)."""
    results = [loop.call(call, episode) for call in _pending_calls(episode)]
    messages = [{"role": "tool", "name": name, "content": content} for name, content, _ in results]
    suffix = tool_suffix_ids(tokenizer, messages)
    if len(episode.completion_ids) + len(suffix) > budget:
        return False
    episode.calls += len(results)
    episode.errors += sum(failed for _, _, failed in results)
    episode.extend(suffix, "", by_model=False)
    episode.messages.extend(messages)
    return True


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
