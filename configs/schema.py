"""The pipeline's one typed config.

A recipe is a YAML file validated against `PipelineConfig`; `key.sub=value` overrides from the command line are
applied before validation, so every error names the field and says what to change. The fully resolved config is
saved with every run (MLflow artifact `config.yaml`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import to_jsonable_python

# A field that changes how a stage runs but not what it computes (how often it checkpoints): left out of the
# stage keys (`section_hash`), so changing it neither reruns the stage nor loses the checkpoints to resume from.
UNKEYED: dict[str, Any] = {"unkeyed": True}


class ConfigError(ValueError):
    """A recipe or override that cannot be used; the message says which field and how to fix it."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


FUNCTION_FAMILIES = ("x+k", "x-k", "k-x", "x*k", "max(x,k)")


class SyntheticTaskConfig(_Section):
    kind: Literal["arithmetic", "functions"] = Field(
        default="arithmetic",
        description="'arithmetic': '47+38=' -> '85' (operations, min/max_digits). 'functions': write a Python "
        "function's body from input/output examples, '#f(0)=3 f(1)=4 f(7)=10\\ndef f(x):return ' -> 'x+3', each "
        "row carrying HumanEval-style hidden unit tests (`test`, `entry_point`) on inputs the examples do not show; "
        "score it with the code_tests reward (families, max_constant, num_tests, teacher_order_slip).",
    )
    operations: list[Literal["+", "-", "*"]] = Field(
        default=["+"], description="Operators drawn uniformly for each problem."
    )
    min_digits: int = Field(default=1, ge=1, le=6, description="Fewest digits per operand.")
    max_digits: int = Field(default=2, ge=1, le=6, description="Most digits per operand.")
    teacher_carry_slip: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Imperfect SFT demonstrations: the fraction of training '+' problems that need a carry whose "
        "SFT completion forgets it (47+38= -> 75 instead of 85). Only the SFT target changes; the answer that "
        "rewards and evaluation check is always right. 0 = a perfect teacher.",
    )
    families: list[Literal["x+k", "x-k", "k-x", "x*k", "max(x,k)"]] = Field(
        default=list(FUNCTION_FAMILIES),
        min_length=1,
        description="kind 'functions': the function families drawn uniformly for each problem (k is the constant).",
    )
    max_constant: int = Field(
        default=49, ge=2, le=999, description="kind 'functions': the constant k is drawn from 1..max_constant."
    )
    num_tests: int = Field(
        default=5, ge=1, le=20, description="kind 'functions': hidden asserts per row, on inputs not in the prompt."
    )
    teacher_order_slip: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="kind 'functions', imperfect SFT demonstrations: the fraction of training k-x problems whose "
        "SFT completion swaps the operands (12-x written x-12). Only the SFT target changes; the hidden tests that "
        "rewards and evaluation run are always right. 0 = a perfect teacher.",
    )

    @model_validator(mode="after")
    def _digits_ordered(self) -> SyntheticTaskConfig:
        if self.min_digits > self.max_digits:
            raise ValueError(
                f"min_digits ({self.min_digits}) is larger than max_digits ({self.max_digits}); lower min_digits"
            )
        if self.teacher_carry_slip > 0 and "+" not in self.operations:
            raise ValueError("teacher_carry_slip only changes '+' problems; add '+' to operations or set it to 0")
        if self.teacher_carry_slip > 0 and self.kind != "arithmetic":
            raise ValueError("teacher_carry_slip only changes kind 'arithmetic'; use teacher_order_slip or set it to 0")
        if self.teacher_order_slip > 0 and self.kind != "functions":
            raise ValueError("teacher_order_slip only changes kind 'functions'; set kind: functions or set it to 0")
        if self.teacher_order_slip > 0 and "k-x" not in self.families:
            raise ValueError("teacher_order_slip only changes k-x problems; add k-x to families or set it to 0")
        return self


