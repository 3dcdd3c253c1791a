"""The `grpo:` section: the GRPO rounds, their rewards, rollouts (vLLM or transformers), checkpoints, the
held-out probe, the difficulty filter between rounds, and the work pool they run on."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, TypeAdapter, ValidationError, model_validator

from grpo_pipeline.configs.algorithm import VESPO_VLLM_MODE, PolicyLossConfig, vllm_corrections_set
from grpo_pipeline.configs.base import UNKEYED, Section, save_every_steps_field
from grpo_pipeline.configs.sampling import Sampling

# `pkg.module:attribute`, as user rewards are written
_DOTTED = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*")


class RewardSpec(Section):
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


class DifficultyFilterConfig(Section):
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
    # Unkeyed: it decides what the flow does with the filter's result, not what the filter computes.
    on_too_few: Literal["end_rounds", "fail"] = Field(
        default="end_rounds",
        json_schema_extra=UNKEYED,
        description="When fewer prompts than a GRPO step takes (grpo.prompts_per_step) pass the filter (the policy "
        "solves nearly every prompt every time, or never): 'end_rounds' ends the rounds there with a note that says "
        "why, as a saturated probe does, and the rounds before it stand; 'fail' fails the run with "
        "DifficultyFilterError, which names the settings that would keep more prompts.",
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


class GRPOStageConfig(PolicyLossConfig):
    """The `grpo:` section: iterative GRPO rounds (tasks/grpo.py); `trl_grpo_args` maps it onto TRL's
    `GRPOConfig`. The objective's fields (loss type, clipping, entropy, off-policy corrections) come first, from
    `PolicyLossConfig` (configs/algorithm.py)."""

    # Parameters that control the rounds: their number, batch (in prompts and completions), optimizer and rewards
    rounds: int = Field(
        default=1,
        ge=1,
        description="The most iterative GRPO rounds; each starts from the last policy and resets the reference. No "
        "round starts after one that returned its start unchanged (keep_over_start found no better step; nothing is "
        "registered for it) or whose probe is saturated (greedy accuracy 1.0).",
    )
    steps_per_round: int = Field(default=200, ge=1, description="Optimizer steps in each round.")
    prompts_per_step: int = Field(default=8, ge=1, description="Distinct prompts sampled per optimizer step.")
    generations_per_prompt: int = Field(
        default=8, ge=2, description="Completions per prompt (the group size G); at least 2 for a baseline."
    )
    learning_rate: float = Field(default=1e-4, gt=0, description="Peak learning rate.")
    warmup_ratio: float = Field(default=0.0, ge=0, le=1, description="Fraction of steps for linear warmup.")
    lr_schedule: Literal["constant", "cosine", "linear"] = Field(
        default="constant",
        description="The learning rate over a round's steps after warmup: 'constant', or decayed to 0 by the round's "
        "last step ('cosine', 'linear'). Every round starts again from its peak (warm restarts across rounds).",
    )
    round_lr_decay: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="The peak learning rate of round r is learning_rate * round_lr_decay**(r - 1): 1.0 restarts every "
        "round at learning_rate, 0.5 halves the peak from one round to the next, so a later round, which starts from a "
        "better policy, refines it instead of being shaken off it at the peak.",
    )
    rewards: list[RewardSpec] = Field(
        default=[RewardSpec(name="correctness"), RewardSpec(name="format", weight=0.2)],
        min_length=1,
        description="Rewards summed with their weights.",
    )

    # Parameters that control generation (the rollouts)
    temperature: float = Field(default=1.0, gt=0, description="Sampling temperature for rollouts.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling for rollouts.")
    max_completion_tokens: int = Field(default=8, ge=1, description="Longest rollout completion (tokens).")

    # Parameters that control tool use: multi-turn rollouts on TRL's agent API (docs/agents.md)
    tools: list[str] = Field(
        default=[],
        description="Tools the model may call during its rollouts: built-in names (calculator, python) or dotted "
        "paths 'pkg.module:function' to typed functions with a Google-style docstring (TRL renders them as JSON "
        "schemas). Each tool's module is in the round's key, like a user reward's. Empty: one completion per prompt.",
    )
    tool_params: dict[str, dict[str, Any]] = Field(
        default={},
        description="Keyword arguments of a built-in tool in grpo.tools, by its name, as a reward's params: "
        "`{python: {isolation: bwrap}}` runs the python tool's code only in bubblewrap and refuses to start without "
        "it, as code_tests' `isolation: bwrap` does; without it (isolation auto) the code runs with rlimits only "
        "where bubblewrap is missing (rewards/sandbox/). Evaluation takes the same (eval.tool_params).",
    )
    environment: str | None = Field(
        default=None,
        description="A class by dotted path 'pkg.module:Class', one instance per rollout: reset(**row) before each "
        "rollout (text it returns is appended to the prompt), its public methods are tools, and an optional "
        "get_reward() is one more reward (weight 1). null: no environment.",
    )
    max_tool_turns: int = Field(
        default=4,
        ge=1,
        description="Most tool-calling turns in one rollout (TRL's max_tool_calling_iterations); the tool results "
        "and every turn count against max_completion_tokens. Used only with tools or an environment.",
    )

    # Parameters that control vLLM (rollouts on vLLM, in the training process or a server)
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

    # Parameters that control checkpoints and logging
    save_every_steps: int = save_every_steps_field(50)
    keep_checkpoints: int = Field(
        default=2, ge=1, json_schema_extra=UNKEYED, description="Resumable checkpoints kept (the newest ones)."
    )
    log_every_steps: int = Field(default=10, ge=1, description="Logging interval (steps) for metrics.")

    # Parameters that control the held-out probe (the learning curve)
    probe_problems: int = Field(
        default=128,
        ge=0,
        description="Problems of the probe split (the first N of data.num_probe held-out rows, never the eval "
        "items) whose greedy accuracy is measured during training for the learning curve (MLflow metric "
        "probe/greedy_accuracy); 0 turns the probe off.",
    )
    probe_every_steps: int = Field(default=50, ge=1, description="Steps between two held-out accuracy probes.")
    keep: Literal["last", "best_probe"] = Field(
        default="last",
        description="The policy a round returns: 'last', its last step; 'best_probe', the step whose held-out probe "
        "accuracy is the round's best (ties go to the later step), which needs the probe (probe_problems > 0).",
    )
    keep_over_start: bool = Field(
        default=False,
        description="With keep: best_probe, a round returns its start policy unchanged unless the step its probe "
        "chose beats the start as keep_rule says: a round then does not end below where it began by chasing probe "
        "noise. A resumed round compares with its true start (saved beside its resumable checkpoints).",
    )
    keep_rule: Literal["confirm", "ci"] = Field(
        default="confirm",
        description="How keep_over_start decides. 'confirm': the step is chosen on one half of the probe rows (a "
        "fixed seeded split) and kept when, on the other half, its accuracy minus the start's is above keep_margin: "
        "no winner's curse (the rows that test it did not choose it); simulated on 128 probe rows it keeps a +3-point "
        "gain 66% of the time and a -3-point loss 16%. 'ci': chosen on every probe row and kept only when the paired "
        "bootstrap 95% CI of its gain on those same rows is above zero (+3 points kept 27% of the time, -3 points "
        "1%). Both rules' error rates: benchmarks/LEARNING.md (benchmarks/keep_rule.py).",
    )
    keep_margin: float = Field(
        default=0.0,
        ge=-0.5,
        le=0.5,
        description="With keep_rule: confirm, the gain (fraction of the confirming rows, 0.01 = 1 point) the chosen "
        "step must exceed over the start: 0 keeps a step that is strictly better there; a negative margin keeps one "
        "that is not worse by more than it (non-inferiority), a positive one asks for more (fewer false keeps, more "
        "real gains thrown away).",
    )
    probe_patience: int = Field(
        default=0,
        ge=0,
        description="With keep: best_probe, end the round early once this many probes in a row have not beaten the "
        "best one; 0 never ends it early.",
    )

    # Parameters that control the difficulty filter between rounds
    # Unkeyed: the filter reaches a round only through the split it writes, whose fingerprint the round is keyed on;
    # keying the round on these settings too would rerun round 1 when the filter is switched on for later rounds.
    difficulty_filter: DifficultyFilterConfig = Field(
        default_factory=DifficultyFilterConfig,
        json_schema_extra=UNKEYED,
        description="Train each round on the prompts of intermediate difficulty for its starting policy.",
    )

    # Parameters that control where the rounds run (a Prefect work pool)
    work_pool: str | None = Field(
        default=None,
        description="Run each GRPO round on this Prefect work pool (e.g. 'gpu') through the deployment "
        "'grpo-train/<work_pool>' (deployments/prefect.yaml) instead of in the pipeline's own process; the round's "
        "checkpoint comes back through the MLflow artifact store. Needs a Prefect server and a worker on the pool "
        "(`grpo-pipeline serve`).",
    )

    def round_learning_rate(self, round_index: int) -> float:
        """The peak learning rate of round `round_index` (1 for the first): see round_lr_decay."""
        return self.learning_rate * self.round_lr_decay ** (round_index - 1)

    @property
    def sampling(self) -> Sampling:
        """How the rounds sample their rollouts, which the probe and the difficulty filter sample as."""
        return Sampling(
            temperature=self.temperature, top_p=self.top_p, max_new_tokens=self.max_completion_tokens,
            tools=tuple(self.tools), tool_params=self.tool_params, max_tool_turns=self.max_tool_turns,
            environment=self.environment,
        )  # fmt: skip

    @property
    def reuses_rollouts(self) -> bool:
        """Whether one generation serves more than one optimizer pass (off-policy samples without vLLM)."""
        return self.num_iterations > 1 or (self.steps_per_generation or 1) > 1

    @model_validator(mode="after")
    def _tools_are_names_or_paths(self) -> GRPOStageConfig:
        """The shape of each entry only; agents/registry.py imports and checks them (preflight and the round)."""
        for i, name in enumerate(self.tools):
            if not (name.isidentifier() or _DOTTED.fullmatch(name)):
                raise ValueError(
                    f"grpo.tools[{i}] is {name!r}: write a built-in tool name (calculator, python) or a dotted path "
                    "'pkg.module:function'"
                )
        if len(set(self.tools)) != len(self.tools):
            raise ValueError(f"grpo.tools lists a tool twice ({self.tools}); list each tool once")
        unlisted = sorted(set(self.tool_params) - set(self.tools))
        if unlisted:
            raise ValueError(
                f"grpo.tool_params has params for {unlisted}, which grpo.tools does not list ({self.tools}); add the "
                "tool to grpo.tools or remove its params"
            )
        if self.environment is not None and not _DOTTED.fullmatch(self.environment):
            raise ValueError(
                f"grpo.environment is {self.environment!r}: write the class's dotted path 'pkg.module:Class'"
            )
        return self

    @model_validator(mode="after")
    def _keep_has_a_probe(self) -> GRPOStageConfig:
        if self.keep == "best_probe" and not self.probe_problems:
            raise ValueError(
                "grpo.keep is 'best_probe' but grpo.probe_problems is 0, so no probe chooses the step; set "
                "grpo.probe_problems (e.g. 128) or grpo.keep=last"
            )
        if self.probe_patience and self.keep != "best_probe":
            raise ValueError("grpo.probe_patience ends a round by the probe, which only grpo.keep=best_probe uses")
        if self.keep_over_start and self.keep != "best_probe":
            raise ValueError(
                "grpo.keep_over_start compares the best-probed step with the start: set grpo.keep=best_probe"
            )
        if self.keep_margin and not (self.keep_over_start and self.keep_rule == "confirm"):
            raise ValueError(
                "grpo.keep_margin is the gain the confirm rule asks of a round over its start: set "
                "grpo.keep_over_start=true and grpo.keep_rule=confirm, or leave keep_margin at 0"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _vespo_corrects_per_token(cls, raw: Any) -> Any:
        """loss_type vespo where vLLM may generate, with no correction mode given, takes a per-token one (TRL refuses
        vespo with a sequence-level mode): `loss_type: vespo` alone is then valid with use_vllm auto, on every
        machine. The mode is then written in the config, so a dumped config reads back the same."""
        if not isinstance(raw, dict) or raw.get("loss_type") != "vespo" or "vllm_importance_sampling_mode" in raw:
            return raw
        if _false(raw.get("use_vllm", "auto")) or _false(raw.get("vllm_importance_sampling_correction", True)):
            return raw
        return {**raw, "vllm_importance_sampling_mode": VESPO_VLLM_MODE}

    @model_validator(mode="after")
    def _vllm_settings_agree(self) -> GRPOStageConfig:
        if self.vllm_mode == "server" and self.use_vllm is False:
            raise ValueError(
                "vllm_mode is 'server' but use_vllm is false, so no server would be used; set grpo.use_vllm=true "
                "(or auto) or grpo.vllm_mode=colocate"
            )
        # By value, not by whether a field was written: the full dump of a valid config (a remote round's
        # parameters, the run's config.yaml) must validate again.
        if self.use_vllm is False and (asked := vllm_corrections_set(self)):
            raise ValueError(
                f"{', '.join(asked)} correct vLLM rollouts but use_vllm is false; set grpo.use_vllm=true (or auto) "
                "or leave them at their defaults"
            )
        if self.use_vllm is False and self.off_policy_mask_threshold is not None and not self.reuses_rollouts:
            raise ValueError(
                "off_policy_mask_threshold masks completions sampled by another policy, but with use_vllm false, "
                "num_iterations 1 and steps_per_generation 1 every completion is on-policy; raise grpo.num_iterations "
                "or grpo.steps_per_generation, or unset it"
            )
        vespo_vllm = (
            self.loss_type == "vespo" and self.use_vllm is not False and self.vllm_importance_sampling_correction
        )
        if vespo_vllm and not self.vllm_importance_sampling_mode.startswith("token_"):
            raise ValueError(
                "loss_type vespo with vLLM rollouts needs a per-token correction; set "
                "grpo.vllm_importance_sampling_mode=token_truncate (or token_mask), or grpo.use_vllm=false"
            )
        url = self.vllm_server_base_url
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"vllm_server_base_url {url!r} is not an http(s) URL; write it as http://<host>:<port>")
        return self


def _false(value: Any) -> bool:
    """Whether a raw (unvalidated) boolean setting reads as false, as pydantic will read it ('false', 0, 'off')."""
    if value == "auto":
        return False
    try:
        return TypeAdapter(bool).validate_python(value) is False
    except ValidationError:
        return False
