"""The one episode loop: a prompt, the model's turn, the calls it asks for run and their results appended (masked
out of the loss), the next turn, until the model stops calling, the turns are spent or the token budget is.

Every path that generates tool episodes runs `run_episodes`: the text rollout that trains the tiny model
(agents/text_tools.py, TRL's `rollout_func`), evaluation, the probes, the difficulty filter and the rehearsal's
demonstrations. How a turn is stopped, parsed and answered is the loop's `EpisodeLoop` (a strategy, not a second
loop): `TextToolLoop` (calls written as `<<expression=`) or `ChatToolLoop` (calls through the chat template, TRL
1.16's `GRPOTrainer._tool_call_loop` step for step; tests/test_episode_parity.py runs TRL's loop and this one on the
same scripted model and compares the conversations, ids, masks and counts). Calls and failed calls are counted as
TRL counts them (agents/failure.py), so training's `tools/failure_frequency` and evaluation's mean the same.

Prompts are in the form TRL hands a `rollout_func`: text, or a list of messages.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

Message = dict[str, Any]
# (rows of new token ids) from (rows of prefix ids, the most tokens any row may add, a StoppingCriteria or None)
GenerateFn = Callable[[list[list[int]], int, Any], list[list[int]]]


@dataclass
class Episode:
    """One completion with its tool results: `env_mask` is 1 on the model's tokens and 0 on inserted ones."""

    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    text: str = ""
    calls: int = 0  # tool calls run (TRL's tool_call_count)
    errors: int = 0  # of those, the failed ones (TRL's tool_failure_count; agents/failure.py)
    turns: int = 0  # turns of calls answered (TRL's iterations); the text loop answers one call a turn
    hit_turn_limit: bool = False  # asked for a call when no turn was left (the call was not run)
    messages: list[Message] = field(default_factory=list)  # a chat episode's turns (agents/chat_tools.py)
    environment: Any = None  # the episode's own grpo.environment instance, reset with its row (agents/chat_tools.py)
    env_reward: float | None = None  # that instance's get_reward() when the episode ended; None without one

    def extend(self, ids: Sequence[int], text: str, by_model: bool) -> None:
        self.completion_ids.extend(ids)
        self.env_mask.extend([int(by_model)] * len(ids))
        self.text += text


class EpisodeLoop(Protocol):
    """How one kind of episode renders, stops, parses and answers a turn; `run_episodes` is the loop itself."""

    max_turns: int

    def begin(
        self, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[Any], rows: Sequence[Mapping[str, Any]] | None
    ) -> tuple[list[list[int]], list[Episode]]:
        """Each prompt's ids and its empty Episode (`rows`: the prompts' dataset rows, for an environment)."""
        ...

    def prompt_ids(self, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[Any]) -> list[list[int]]:
        """Each prompt's ids, as training renders it."""
        ...

    def turn_stop(
        self, tokenizer: PreTrainedTokenizerBase, width: int, episodes: list[Episode], may_call: list[bool]
    ) -> Any:
        """A StoppingCriteria that ends a row's turn early (rows padded to `width`), or None: turns end at a stop."""
        ...

    def take(
        self, tokenizer: PreTrainedTokenizerBase, episode: Episode, turn: list[int], context: list[int],
        stop: Sequence[int], may_call: bool,
    ) -> list[Any]:  # fmt: skip
        """Append the model's `turn` (cut at its stop token and the budget) to `episode`; the calls it asks for,
        [] when none or when it may not call (a turn-limit hit)."""
        ...

    def answer(
        self, tokenizer: PreTrainedTokenizerBase, episode: Episode, calls: list[Any], max_new_tokens: int
    ) -> bool:
        """Run `calls` and append their results; False when the episode ends here instead (no room for them)."""
        ...

    def finish(self, episode: Episode) -> None:
        """Whatever is read off a whole episode (its final text, its environment's reward)."""
        ...


def run_episodes(
    generate: GenerateFn,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[int]],
    loop: EpisodeLoop,
    *,
    max_new_tokens: int,
    stop: Sequence[int],
    started: list[Episode] | None = None,
) -> list[Episode]:
    """One episode per prompt (token ids, from `loop.begin` or `loop.prompt_ids`; `started`: their episodes, else
    new ones). Each round generates a turn for every active row from its prompt and episode so far, cuts it at its
    first stop token and at what is left of `max_new_tokens` (every token, the model's and the tools', counts, as in
    TRL), lets `loop` take it and answer its calls; a row goes on while it called, was answered and has budget left."""
    episodes = started if started is not None else [Episode() for _ in prompts]
    active = list(range(len(prompts)))
    while active:
        contexts = [prompts[i] + episodes[i].completion_ids for i in active]
        budgets = [max_new_tokens - len(episodes[i].completion_ids) for i in active]
        may_call = [episodes[i].turns < loop.max_turns for i in active]
        criteria = loop.turn_stop(tokenizer, max(map(len, contexts)), [episodes[i] for i in active], may_call)
        new_rows = generate(contexts, max(budgets), criteria)
        still = []
        for i, context, budget, new, may in zip(active, contexts, budgets, new_rows, may_call, strict=True):
            episode = episodes[i]
            calls = loop.take(tokenizer, episode, completion_ids(new, stop)[:budget], context, stop, may)
            answered = bool(calls) and loop.answer(tokenizer, episode, calls, max_new_tokens)
            if answered and len(episode.completion_ids) < max_new_tokens:
                still.append(i)
        active = still
    for episode in episodes:
        loop.finish(episode)
    return episodes