class DataConfig(_Section):
    source: Literal["synthetic", "file", "hf"] = Field(
        default="synthetic",
        description="'synthetic': a built-in task (data.synthetic.kind); 'file': a local JSONL/Parquet/CSV file "
        "(`path`); 'hf': a Hugging Face dataset by name (`hf_name`).",
    )
    synthetic: SyntheticTaskConfig = Field(default_factory=SyntheticTaskConfig)
    path: str | None = Field(default=None, description="Local .jsonl/.json/.parquet/.csv file (source: file).")
    hf_name: str | None = Field(default=None, description="Dataset name or local dataset directory (source: hf).")
    hf_config: str | None = Field(default=None, description="Dataset configuration name (source: hf).")
    hf_split: str = Field(default="train", description="Split to load (source: hf).")
    prompt_column: str = Field(default="prompt", description="Source column that holds the question.")
    answer_column: str = Field(default="answer", description="Source column that holds the reference answer.")
    completion_column: str | None = Field(
        default=None,
        description="Source column with a full target completion for SFT (e.g. worked solutions); "
        "the answer is used when unset.",
    )
    extra_columns: list[str] = Field(
        default=[], description="Further source columns kept for rewards (e.g. test, entry_point)."
    )
    prompt_template: str = Field(
        default="{prompt}", description="Python format string applied to each row; `{prompt}` is the question."
    )
    prompt_format: Literal["text", "chat"] = Field(
        default="text",
        description="'text': each prompt is the templated question, fed to the model as it is. 'chat': each prompt "
        "becomes chat messages (the system prompt when set, then the templated question as the user's message; a "
        "source column that already holds messages is kept), rendered with the tokenizer's chat template for SFT, "
        "GRPO and evaluation alike (tasks/scoring/chat.py).",
    )
    system_prompt: str | None = Field(
        default=None,
        min_length=1,
        description="System message put before every chat prompt (prompt_format: chat); none when unset.",
    )
    answer_pattern: str | None = Field(
        default=None,
        description="Regex with one group that extracts the final answer from the answer column "
        "(e.g. '#### (.+)$' for GSM8K); the whole value is used when unset.",
    )
    num_train: int = Field(default=4000, ge=1, description="Training problems (rows) after the split.")
    num_eval: int = Field(default=500, ge=1, description="Held-out problems (rows) for evaluation.")
    seed: int = Field(default=0, description="Seed for generation, shuffling and the train/eval split.")
    min_prompt_chars: int = Field(default=1, ge=1, description="Shortest prompt accepted by validation (characters).")
    max_prompt_chars: int = Field(default=4096, ge=1, description="Longest prompt accepted by validation (characters).")

    @model_validator(mode="after")
    def _source_has_location(self) -> DataConfig:
        if self.source == "file" and not self.path:
            raise ValueError("data.source is 'file' but data.path is not set; set data.path=<file.jsonl|.parquet|.csv>")
        if self.source == "hf" and not self.hf_name:
            raise ValueError("data.source is 'hf' but data.hf_name is not set; set data.hf_name=<dataset name or dir>")
        if "{prompt}" not in self.prompt_template:
            raise ValueError("data.prompt_template must contain '{prompt}'")
        if self.system_prompt is not None and self.prompt_format != "chat":
            raise ValueError("data.system_prompt is set but data.prompt_format is 'text'; set data.prompt_format=chat")
        return self


class TinyModelConfig(_Section):
    # Llama-shaped: transformers maps Qwen2 checkpoints to Qwen2Tokenizer, which rebuilds a byte-level
    # pre-tokenizer and would drop the char tokenizer's whitespace.
    architecture: Literal["llama"] = Field(default="llama", description="Decoder family of the tiny model.")
    hidden_size: int = Field(default=128, ge=8, description="Width of the residual stream.")
    num_layers: int = Field(default=4, ge=1, description="Decoder layers.")
    num_heads: int = Field(default=4, ge=1, description="Attention heads (hidden_size must divide by it).")
    intermediate_size: int = Field(default=512, ge=8, description="MLP width.")
    max_positions: int = Field(default=128, ge=16, description="Longest sequence, prompt plus completion (tokens).")

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})")
        return self


class LoraConfig(_Section):
    r: int = Field(default=16, ge=1, description="Rank of the adapter matrices.")
    alpha: int = Field(default=32, ge=1, description="Scaling numerator: the update is (alpha / r) * B @ A.")
    dropout: float = Field(default=0.05, ge=0, lt=1, description="Dropout on the adapter's input.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        default="all-linear",
        description="Module names that get adapters (e.g. [q_proj, v_proj]), or 'all-linear' for every linear "
        "layer but the output head.",
    )


