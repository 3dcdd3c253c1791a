"""Tool calls written as plain text, for a model whose chat template cannot carry them (the embedded char-level model).

TRL's own loop (`GRPOTrainer(tools=)`) needs a chat template with tool branches and a response parser
(docs/agents.md); the tiny model has neither, and a JSON call would cost it ~70 tokens to learn. So it calls the
calculator as GSM8K's annotations do (Cobbe et al. 2021, sec. 2 and appendix: `<<48+24=72>>`, filled in by the
sampler): the model writes `<<48213+90977=`, the loop runs `calculator("48213+90977")`, appends `139190>>` and lets the
model go on (`...139190>>139190</s>`), at most `max_turns` calls per episode. The inserted result is masked out of the
loss (`env_mask` 0): the policy is never trained to write what the tool wrote.

One loop (`run_episodes`) serves training (`text_tool_rollout`, TRL's `rollout_func`), evaluation and the probe
(tasks/scoring/evaluation.py, tasks/training/probe.py), so the accuracy they report is that of the episodes GRPO
trained on. Each episode records its tool calls, tool errors and whether it wrote a call past the turn limit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grpo_pipeline.agents.calculator import calculator
from grpo_pipeline.agents.registry import ToolError
from grpo_pipeline.configs.grpo import GRPOStageConfig
from grpo_pipeline.rewards.math import TOOL_RESULT_END

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from grpo_pipeline.agents.chat_tools import ChatToolLoop

logger = logging.getLogger(__name__)

CALL_OPEN, CALL_END = "<<", "="  # `<<expression=` asks for a result; the loop writes it and TOOL_RESULT_END
TEXT_TOOLS: dict[str, Callable[[str], str]] = {"calculator": calculator}  # tools that take one string

# (rows of new token ids) from (rows of prefix ids, the most tokens any row may add, a StoppingCriteria or None)
GenerateFn = Callable[[list[list[int]], int, Any], list[list[int]]]


@dataclass(frozen=True)
class TextToolLoop:
    """The tool an episode may call in text (`<<expression=`) and how many calls an episode may make."""

    name: str
    max_turns: int

    def call(self, expression: str) -> str:
        """The tool's answer to `expression`; the built-in tools return errors as text (`error: ...`)."""
        return TEXT_TOOLS[self.name](expression)

    def prompt_ids(self, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[Any]) -> list[list[int]]:
        """Each prompt's ids as training tokenizes it (the tools are not described: the SFT data taught the call)."""
        from grpo_pipeline.tasks.scoring.generation import prompt_ids

        return prompt_ids(tokenizer, prompts)

    def begin(
        self, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[Any], rows: Sequence[Mapping[str, Any]] | None
    ) -> tuple[list[list[int]], list[Episode]]:
        """Each episode's prompt ids and its empty Episode (the text loop has no environment: `rows` are unused)."""
        return self.prompt_ids(tokenizer, prompts), [Episode() for _ in prompts]

    def episodes(
        self, generate: GenerateFn, tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]], *,
        max_new_tokens: int, stop: Sequence[int], started: list[Episode] | None = None,
    ) -> list[Episode]:  # fmt: skip
        return run_episodes(generate, tokenizer, prompts, self, max_new_tokens=max_new_tokens, stop=stop,
                            started=started)  # fmt: skip


@dataclass
class Episode:
    """One completion with its tool results: `env_mask` is 1 on the model's tokens and 0 on inserted ones."""

    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    text: str = ""
    calls: int = 0
    errors: int = 0
    hit_turn_limit: bool = False  # wrote a call when no turn was left (the call was not run)
    messages: list[dict[str, Any]] = field(default_factory=list)  # a chat episode's turns (agents/chat_tools.py)
    environment: Any = None  # the episode's own grpo.environment instance, reset with its row (agents/chat_tools.py)
    env_reward: float | None = None  # that instance's get_reward() when the episode ended; None without one

    def extend(self, ids: Sequence[int], text: str, by_model: bool) -> None:
        self.completion_ids.extend(ids)
        self.env_mask.extend([int(by_model)] * len(ids))
        self.text += text


