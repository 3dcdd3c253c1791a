"""The `eval:` section: greedy accuracy and pass@k / maj@k on the held-out split and on named benchmark suites
(tasks/evaluate.py, tasks/suites.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from grpo_pipeline.configs.base import Section
from grpo_pipeline.configs.data import DataConfig, SyntheticTaskConfig
from grpo_pipeline.configs.grpo import RewardSpec
from grpo_pipeline.configs.sampling import Sampling

# The correctness reward by default: the math answer check (rewards/math.py).
CORRECTNESS = RewardSpec(name="correctness")


# The suite that scores the held-out split of the training source: the only suite when none are configured.
HELDOUT = "heldout"
# What a suite's entry may set over the `eval:` section's own values.
SUITE_OVERRIDES = ("n_samples", "k", "temperature", "top_p", "max_new_tokens", "max_problems")
# Correctness rewards whose answers are not values to vote on: no maj@k for code.
NO_VOTE_REWARDS = ("code_tests",)


class EvalSuiteConfig(Section):
    """A named benchmark: where its problems come from, how each becomes a prompt, what decides correctness, and
    any sampling settings of its own. Its metrics are named `<name>/<metric>` (`gsm8k_test/accuracy`)."""

    name: str = Field(description="The suite's name: metric prefix, stage label, table title (letters, digits, _ -).")
    source: Literal["heldout", "synthetic", "file", "hf"] = Field(
        default="heldout",
        description="'heldout': the held-out split of the training source (data.num_eval rows); 'synthetic': a "
        "built-in task drawn with `synthetic` and `seed`; 'file': a local JSONL/Parquet/CSV file (`path`); 'hf': a "
        "Hugging Face dataset by name or local directory (`hf_name`, `hf_split`).",
    )
    synthetic: SyntheticTaskConfig | None = Field(
        default=None, description="source 'synthetic': the task (data.synthetic's fields); required there."
    )
    path: str | None = Field(default=None, description="source 'file': the benchmark file.")
    hf_name: str | None = Field(default=None, description="source 'hf': dataset name or local dataset directory.")
    hf_config: str | None = Field(default=None, description="source 'hf': dataset configuration name.")
    hf_split: str = Field(default="test", description="source 'hf': the split to score (benchmarks report 'test').")
    prompt_column: str = Field(default="prompt", description="Source column that holds the question.")
    answer_column: str = Field(default="answer", description="Source column that holds the reference answer.")
    extra_columns: list[str] = Field(default=[], description="Further source columns the correctness reward reads.")
    prompt_template: str = Field(default="{prompt}", description="Format string for each question ({prompt}).")
    prompt_format: Literal["text", "chat"] = Field(default="text", description="As data.prompt_format.")
    system_prompt: str | None = Field(default=None, min_length=1, description="As data.system_prompt (chat only).")
    answer_pattern: str | None = Field(default=None, description="As data.answer_pattern (e.g. '#### (.+)$').")
    seed: int = Field(default=1, description="source 'synthetic': the draw's seed (data.seed draws training's).")
    num_problems: int = Field(
        default=500, ge=1, description="source 'synthetic': problems drawn (max_problems caps any source)."
    )
    correctness_reward: RewardSpec | None = Field(
        default=None,
        description="What decides correctness on this suite ({name, params} or a name); eval.correctness_reward "
        "when unset.",
    )
    n_samples: int | None = Field(default=None, ge=1, description="eval.n_samples for this suite.")
    k: list[int] | None = Field(default=None, min_length=1, description="eval.k for this suite.")
    temperature: float | None = Field(default=None, gt=0, description="eval.temperature for this suite.")
    top_p: float | None = Field(default=None, gt=0, le=1, description="eval.top_p for this suite.")
    max_new_tokens: int | None = Field(default=None, ge=1, description="eval.max_new_tokens for this suite.")
    max_problems: int | None = Field(default=None, ge=1, description="Score at most this many of its rows.")

    @field_validator("correctness_reward", mode="before")
    @classmethod
    def _bare_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        if not v or not all(c.isalnum() or c in "_-" for c in v) or v == "reward":
            raise ValueError(
                f"suite name {v!r} must be letters, digits, '_' or '-' (it prefixes metrics: <name>/accuracy), "
                "and not 'reward'"
            )
        return v

    @model_validator(mode="after")
    def _source_is_located(self) -> EvalSuiteConfig:
        needs = {
            "synthetic": ("synthetic", self.synthetic),
            "file": ("path", self.path),
            "hf": ("hf_name", self.hf_name),
        }
        if self.source in needs and not needs[self.source][1]:
            field = needs[self.source][0]
            raise ValueError(f"suite {self.name!r} has source {self.source!r} but no {field}; set {field}")
        if "{prompt}" not in self.prompt_template:
            raise ValueError(f"suite {self.name!r}: prompt_template must contain '{{prompt}}'")
        return self

    def data_config(self) -> DataConfig:
        """The suite's source as a data section, so that it loads and maps exactly as training data does."""
        mapped = self.model_dump(
            include={"source", "path", "hf_name", "hf_config", "hf_split", "prompt_column", "answer_column",
                     "extra_columns", "prompt_template", "prompt_format", "system_prompt", "answer_pattern", "seed"}
        )  # fmt: skip
        if self.synthetic is not None:
            mapped["synthetic"] = self.synthetic
        return DataConfig(**mapped, num_train=1, num_eval=self.num_problems, num_probe=0)