class DistributedConfig(_Section):
    num_processes: int = Field(
        default=1,
        ge=1,
        json_schema_extra=UNKEYED,
        description="Processes that train SFT and GRPO together (data parallel, one per GPU, or gloo on CPU), "
        "started with `accelerate launch`; 1 trains in the pipeline's own process. The batch fields stay global: "
        "each process takes its share of sft.batch_size and of grpo.prompts_per_step x generations_per_prompt.",
    )
    accelerate_config: str | None = Field(
        default=None,
        json_schema_extra=UNKEYED,
        description="An accelerate config file for the launch (configs/accelerate/: ddp, fsdp2, zero2, zero3); "
        "unset: plain data parallel.",
    )


class ModelConfig(_Section):
    base: str = Field(
        default="tiny",
        description="'tiny' builds the embedded char-level model locally; otherwise a hub name or a local "
        "directory loaded with from_pretrained.",
    )
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig)
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        default="float32", description="Weights dtype for training; bfloat16 on GPUs."
    )
    lora: LoraConfig | None = Field(
        default=None,
        description="Train LoRA adapters (peft) instead of every weight; each stage saves the policy with its "
        "adapter merged in, so the next stage, round, evaluation and registered version see a plain model.",
    )
    load_in_4bit: bool = Field(
        default=False,
        description="QLoRA: load the frozen base weights in 4-bit NF4 (bitsandbytes, CUDA only) and train LoRA "
        "adapters on top; needs model.lora. The merged policy is saved in `dtype`.",
    )

    @model_validator(mode="after")
    def _qlora_needs_lora(self) -> ModelConfig:
        if self.load_in_4bit and self.lora is None:
            raise ValueError("load_in_4bit trains LoRA adapters on a 4-bit base; set model.lora (e.g. model.lora={})")
        return self


def _save_every_steps(default: int) -> Any:
    """The checkpoint interval field that SFT and GRPO share (tasks/training/checkpoints.py)."""
    return Field(
        default=default,
        ge=0,
        json_schema_extra=UNKEYED,
        description="Save a resumable checkpoint (model, optimizer, scheduler, RNG states, step) every N optimizer "
        "steps beside the stage's output; a rerun of the same config or a Prefect retry resumes from the newest "
        "complete one. 0 turns it off.",
    )


class SFTConfig(_Section):
    enabled: bool = Field(default=True, description="Run the SFT warmup; when false GRPO starts from the base model.")
    epochs: float = Field(default=3.0, gt=0, description="Passes over the training split.")
    max_steps: int = Field(default=-1, description="Stop after this many optimizer steps (-1: use epochs).")
    learning_rate: float = Field(default=1e-3, gt=0, description="Peak learning rate.")
    batch_size: int = Field(default=64, ge=1, description="Examples per optimizer step.")
    warmup_ratio: float = Field(default=0.05, ge=0, le=1, description="Fraction of steps for linear warmup.")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    save_every_steps: int = _save_every_steps(500)
    keep_checkpoints: int = Field(
        default=2, ge=1, json_schema_extra=UNKEYED, description="Resumable checkpoints kept (the newest ones)."
    )


class RewardSpec(_Section):
    name: str = Field(description="A registered reward name or a dotted path 'pkg.module:function'.")
    weight: float = Field(default=1.0, description="Weight in the summed reward.")
    params: dict[str, Any] = Field(default={}, description="Keyword arguments for the reward's factory.")
    # Unkeyed: how long to wait, not what is computed (and the stage keys of existing runs stay as they were).
    timeout_s: float | None = Field(
        default=300.0,
        gt=0,
        json_schema_extra=UNKEYED,
        description="Longest one call of this reward may take, in seconds (a call scores one batch of completions). "
        "A call over it scores None for its rows, with a warning, and training goes on; a reward that misses it on "
        "more than half of its recent rows stops the run. null: no limit. Not the same as a `timeout_s` in `params` "
        "(the judge's per-request or code_tests' per-program limit), which should stay well below it.",
    )


