"""Tool calls written as plain text, for a model whose chat template cannot carry them (the embedded char-level model).

TRL's own loop (`GRPOTrainer(tools=)`) needs a chat template with tool branches and a response parser
(docs/agents.md); the tiny model has neither, and a JSON call would cost it ~70 tokens to learn. So it calls the
calculator as GSM8K's annotations do (Cobbe et al. 2021, sec. 2 and appendix: `<<48+24=72>>`, filled in by the
sampler): the model writes `<<48213+90977=`, the loop runs `calculator("48213+90977")`, appends `139190>>` and lets the
model go on (`...139190>>139190</s>`), at most `max_turns` calls per episode. The inserted result is masked out of the
loss (`env_mask` 0): the policy is never trained to write what the tool wrote. A failed call (agents/failure.py)
inserts `error: <why>>>`.

`TextToolLoop` is how the one episode loop (agents/episodes.py `run_episodes`) stops, parses and answers such a turn;
training runs it as TRL's `rollout_func` (`text_tool_rollout`), and evaluation, the probe, the difficulty filter and
the demonstrations run the same loop, so the accuracy they report is that of the episodes GRPO trained on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from grpo_pipeline.agents.calculator import calculator
from grpo_pipeline.agents.episodes import (
    Episode,
    episode_stats,
    hf_generate,
    prompt_ids,
    run_episodes,
)
from grpo_pipeline.agents.failure import TEXT_ERROR, run_call
from grpo_pipeline.agents.registry import ToolError
from grpo_pipeline.configs.grpo import GRPOStageConfig
from grpo_pipeline.rewards.math import TOOL_RESULT_END

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from grpo_pipeline.agents.episodes import GenerateFn

logger = logging.getLogger(__name__)

CALL_OPEN, CALL_END = "<<", "="  # `<<expression=` asks for a result; the loop writes it and TOOL_RESULT_END
TEXT_TOOLS: dict[str, Callable[[str], str]] = {"calculator": calculator}  # tools that take one string


@dataclass(frozen=True)
class TextToolLoop:
    """The tool an episode may call in text (`<<expression=`) and how many calls an episode may make: how the episode
    loop (agents/episodes.py) stops, parses and answers a text turn."""

    name: str
    max_turns: int

    def call(self, expression: str) -> tuple[str, bool]:
        """What the model reads after `expression=` and whether the call failed (agents/failure.py)."""
        result, failure = run_call(TEXT_TOOLS[self.name], {"expression": expression})
        return (f"{TEXT_ERROR}{failure}", True) if failure is not None else (str(result), False)

    def prompt_ids(self, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[Any]) -> list[list[int]]:
        """Each prompt's ids as training tokenizes it (the tools are not described: the SFT data taught the call)."""
        return prompt_ids(tokenizer, prompts)

    def begin(
        self, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[Any], rows: Sequence[Mapping[str, Any]] | None
    ) -> tuple[list[list[int]], list[Episode]]:
        """Each episode's prompt ids and its empty Episode (the text loop has no environment: `rows` are unused)."""
        return self.prompt_ids(tokenizer, prompts), [Episode() for _ in prompts]

    def turn_stop(
        self, tokenizer: PreTrainedTokenizerBase, width: int, episodes: list[Episode], may_call: list[bool]
    ) -> Any:
        """A turn ends at an open call the row may make (`call_stop`), else at a stop token."""
        return call_stop(tokenizer, width, [e.text for e in episodes], may_call)

    def take(
        self, tokenizer: PreTrainedTokenizerBase, episode: Episode, turn: list[int], context: list[int],
        stop: Sequence[int], may_call: bool,
    ) -> list[str]:  # fmt: skip
        """Append the turn's tokens up to and including a stop token or the `=` of an open call; that call's
        expression when the episode may call (else a call past the turn limit is noted and the model goes on)."""
        for token in turn:
            piece = "" if token in stop else tokenizer.decode([token], skip_special_tokens=True)
            episode.extend([token], piece, by_model=True)
            if CALL_END in piece and (expression := open_call(episode.text)) is not None:
                if may_call:
                    return [expression]
                episode.hit_turn_limit = True
        return []

    def answer(
        self, tokenizer: PreTrainedTokenizerBase, episode: Episode, calls: list[str], max_new_tokens: int
    ) -> bool:
        """Run the call and append its result and `>>` (masked), cut where it would pass `max_new_tokens` (as TRL
        cuts a turn)."""
        (expression,) = calls
        result, failed = self.call(expression)
        episode.calls, episode.turns, episode.errors = episode.calls + 1, episode.turns + 1, episode.errors + failed
        inserted = tokenizer(result + TOOL_RESULT_END, add_special_tokens=False)["input_ids"]
        inserted = inserted[: max_new_tokens - len(episode.completion_ids)]
        episode.extend(inserted, tokenizer.decode(inserted), by_model=False)
        return True

    def finish(self, episode: Episode) -> None:
        """Nothing: a text episode's text is what the model and the tool wrote."""

    def episodes(
        self, generate: GenerateFn, tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]], *,
        max_new_tokens: int, stop: Sequence[int], started: list[Episode] | None = None,
    ) -> list[Episode]:  # fmt: skip
        return run_episodes(generate, tokenizer, prompts, self, max_new_tokens=max_new_tokens, stop=stop,
                            started=started)  # fmt: skip


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


def text_tool_rollout(loop: TextToolLoop) -> Callable[[list[Any], Any], dict[str, Any]]:
    """TRL's `rollout_func(prompts, trainer)` over `run_episodes`: one episode per prompt it is given (TRL's sampler
    already repeats each prompt `num_generations` times), generated by the policy in the training process with the
    trainer's own sampling settings. `logprobs` is None, as in TRL's own transformers path: they only correct vLLM's
    sampler. Extra keys reach the rewards as columns: `tool_calls`, `tool_errors`, `tool_turn_limit`."""

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        from trl.models import unwrap_model_for_generation

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


def text_rollout_kwargs(cfg: GRPOStageConfig, tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    """GRPOTrainer's `rollout_func=` for grpo.tools on a model whose chat template cannot carry tool calls; {}
    otherwise (no tools, or TRL's own loop runs them: `trainer_args.trainer_agent_kwargs`, which also refuses an
    environment on such a model, since environments need TRL's loop)."""
    if cfg.environment is not None or not cfg.tools or not needs_text_loop(tokenizer):
        return {}
    loop = text_tool_loop(cfg.tools, cfg.max_tool_turns)
    return {"rollout_func": text_tool_rollout(loop)} if loop else {}