class EvalConfig(Section):
    max_problems: int | None = Field(default=None, ge=1, description="Evaluate on at most this many held-out rows.")
    n_samples: int = Field(default=8, ge=1, description="Sampled completions per problem for pass@k (n).")
    k: list[int] = Field(default=[1, 4, 8], min_length=1, description="The k values of pass@k (each <= n_samples).")
    temperature: float = Field(default=1.0, gt=0, description="Sampling temperature for pass@k.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling for pass@k.")
    max_new_tokens: int = Field(default=8, ge=1, description="Longest evaluated completion (tokens).")
    batch_size: int = Field(
        default=256,
        ge=1,
        description="Sequences per generation batch: prompts x completions (a pass@k batch holds batch_size / "
        "n_samples prompts).",
    )
    backend: Literal["auto", "hf", "vllm"] = Field(
        default="auto",
        description="What generates the evaluated completions: 'vllm' (the vllm package: the gpu extra on CUDA, or "
        "vLLM's CPU build), 'hf' (transformers' generate), 'auto' (vLLM where it is installed, else generate). Either "
        "samples with these settings only, whatever the checkpoint's generation_config asks, tokenizes prompts as "
        "training does and records the sampler it applied; a real model's evaluation is its slowest stage under "
        "generate.",
    )
    correctness_reward: RewardSpec = Field(
        default=CORRECTNESS,
        description="The reward that decides if a completion is correct: `{name, params}` (a registered name or a "
        "dotted path, and its factory's params), or a bare name. A bare name that is also one of grpo.rewards takes "
        "that entry's params and timeout, so evaluation, the probes, the difficulty filter, the SFT check and the "
        "preflight score exactly as training does (e.g. code_tests with `isolation: bwrap`).",
    )
    tools: list[str] | None = Field(
        default=None,
        description="Tools the policy calls in evaluated episodes; null: grpo.tools (the pipeline fills it in), so "
        "evaluation, the probe and the gate score the episodes GRPO trained on. On a model whose chat template cannot "
        "carry tool calls they are called in text (agents/text_tools.py). []: one plain completion per sample.",
    )
    tool_params: dict[str, dict[str, Any]] | None = Field(
        default=None,
        description="Keyword arguments of the built-in tools in eval.tools, by name (e.g. `{python: {isolation: "
        "bwrap}}`); null: grpo.tool_params (the pipeline fills it in), so evaluated episodes run the tools as "
        "training does. Entries for tools eval.tools does not list are unused.",
    )
    max_tool_turns: int | None = Field(
        default=None, ge=1, description="Tool calls per evaluated episode at most; null: grpo.max_tool_turns."
    )
    environment: str | None = Field(
        default=None,
        description="The environment class ('pkg.module:Class') whose fresh instance each evaluated episode is reset "
        "with (its row), calls (its public methods) and is scored by (get_reward(), reported beside the scores); "
        "null: grpo.environment when eval.tools is not given either, else none.",
    )
    max_unscored_fraction: float = Field(
        default=0.02,
        ge=0,
        le=1,
        description="Largest share of each metric's own items that the correctness reward may leave unscored (None: a "
        "sandbox that could not start the program, a math-verify timeout, an unreachable judge) after scoring them "
        "once more: greedy items for accuracy, problems for pass@k and maj@k, and the sampled completions these are "
        "estimated from. Below it they are left out of that metric and counted as `unscored`; above it the "
        "evaluation stops with the first reason and nothing is registered.",
    )

    suites: list[EvalSuiteConfig] = Field(
        default=[],
        description="The benchmarks every policy is scored on (SFT, each round; the base model too with "
        "eval.score_base), each cached on its own: adding a suite reruns neither the others nor any training. "
        "A suite with `source: heldout` scores the held-out split of the training source; none given: that one "
        "alone, named 'heldout'. Metrics are `<suite>/<metric>`; the first suite is the one a bare "
        "registry.gating_metric names.",
    )
    score_base: bool = Field(
        default=False,
        description="Also score the base model on every suite (before SFT), so the summary shows what SFT and each "
        "GRPO round did from the start.",
    )

    @field_validator("correctness_reward", mode="before")
    @classmethod
    def _bare_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _suites_apart(self) -> EvalConfig:
        names = [s.name for s in self.suites]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"eval.suites names {twice} more than once; give every suite its own name")
        for suite in self.suites:
            if suite.n_samples is None and suite.k is None:
                continue  # the section's own n_samples and k, which it checks itself
            n, k = suite.n_samples or self.n_samples, suite.k or self.k
            if max(k) > n:
                raise ValueError(f"suite {suite.name!r}: k {k} exceeds n_samples {n}; raise n_samples or drop them")
        return self

    @property
    def sampling(self) -> Sampling:
        """How pass@k samples (a suite's own settings in `for_suite(name).sampling`); greedy accuracy and the probes
        decode `sampling.greedy()`."""
        return Sampling(
            temperature=self.temperature, top_p=self.top_p, max_new_tokens=self.max_new_tokens,
            tools=tuple(self.tools or ()), tool_params=self.tool_params or {}, max_tool_turns=self.max_tool_turns or 1,
            environment=self.environment,
        )  # fmt: skip

    @property
    def votes(self) -> bool:
        """Whether maj@k is scored: the correctness reward's answers are values to vote on."""
        return self.correctness_reward.name not in NO_VOTE_REWARDS

    def suite_names(self) -> list[str]:
        """The suites in order ('heldout' alone when none are configured)."""
        return [s.name for s in self.suites] or [HELDOUT]

    def suite(self, name: str) -> EvalSuiteConfig:
        if not self.suites and name == HELDOUT:
            return EvalSuiteConfig(name=HELDOUT)
        found = next((s for s in self.suites if s.name == name), None)
        if found is None:
            raise ValueError(f"no eval suite named {name!r}; the suites are {self.suite_names()}")
        return found

    def for_suite(self, name: str) -> EvalConfig:
        """The settings one suite is scored with: this section with the suite's own values over it, and no suites
        (a suite's evaluation is keyed by its own settings alone, so adding another suite does not rerun it)."""
        suite = self.suite(name)
        update: dict[str, Any] = {k: getattr(suite, k) for k in SUITE_OVERRIDES if getattr(suite, k) is not None}
        if suite.correctness_reward is not None:
            update["correctness_reward"] = suite.correctness_reward
        return self.model_copy(update={**update, "suites": [], "score_base": False})

    @model_validator(mode="after")
    def _k_fits_n(self) -> EvalConfig:
        too_big = [k for k in self.k if k > self.n_samples]
        if too_big:
            raise ValueError(
                f"eval.k values {too_big} exceed eval.n_samples={self.n_samples}; raise n_samples or drop them"
            )
        # A pass@k batch holds whole groups: batch_size // n_samples prompts with all their samples
        # (tasks/scoring/generation.py). Below one group it would hold n_samples sequences all the same.
        if self.batch_size < self.n_samples:
            raise ValueError(
                f"eval.batch_size ({self.batch_size}) cannot hold one group of eval.n_samples ({self.n_samples}) "
                f"samples of a prompt; raise eval.batch_size to a multiple of {self.n_samples} or lower eval.n_samples"
            )
        return self