class DifficultyFilterConfig(_Section):
    """Between GRPO rounds, train only on the prompts the current policy sometimes but not always solves (DAPO's
    dynamic sampling, Yu et al. 2025 sec. 3.2, applied to the dataset once per round): a prompt it always or never
    solves gives a group with one reward, zero advantage and no gradient. See tasks/difficulty.py."""

    enabled: bool = Field(
        default=False,
        description="Filter the training prompts before each GRPO round from round 2 on (and before round 1 with "
        "`before_first_round`).",
    )
    before_first_round: bool = Field(
        default=False, description="Also filter before round 1, with the SFT (or base) policy."
    )
    samples_per_prompt: int = Field(
        default=8,
        ge=2,
        description="Completions sampled per prompt (at the rollout temperature) to estimate its pass rate.",
    )
    min_pass_rate: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="Keep a prompt only when its pass rate (correct samples / samples_per_prompt) is strictly above "
        "this; 0 drops the prompts no sample solves.",
    )
    max_pass_rate: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="Keep a prompt only when its pass rate is strictly below this; 1 drops the prompts every sample "
        "solves.",
    )
    max_prompts: int | None = Field(
        default=None,
        ge=1,
        description="Score at most this many training prompts (a seeded random subset, for speed); the round trains "
        "only on the kept ones among them. None scores them all.",
    )

    @model_validator(mode="after")
    def _bounds_leave_a_rate(self) -> DifficultyFilterConfig:
        if self.min_pass_rate >= self.max_pass_rate:
            raise ValueError(
                f"min_pass_rate ({self.min_pass_rate}) must be below max_pass_rate ({self.max_pass_rate}); prompts "
                "are kept when min_pass_rate < pass rate < max_pass_rate"
            )
        n = self.samples_per_prompt
        if not any(self.min_pass_rate < c / n < self.max_pass_rate for c in range(n + 1)):
            raise ValueError(
                f"no pass rate c/{n} lies strictly between min_pass_rate ({self.min_pass_rate}) and max_pass_rate "
                f"({self.max_pass_rate}), so every prompt would be dropped; widen the bounds or raise "
                "samples_per_prompt"
            )
        return self


class GRPOConfig(_Section):
    rounds: int = Field(
        default=1, ge=1, description="Iterative GRPO rounds; each starts from the last policy and resets the reference."
    )
    steps_per_round: int = Field(default=200, ge=1, description="Optimizer steps in each round.")
    prompts_per_step: int = Field(default=8, ge=1, description="Distinct prompts sampled per optimizer step.")
    generations_per_prompt: int = Field(
        default=8, ge=2, description="Completions per prompt (the group size G); at least 2 for a baseline."
    )
    learning_rate: float = Field(default=1e-4, gt=0, description="Peak learning rate.")
    beta: float = Field(default=0.0, ge=0, description="KL coefficient against the reference model; 0 disables it.")
    epsilon: float = Field(default=0.2, gt=0, description="PPO-style clipping range of the importance ratio.")
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo"] = Field(
        default="dapo", description="Loss aggregation (TRL's loss_type)."
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        default="group", description="Divide advantages by the group's ('group'), batch's or no ('none') reward std."
    )
    temperature: float = Field(default=1.0, gt=0, description="Sampling temperature for rollouts.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling for rollouts.")
    max_completion_tokens: int = Field(default=8, ge=1, description="Longest rollout completion (tokens).")
    warmup_ratio: float = Field(default=0.0, ge=0, le=1, description="Fraction of steps for linear warmup.")
    save_every_steps: int = _save_every_steps(50)
    keep_checkpoints: int = Field(
        default=2, ge=1, json_schema_extra=UNKEYED, description="Resumable checkpoints kept (the newest ones)."
    )
    rewards: list[RewardSpec] = Field(
        default=[RewardSpec(name="correctness"), RewardSpec(name="format", weight=0.2)],
        min_length=1,
        description="Rewards summed with their weights.",
    )
    work_pool: str | None = Field(
        default=None,
        description="Run each GRPO round on this Prefect work pool (e.g. 'gpu') through the deployment "
        "'grpo-train/<work_pool>' (deployments/prefect.yaml) instead of in the pipeline's own process; the round's "
        "checkpoint comes back through the MLflow artifact store. Needs a Prefect server and a worker on the pool "
        "(`grpo-pipeline serve`).",
    )
    use_vllm: bool | Literal["auto"] = Field(
        default="auto", description="Generate rollouts with vLLM: true, false, or 'auto' (when CUDA and vllm exist)."
    )
    vllm_mode: Literal["colocate", "server"] = Field(
        default="colocate",
        description="Where vLLM runs (TRL's vllm_mode): 'colocate' in the training process, sharing its GPU; "
        "'server' in a separate `trl vllm-serve` process, usually on another GPU (vllm_server_host/port or "
        "vllm_server_base_url), which receives the new weights after each step.",
    )
    vllm_server_host: str = Field(
        default="127.0.0.1",
        json_schema_extra=UNKEYED,
        description="Host of the vLLM server (vllm_mode: server); ignored when vllm_server_base_url is set.",
    )
    vllm_server_port: int = Field(
        default=8000,
        ge=1,
        le=65535,
        json_schema_extra=UNKEYED,
        description="HTTP port of the vLLM server (vllm_mode: server; `trl vllm-serve --port`).",
    )
    vllm_server_base_url: str | None = Field(
        default=None,
        json_schema_extra=UNKEYED,
        description="Full URL of the vLLM server (e.g. http://gpu-1:8000), instead of vllm_server_host/port.",
    )
    vllm_gpu_memory_utilization: float = Field(
        default=0.3,
        gt=0,
        le=1,
        json_schema_extra=UNKEYED,
        description="Fraction of the GPU's memory vLLM takes for weights and KV cache (vllm_mode: colocate; the "
        "rest is training's). A server takes its own (`trl vllm-serve --gpu_memory_utilization`).",
    )
    log_every_steps: int = Field(default=10, ge=1, description="Logging interval (steps) for metrics.")
    probe_problems: int = Field(
        default=128,
        ge=0,
        description="Held-out problems (the first N of the eval split) whose greedy accuracy is measured during "
        "training for the learning curve (MLflow metric probe/greedy_accuracy); 0 turns the probe off.",
    )
    probe_every_steps: int = Field(default=50, ge=1, description="Steps between two held-out accuracy probes.")
    # Unkeyed: the filter reaches a round only through the split it writes, whose fingerprint the round is keyed on;
    # keying the round on these settings too would rerun round 1 when the filter is switched on for later rounds.
    difficulty_filter: DifficultyFilterConfig = Field(
        default_factory=DifficultyFilterConfig,
        json_schema_extra=UNKEYED,
        description="Train each round on the prompts of intermediate difficulty for its starting policy.",
    )

    @model_validator(mode="after")
    def _vllm_settings_agree(self) -> GRPOConfig:
        if self.vllm_mode == "server" and self.use_vllm is False:
            raise ValueError(
                "vllm_mode is 'server' but use_vllm is false, so no server would be used; set grpo.use_vllm=true "
                "(or auto) or grpo.vllm_mode=colocate"
            )
        url = self.vllm_server_base_url
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"vllm_server_base_url {url!r} is not an http(s) URL; write it as http://<host>:<port>")
        return self