def completion_ids(generated: Sequence[int], stop: Sequence[int]) -> list[int]:
    """The generated tokens up to and including the first stop token: the `completion_ids` TRL passes to rewards
    (GRPOTrainer masks everything after the first EOS), so padding after it is not counted."""
    ids = list(generated)
    ends = [i for i, t in enumerate(ids) if t in stop]
    return ids[: ends[0] + 1] if ends else ids


def prompt_ids(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str | list[Message]]) -> list[list[int]]:
    """Each prompt's token ids as TRL's GRPOTrainer tokenizes it: text with the tokenizer's special tokens (the BOS
    a Llama-type tokenizer adds), messages as the chat template renders them up to the assistant's turn, without
    adding any (a template writes its own BOS)."""
    ids = []
    for prompt in prompts:
        if isinstance(prompt, str):
            ids.append(tokenizer(prompt)["input_ids"])
        else:
            text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
            ids.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return ids


def hf_generate(model: Any, pad: int | None, **settings: Any) -> GenerateFn:
    """A GenerateFn over transformers' `model.generate(**settings)`: rows left-padded as TRL pads them
    (`_generate_single_turn`), the loop's stopping criterion added when it gives one."""
    import torch
    from transformers import StoppingCriteriaList
    from trl.trainer.utils import pad as pad_left

    def generate(rows: list[list[int]], max_new_tokens: int, criteria: Any) -> list[list[int]]:
        tensors = [torch.tensor(row) for row in rows]
        ids = pad_left(tensors, padding_value=pad or 0, padding_side="left")  # masked out either way
        mask = pad_left([torch.ones_like(t) for t in tensors], padding_value=0, padding_side="left")
        kwargs = {**settings, "max_new_tokens": max_new_tokens}
        if criteria is not None:  # the text loop's stop at an open call; chat turns end at their EOS
            kwargs["stopping_criteria"] = StoppingCriteriaList([criteria])
        with torch.no_grad():
            out = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device), **kwargs)
        return out[:, ids.shape[1] :].tolist()

    return generate


def episode_stats(episodes: Sequence[Episode], prefix: str = "tools/") -> dict[str, float]:
    """Per episode: tool calls (`call_frequency`, TRL's name), the share that called at least once (`used_share`),
    failed calls per call (`failure_frequency`, TRL's name and definition; 0.0 without calls) and the share that
    asked for a call past the turn limit (`turn_limit_share`); with an environment that scores its episodes
    (`get_reward`), the mean of their rewards (`environment_reward`, absent when none was scored)."""
    n = len(episodes)
    if not n:
        return {}
    calls = sum(e.calls for e in episodes)
    stats = {
        f"{prefix}call_frequency": calls / n,
        f"{prefix}used_share": sum(e.calls > 0 for e in episodes) / n,
        f"{prefix}failure_frequency": sum(e.errors for e in episodes) / calls if calls else 0.0,
        f"{prefix}turn_limit_share": sum(e.hit_turn_limit for e in episodes) / n,
    }
    rewards = [e.env_reward for e in episodes if e.env_reward is not None]
    if rewards:
        stats[f"{prefix}environment_reward"] = sum(rewards) / len(rewards)
    return stats


def conversation(episode: Episode, tokenizer: PreTrainedTokenizerBase) -> list[Message]:
    """The episode as messages: a chat episode's own; a text episode's model and tool segments (by `env_mask`) as
    assistant and tool turns, so that one table shows both kinds."""
    if episode.messages:
        return episode.messages
    turns: list[Message] = []
    start = 0
    for end in range(1, len(episode.env_mask) + 1):
        if end == len(episode.env_mask) or episode.env_mask[end] != episode.env_mask[start]:
            text = tokenizer.decode(episode.completion_ids[start:end], skip_special_tokens=True)
            turns.append({"role": "assistant" if episode.env_mask[start] else "tool", "content": text})
            start = end
    return turns