def text_tool_loop(tools: Sequence[str], max_turns: int, field_name: str = "grpo.tools") -> TextToolLoop | None:
    """The text loop for `tools` (None without tools), or ToolError naming the field and the fix."""
    if not tools:
        return None
    if len(tools) != 1 or tools[0] not in TEXT_TOOLS:
        raise ToolError(
            f"{field_name}: {list(tools)} on a model whose chat template cannot carry tool calls: the text call syntax "
            f"'{CALL_OPEN}expression{CALL_END}' runs one tool that takes one string ({', '.join(TEXT_TOOLS)}); set "
            f"{field_name}=[calculator], or use a model whose chat template carries tool calls"
        )
    return TextToolLoop(tools[0], max_turns)


def needs_text_loop(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether tool calls must be written in text: the chat template cannot carry them (TRL's own check)."""
    from trl.chat_template_utils import supports_tool_calling

    return getattr(tokenizer, "chat_template", None) is None or not supports_tool_calling(tokenizer)


def open_call(text: str) -> str | None:
    """The expression of the call `text` ends in (`...<<12+7=` -> `12+7`), or None when it ends in none."""
    start = text.rfind(CALL_OPEN)
    if start < 0 or not text.endswith(CALL_END) or len(text) - start < len(CALL_OPEN) + len(CALL_END):
        return None
    expression = text[start + len(CALL_OPEN) : -len(CALL_END)]
    return None if TOOL_RESULT_END in expression else expression


@dataclass(frozen=True)
class CallWatch:
    """Which rows of one generation pass must stop: a row whose completion (`before[row]`, then the ids it generated
    in this pass) ends in an open call while it may still call (`may_call[row]`)."""

    tokenizer: Any
    before: list[str]
    may_call: list[bool]

    def ends_call(self, row: int, new: Sequence[int]) -> bool:
        """Whether `new` (the row's ids of this pass) ends in an open call it may make; only decoded when its last
        token contains CALL_END."""
        if not self.may_call[row] or not new or CALL_END not in self.tokenizer.decode(list(new[-1:])):
            return False
        return open_call(self.before[row] + self.tokenizer.decode(list(new), skip_special_tokens=True)) is not None


def call_end_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The ids of the vocabulary's tokens whose text contains CALL_END: where a generator without a stopping
    criterion (vLLM) must pause to ask `CallWatch` whether a call was opened."""
    return [i for i in range(len(tokenizer)) if CALL_END in tokenizer.decode([i])]


def call_stop(tokenizer: PreTrainedTokenizerBase, width: int, before: list[str], may_call: list[bool]) -> Any:
    """A StoppingCriteria that ends a row when its completion (`before`, then what it generated past `width`) ends in
    an open call and it may still call (`CallWatch`, kept as its `watch` for generators that cannot take it)."""
    import torch
    from transformers import StoppingCriteria

    watch = CallWatch(tokenizer, before, may_call)

    class CallStop(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
            done = [watch.ends_call(r, input_ids[r, width:].tolist()) for r in range(input_ids.shape[0])]
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    stop = CallStop()
    stop.watch = watch
    return stop


def run_episodes(
    generate: GenerateFn,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[int]],
    loop: TextToolLoop,
    *,
    max_new_tokens: int,
    stop: Sequence[int],
    started: list[Episode] | None = None,
) -> list[Episode]:
    """One episode per prompt (token ids): generate until a stop token, the budget or an open call; run each call,
    append its result and `>>` (masked), and generate again for those rows, up to `loop.max_turns` calls. Every
    token, the model's and the tool's, counts against `max_new_tokens` (a result past it is cut, as TRL cuts one).
    `started`: the episodes to fill (`TextToolLoop.begin`), else new ones."""
    episodes = started if started is not None else [Episode() for _ in prompts]
    active = list(range(len(prompts)))
    while active:
        budgets = [max_new_tokens - len(episodes[i].completion_ids) for i in active]
        may_call = [episodes[i].calls < loop.max_turns for i in active]
        rows = [prompts[i] + episodes[i].completion_ids for i in active]
        width = max(map(len, rows))
        criteria = call_stop(tokenizer, width, [episodes[i].text for i in active], may_call)
        new_rows = generate(rows, max(budgets), criteria)
        still = []
        for i, budget, new, may in zip(active, budgets, new_rows, may_call, strict=True):
            episode = episodes[i]
            expression = _take(tokenizer, episode, new[:budget], stop, may)
            if expression is None:
                continue
            result = loop.call(expression)
            episode.calls += 1
            episode.errors += result.startswith("error")
            inserted = tokenizer(result + TOOL_RESULT_END, add_special_tokens=False)["input_ids"]
            inserted = inserted[: max_new_tokens - len(episode.completion_ids)]
            episode.extend(inserted, tokenizer.decode(inserted), by_model=False)
            if len(episode.completion_ids) < max_new_tokens:
                still.append(i)
        active = still
    return episodes


def _take(
    tokenizer: PreTrainedTokenizerBase, episode: Episode, new: Sequence[int], stop: Sequence[int], may_call: bool
) -> str | None:
    """Append the model's tokens of one pass to `episode`, up to and including a stop token or the `=` of an open
    call; return that call's expression when the episode may call (else note a call past the turn limit)."""
    for token in new:
        piece = "" if token in stop else tokenizer.decode([token], skip_special_tokens=True)
        episode.extend([token], piece, by_model=True)
        if token in stop:
            return None
        if CALL_END in piece and (expression := open_call(episode.text)) is not None:
            if may_call:
                return expression
            episode.hit_turn_limit = True
    return None


def hf_generate(model: Any, pad: int | None, **settings: Any) -> GenerateFn:
    """A GenerateFn over transformers' `model.generate(**settings)`: rows left-padded, the call stop added (when
    the loop gives one)."""
    import torch
    from transformers import StoppingCriteriaList

    from grpo_pipeline.tasks.scoring.generation import left_padded

    def generate(rows: list[list[int]], max_new_tokens: int, criteria: Any) -> list[list[int]]:
        enc = {k: v.to(model.device) for k, v in left_padded(rows, pad).items()}
        kwargs = {**settings, "max_new_tokens": max_new_tokens}
        if criteria is not None:  # the text loop's stop at an open call; chat turns end at their EOS
            kwargs["stopping_criteria"] = StoppingCriteriaList([criteria])
        with torch.no_grad():
            out = model.generate(**enc, **kwargs)
        return out[:, enc["input_ids"].shape[1] :].tolist()

    return generate


def text_tool_rollout(loop: TextToolLoop) -> Callable[[list[Any], Any], dict[str, Any]]:
    """TRL's `rollout_func(prompts, trainer)` over `run_episodes`: one episode per prompt it is given (TRL's sampler
    already repeats each prompt `num_generations` times), generated by the policy in the training process with the
    trainer's own sampling settings. `logprobs` is None, as in TRL's own transformers path: they only correct vLLM's
    sampler. Extra keys reach the rewards as columns: `tool_calls`, `tool_errors`, `tool_turn_limit`."""

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        from trl.models import unwrap_model_for_generation

        from grpo_pipeline.tasks.scoring.generation import prompt_ids

        if trainer.use_vllm:
            raise ToolError("grpo.use_vllm: text tool calls are generated with transformers; set grpo.use_vllm=false")
        tokenizer = trainer.processing_class
        ids = prompt_ids(tokenizer, prompts)
        unwrap = {"gather_deepspeed3_params": trainer.args.ds3_gather_for_generation,
                  "generation_kwargs": trainer.generation_kwargs,
                  "gradient_checkpointing_kwargs": trainer.args.gradient_checkpointing_kwargs}  # fmt: skip
        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator, **unwrap) as model:
            generate = hf_generate(model, tokenizer.pad_token_id, generation_config=trainer.generation_config)
            episodes = run_episodes(
                generate, tokenizer, ids, loop, max_new_tokens=trainer.max_completion_length,
                stop=trainer.eos_token_ids,
            )  # fmt: skip
        mode = "train" if trainer.model.training else "eval"
        for name, value in episode_stats(episodes).items():  # logged with TRL's own metrics (tools/call_frequency)
            trainer._metrics[mode][name].append(value)
        return {
            "prompt_ids": ids,
            "completion_ids": [e.completion_ids for e in episodes],
            "logprobs": None,
            "env_mask": [e.env_mask for e in episodes],
            "tool_calls": [e.calls for e in episodes],
            "tool_errors": [e.errors for e in episodes],
            "tool_turn_limit": [e.hit_turn_limit for e in episodes],
        }

    return rollout


def episode_stats(episodes: Sequence[Episode], prefix: str = "tools/") -> dict[str, float]:
    """Per episode: tool calls (`call_frequency`, TRL's name), the share that called at least once (`used_share`),
    failed calls per call (`failure_frequency`, TRL's name; 0.0 without calls) and the share that wrote a call past
    the turn limit (`turn_limit_share`); with an environment that scores its episodes (`get_reward`), the mean of
    their rewards (`environment_reward`, absent when none was scored)."""
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


def text_rollout_kwargs(cfg: GRPOStageConfig, tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    """GRPOTrainer's `rollout_func=` for grpo.tools on a model whose chat template cannot carry tool calls; {}
    otherwise (no tools, or TRL's own loop runs them: `trainer_args.trainer_agent_kwargs`, which also refuses an
    environment on such a model, since environments need TRL's loop)."""
    if cfg.environment is not None or not cfg.tools or not needs_text_loop(tokenizer):
        return {}
    loop = text_tool_loop(cfg.tools, cfg.max_tool_turns)
    return {"rollout_func": text_tool_rollout(loop)} if loop else {}


def eval_tool_loop(
    tools: Sequence[str] | None,
    max_turns: int | None,
    tokenizer: Any,
    environment: str | None = None,
    tool_params: Mapping[str, Mapping[str, Any]] | None = None,
) -> TextToolLoop | ChatToolLoop | None:
    """The loop evaluation, the probes and the difficulty filter run for `tools`, their `tool_params` and
    `environment` (eval.tools, eval.tool_params and eval.environment, grpo's) on this tokenizer's model, the one
    training runs: in text where the chat template cannot carry tool calls, else TRL's loop through the chat template
    (agents/chat_tools.py), with a fresh environment instance per episode. None without tools or an environment."""
    from grpo_pipeline.agents.chat_tools import ChatToolLoop
    from grpo_pipeline.agents.trainer_args import check_tokenizer

    if not tools and environment is None:
        return None
    if needs_text_loop(tokenizer):
        if environment is not None:
            raise ToolError(
                f"eval.environment: {environment!r} runs through TRL's tool loop, which needs a chat template that "
                "carries tool calls, and this model's cannot; use such a model, or set eval.tools=[] to score single "
                "completions"
            )
        return text_tool_loop(tools or [], max_turns or 1, "eval.tools")
    check_tokenizer(tokenizer)  # sets TRL's response template, as GRPOTrainer does
    return ChatToolLoop(tuple(tools or ()), max_turns or 1, environment, params=dict(tool_params or {}))


def conversation(episode: Episode, tokenizer: PreTrainedTokenizerBase) -> list[dict[str, Any]]:
    """The episode as messages: a chat episode's own; a text episode's model and tool segments (by `env_mask`) as
    assistant and tool turns, so that one table shows both kinds."""
    if episode.messages:
        return episode.messages
    turns: list[dict[str, Any]] = []
    start = 0
    for end in range(1, len(episode.env_mask) + 1):
        if end == len(episode.env_mask) or episode.env_mask[end] != episode.env_mask[start]:
            text = tokenizer.decode(episode.completion_ids[start:end], skip_special_tokens=True)
            turns.append({"role": "assistant" if episode.env_mask[start] else "tool", "content": text})
            start = end
    return turns


class EpisodeGenerator:
    """`generate_with_ids`'s contract (tasks/scoring/generation.py) over tool episodes: each call returns the
    episodes' texts and ids per prompt, and keeps the episodes themselves in `runs` (one list per call). `rows`
    (the prompts' dataset rows, in order) reset an environment's instances; every call then gets those prompts."""

    def __init__(
        self, model: Any, tokenizer: Any, loop: TextToolLoop | ChatToolLoop,
        rows: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:  # fmt: skip
        self.model, self.tokenizer, self.loop, self.rows = model, tokenizer, loop, rows
        self.runs: list[list[list[Episode]]] = []

    def __call__(
        self, prompts: Sequence[Any], *, max_new_tokens: int, batch_size: int, n: int = 1,
        temperature: float | None = None, top_p: float = 1.0, desc: str = "episodes",
    ) -> tuple[list[list[str]], list[list[list[int]]]]:  # fmt: skip
        from grpo_pipeline.tasks.scoring.generation import require_temperature

        require_temperature(n, temperature)
        generate, stop = self.turns(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
        return self.run(generate, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size, n=n, stop=stop,
                        desc=desc)  # fmt: skip

    def turns(self, *, max_new_tokens: int, temperature: float | None, top_p: float) -> tuple[GenerateFn, list[int]]:
        """What generates each turn (transformers' generate with these settings, one sample per row) and the stop
        tokens that end a turn; a subclass may generate otherwise (tasks/scoring/vllm_episodes.py)."""
        from grpo_pipeline.tasks.scoring.generation import generation_kwargs, stop_token_ids

        stop = stop_token_ids(self.model, self.tokenizer)
        pad = self.tokenizer.pad_token_id
        settings = generation_kwargs(max_new_tokens=max_new_tokens, n=1, temperature=temperature, top_p=top_p,
                                     pad=pad, stop=stop)  # fmt: skip
        return hf_generate(self.model, pad, **settings), stop

    def run(
        self, generate: GenerateFn, prompts: Sequence[Any], *, max_new_tokens: int, batch_size: int, n: int,
        stop: Sequence[int], desc: str,
    ) -> tuple[list[list[str]], list[list[list[int]]]]:  # fmt: skip
        """`n` episodes per prompt (prompt i's are i*n..), generated by `generate` in batches of `batch_size`."""
        if self.rows is not None and len(self.rows) != len(prompts):
            raise ValueError(f"{desc}: {len(prompts)} prompts but {len(self.rows)} rows to reset environments with")
        repeated = [p for p in prompts for _ in range(n)]
        rows = None if self.rows is None else [r for r in self.rows for _ in range(n)]
        ids, started = self.loop.begin(self.tokenizer, repeated, rows)
        episodes: list[Episode] = []
        for start in range(0, len(ids), batch_size):
            batch = slice(start, start + batch_size)
            episodes += self.loop.episodes(generate, self.tokenizer, ids[batch], max_new_tokens=max_new_tokens,
                                           stop=stop, started=started[batch])  # fmt: skip
        grouped = [episodes[i * n : (i + 1) * n] for i in range(len(prompts))]
        self.runs.append(grouped)
        logger.debug("%s: %s", desc, episode_stats(episodes))
        return [[e.text for e in g] for g in grouped], [[e.completion_ids for e in g] for g in grouped]