class EvalConfig(_Section):
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
    correctness_reward: str = Field(
        default="correctness", description="The reward (name or dotted path) that decides if a completion is correct."
    )
    max_unscored_fraction: float = Field(
        default=0.02,
        ge=0,
        le=1,
        description="Largest share of the evaluated completions (greedy and sampled) that the correctness reward may "
        "leave unscored (None: a sandbox that could not start the program, a math-verify timeout, an unreachable "
        "judge) after scoring them once more. Below it they are left out of accuracy, pass@k and maj@k and counted "
        "as `unscored`; above it the evaluation stops with the first reason and nothing is registered.",
    )

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


class RegistryConfig(_Section):
    experiment: str = Field(default="grpo-pipeline", description="MLflow experiment name.")
    model_name: str = Field(default="tiny-arith-grpo", description="Registered model name in MLflow.")
    gating_metric: str = Field(
        default="accuracy",
        description="Eval metric that decides champion vs challenger (higher is better): accuracy, pass_at_<k>, "
        "maj_at_<k> or reward/<name>.",
    )
    min_delta: float = Field(
        default=0.0,
        description="Promotion margin: the new version takes `champion` only when the lower bound of the paired "
        "bootstrap 95% CI of its gating-metric difference to the champion (same eval items) is above this.",
    )
    register_each_round: bool = Field(default=True, description="Register every round, not only the last.")
    allow_unhealthy: bool = Field(
        default=False,
        description="Let a GRPO round that raised a training-health alarm (monitors.*) take `champion` when the gate "
        "promotes it; by default such a round is registered as `challenger` only.",
    )


class MonitorsConfig(_Section):
    """Training-health alarms watched in every GRPO round (tasks/training/health.py). An alarm is logged, set as a tag
    and metric on the round's MLflow run, listed in the run summary, and keeps the round from taking `champion`
    (unless registry.allow_unhealthy). The defaults stay silent on the default recipe (see docs/monitors.md)."""

    enabled: bool = Field(default=True, description="Watch GRPO rounds for the alarms below.")
    window_steps: int = Field(
        default=20,
        ge=1,
        description="Optimizer steps averaged into one reading: a round's start is the mean over its first window, "
        "'now' the mean over the latest one. Ratios to the start are checked once the two windows no longer overlap.",
    )
    zero_spread_max: float = Field(
        default=0.9,
        ge=0,
        le=1,
        description="Alarm when more than this fraction of the prompt groups in a window got the same weighted "
        "reward for every completion (zero advantage, no gradient). Computed from the rewards themselves and "
        "logged as health/zero_spread_frac.",
    )
    kl_max: float = Field(
        default=1.0,
        gt=0,
        description="Alarm when the window-mean per-token KL to the reference model (TRL's `kl`, nats) exceeds "
        "this; only checked when grpo.beta > 0.",
    )
    entropy_min_ratio: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="Entropy collapse: alarm when the window-mean token entropy falls below this fraction of its "
        "value at the round's start.",
    )
    length_min_ratio: float = Field(
        default=0.5,
        ge=0,
        lt=1,
        description="Alarm when the window-mean completion length (tokens) falls below this fraction of its start.",
    )
    length_max_ratio: float = Field(
        default=2.0,
        gt=1,
        description="Alarm when the window-mean completion length (tokens) grows above this multiple of its start.",
    )
    clip_ratio_max: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description="Alarm when the window-mean fraction of tokens whose importance ratio is clipped (TRL's "
        "clip_ratio/region_mean) exceeds this. Only off-policy updates clip (several passes over a batch, vLLM).",
    )
    stagnation_steps: int = Field(
        default=100,
        ge=0,
        description="Reward stagnation: alarm when, this many steps into a round, no window-mean reward has risen "
        "more than stagnation_min_gain above the start window's. 0 turns it off.",
    )
    stagnation_min_gain: float = Field(
        default=0.0,
        ge=0,
        description="The rise of the mean reward (in reward units, weights applied) that counts as progress.",
    )
    fail_fast: bool = Field(
        default=False,
        description="Stop the round at its first alarm with TrainingHealthError (not retried) instead of finishing "
        "it. A loss that turns NaN or inf stops the round either way: its weights are no longer finite.",
    )

    @model_validator(mode="after")
    def _windows_fit(self) -> MonitorsConfig:
        if self.stagnation_steps and self.stagnation_steps <= self.window_steps:
            raise ValueError(
                f"stagnation_steps ({self.stagnation_steps}) must exceed window_steps ({self.window_steps}), the "
                "start window it compares with; raise it or set it to 0 to turn the check off"
            )
        return self


class PipelineConfig(_Section):
    name: str = Field(default="tiny-arith", description="Recipe name; used in run directories and MLflow run names.")
    run_dir: str = Field(default="runs", description="Where datasets, checkpoints and the local MLflow store live.")
    seed: int = Field(default=0, description="Global seed for model init, SFT and GRPO.")
    code_dir: str | None = Field(
        default=None,
        description="Directory searched first for your own modules named by dotted paths (e.g. a reward "
        "'my_rewards:score' in my_rewards.py); the recipe's directory when the recipe is a file. The working "
        "directory is always searched. Not part of the config hash.",
    )
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    registry: RegistryConfig = Field(default_factory=RegistryConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    monitors: MonitorsConfig = Field(
        default_factory=MonitorsConfig, description="Health alarms of the GRPO rounds (tasks/training/health.py)."
    )

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        if not v or any(c in v for c in "/\\ "):
            raise ValueError("name must be non-empty without slashes or spaces (it names directories)")
        return v

    @model_validator(mode="after")
    def _one_grpo_batch_fits(self) -> PipelineConfig:
        # TRL's sampler forms only whole batches of prompts_per_step prompts and drops the rest: with fewer training
        # rows than that, no GRPO step could run (the rows actually prepared are checked again in tasks/preflight.py).
        if self.data.num_train < self.grpo.prompts_per_step:
            raise ValueError(
                f"data.num_train ({self.data.num_train}) is smaller than grpo.prompts_per_step "
                f"({self.grpo.prompts_per_step}), so no whole GRPO batch of prompts can be formed; raise "
                "data.num_train or lower grpo.prompts_per_step"
            )
        return self

    @model_validator(mode="after")
    def _batches_split_across_processes(self) -> PipelineConfig:
        n = self.distributed.num_processes
        completions = self.grpo.prompts_per_step * self.grpo.generations_per_prompt
        if completions % n:
            raise ValueError(
                f"one GRPO step's {completions} completions (grpo.prompts_per_step x grpo.generations_per_prompt) do "
                f"not split evenly across distributed.num_processes ({n}); make the product a multiple of {n}"
            )
        if self.sft.batch_size % n:
            raise ValueError(
                f"sft.batch_size ({self.sft.batch_size}) does not split evenly across distributed.num_processes "
                f"({n}); make it a multiple of {n}"
            )
        return self

    def fingerprint(self) -> str:
        """sha256 of the canonical JSON of the whole config (the MLflow tag `config_hash`), where it came from aside."""
        return section_hash(self.model_dump(mode="json", exclude={"code_dir"}))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def section_hash(section: Any) -> str:
    """A stable sha256 of the canonical JSON of a config section, or of any value made of pydantic models, paths
    and JSON-able containers (the config hash, and every stage key in tasks/core/stage.py). Fields marked `UNKEYED`
    are left out."""
    return hashlib.sha256(json.dumps(to_jsonable_python(keyed_view(section)), sort_keys=True).encode()).hexdigest()


def keyed_view(value: Any) -> Any:
    """`value` with the fields of its pydantic models that are marked `UNKEYED` left out, at any depth."""
    if isinstance(value, BaseModel):
        fields = type(value).model_fields
        return {k: keyed_view(getattr(value, k)) for k, f in fields.items() if f.json_schema_extra != UNKEYED}
    if isinstance(value, list | tuple):
        return [keyed_view(v) for v in value]
    if isinstance(value, dict):
        return {k: keyed_view(v) for k, v in value.items()}
    return value


def _parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key.sub=value (e.g. grpo.learning_rate=5e-5)")
    key, raw = text.split("=", 1)
    if not key:
        raise ConfigError(f"override {text!r} has an empty key")
    # YAML parsing gives numbers, booleans, null and lists ("[1, 2]") their types; strings stay strings.
    try:
        return key.strip().split("."), yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override {text!r}: {_yaml_problem(e, raw)}") from None


def _yaml_problem(err: yaml.YAMLError, raw: str) -> str:
    """One line for a value YAML cannot parse: what it expected and where, and the likely fix (a shell split the
    value at a space, or a bracket or quote is missing)."""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    mark = getattr(err, "problem_mark", None)
    where = ""
    if mark is not None:  # YAML counts from 0; the position is the value's own (the override's key is not parsed)
        where = (
            f" at column {mark.column + 1}" if mark.line == 0 else f" at line {mark.line + 1}, column {mark.column + 1}"
        )
    return (
        f"the value {raw!r} is not valid YAML ({problem}{where}); close its brackets and quotes, and quote the "
        "whole override for the shell when the value holds spaces (e.g. 'grpo.rewards=[{name: correctness}]')"
    )


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply `key.sub=value` overrides to a raw (unvalidated) config dict, returning a new dict."""
    result = json.loads(json.dumps(raw))
    for text in overrides:
        path, value = _parse_override(text)
        node = result
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {part!r} is a value, not a section")
            node = child
        node[path[-1]] = value
    return result


def _format_validation_error(err: ValidationError, origin: str) -> str:
    lines = [f"invalid config ({origin}):"]
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field; check the spelling (`grpo-pipeline config --schema` lists every field)"
        elif not (e["type"] == "value_error" and isinstance(e.get("input"), dict)):  # a section's check names fields
            msg = f"{msg} (got {e.get('input')!r})"
        lines.append(f"  - {field}: {msg}")
    return "\n".join(lines)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> PipelineConfig:
    """Load a YAML recipe (or the defaults when `path` is None), apply overrides, validate once."""
    raw: dict = {}
    origin = "defaults"
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path} is not valid YAML: {e}") from e
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        origin = str(path)
        raw.setdefault("code_dir", str(path.resolve().parent))
    raw = apply_overrides(raw, overrides or [])
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, origin)) from None
