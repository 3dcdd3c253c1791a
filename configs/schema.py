"""The pipeline's one typed config.

A recipe is a YAML file validated against `PipelineConfig`; `key.sub=value` overrides from the command line are
applied before validation, so every error names the field and says what to change. The fully resolved config is
saved with every run (MLflow artifact `config.yaml`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

# The sections live one per module beside this one; they are re-exported here, where code has always imported
# them from.
from grpo_pipeline.configs.base import (
    UNKEYED,
    ConfigError,
    Section,
    format_validation_error,
    keyed_view,
    section_hash,
)
from grpo_pipeline.configs.data import FUNCTION_FAMILIES, DataConfig, SyntheticTaskConfig
from grpo_pipeline.configs.distributed import DistributedConfig
from grpo_pipeline.configs.eval import CORRECTNESS, HELDOUT, EvalConfig, EvalSuiteConfig
from grpo_pipeline.configs.grpo import DifficultyFilterConfig, GRPOStageConfig, RewardSpec
from grpo_pipeline.configs.metrics import Metric, split_metric, unknown_metric
from grpo_pipeline.configs.model import LoraAdapterConfig, ModelConfig, TinyModelConfig
from grpo_pipeline.configs.monitors import MonitorsConfig
from grpo_pipeline.configs.registry import RegistryConfig
from grpo_pipeline.configs.rehearsal import RehearsalConfig
from grpo_pipeline.configs.sft import SFTStageConfig
from grpo_pipeline.configs.stages import StageSpec, check_stages, stage_configs

__all__ = [
    "CORRECTNESS",
    "FUNCTION_FAMILIES",
    "HELDOUT",
    "UNKEYED",
    "ConfigError",
    "DataConfig",
    "DifficultyFilterConfig",
    "DistributedConfig",
    "EvalConfig",
    "EvalSuiteConfig",
    "GRPOStageConfig",
    "LoraAdapterConfig",
    "Metric",
    "ModelConfig",
    "MonitorsConfig",
    "PipelineConfig",
    "RegistryConfig",
    "RehearsalConfig",
    "RewardSpec",
    "SFTStageConfig",
    "StageSpec",
    "SyntheticTaskConfig",
    "TinyModelConfig",
    "apply_overrides",
    "keyed_view",
    "load_config",
    "section_hash",
    "split_metric",
]


class PipelineConfig(Section):
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
    sft: SFTStageConfig = Field(default_factory=SFTStageConfig)
    grpo: GRPOStageConfig = Field(default_factory=GRPOStageConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    registry: RegistryConfig = Field(default_factory=RegistryConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    monitors: MonitorsConfig = Field(
        default_factory=MonitorsConfig, description="Health alarms of the GRPO rounds (tasks/training/health.py)."
    )
    stages: list[StageSpec] = Field(
        default=[],
        description="Alignment in stages (configs/stages.py): each its own data, rewards and rounds, starting from "
        "the policy the stage before it kept, and kept only when it gains on its target suite while every earlier "
        "stage's suite holds. Empty: one stage, the recipe itself.",
    )
    rehearsal: RehearsalConfig | None = Field(
        default=None,
        json_schema_extra=UNKEYED,
        description="Set by `grpo-pipeline rehearse`, never by hand: the recipe a run rehearses, what was changed "
        "and what could not be rehearsed (carried by the summary and the model card).",
    )

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        if not v or any(c in v for c in "/\\ "):
            raise ValueError("name must be non-empty without slashes or spaces (it names directories)")
        return v

    @model_validator(mode="before")
    @classmethod
    def _correctness_as_trained(cls, raw: Any) -> Any:
        """A correctness reward given by name alone (eval.correctness_reward, a suite's correctness_reward) takes
        the params and timeout of the grpo.rewards entry of that name: one spec scores training and every
        evaluation alike (see EvalConfig.correctness_reward)."""
        if not isinstance(raw, dict):
            return raw
        section, grpo = raw.get("eval", {}), raw.get("grpo")
        if not isinstance(section, dict) or not isinstance(grpo, dict) or not isinstance(grpo.get("rewards"), list):
            return raw
        trained = {r["name"]: r for r in grpo["rewards"] if isinstance(r, dict) and isinstance(r.get("name"), str)}
        section = {
            **section,
            "correctness_reward": _as_trained(section.get("correctness_reward", CORRECTNESS.name), trained),
        }
        if isinstance(section.get("suites"), list):
            section["suites"] = [
                {**s, "correctness_reward": _as_trained(s["correctness_reward"], trained)}
                if isinstance(s, dict) and s.get("correctness_reward") is not None
                else s
                for s in section["suites"]
            ]
        return {**raw, "eval": section}

    @model_validator(mode="before")
    @classmethod
    def _tools_as_trained(cls, raw: Any) -> Any:
        """Evaluation runs the episodes training runs: eval.tools, eval.tool_params and eval.max_tool_turns, when
        not given, take grpo.tools, grpo.tool_params and grpo.max_tool_turns, and eval.environment takes
        grpo.environment when neither it nor eval.tools is given (the evaluation, the probe and the gate then score
        tool-using episodes; eval.tools=[] opts out)."""
        if not isinstance(raw, dict) or not isinstance(raw.get("grpo", {}), dict):
            return raw
        section, grpo = raw.get("eval", {}), raw.get("grpo", {})
        if not isinstance(section, dict):
            return raw
        filled = dict(section)
        if filled.get("tools") is None and filled.get("environment") is None:
            filled["environment"] = grpo.get("environment")
        if filled.get("tools") is None:
            filled["tools"] = grpo.get("tools", [])
        if filled.get("tool_params") is None:
            filled["tool_params"] = grpo.get("tool_params", {})
        if filled.get("max_tool_turns") is None:
            default = GRPOStageConfig.model_fields["max_tool_turns"].default
            filled["max_tool_turns"] = grpo.get("max_tool_turns", default)
        return {**raw, "eval": filled}

    @model_validator(mode="after")
    def _gate_reads_eval_metrics(self) -> PipelineConfig:
        # The gate reads these after every round has trained: a name the evaluation does not produce would fail the
        # register stage (gating_metric), or leave a guard with nothing to compare and hold back every promotion.
        suites, rewards = self.eval.suite_names(), [r.name for r in self.grpo.rewards]
        named = [("gating_metric", self.registry.gating_metric)]
        named += [(f"guard[{i}]", m) for i, m in enumerate(self.registry.guard)]
        extra = self.registry.guarded(suites)[len(self.registry.guard) :]  # guard_every_suite's
        named += [("guard_every_suite", m) for m in extra]
        for field, metric in named:
            if why := unknown_metric(metric, suites, self.eval, rewards):
                raise ValueError(f"registry.{field}: {why}")
        return self

    @model_validator(mode="after")
    def _fp16_weights_have_master_weights(self) -> PipelineConfig:
        # transformers trains fp16 with a loss scaler (torch's GradScaler), which refuses float16 gradients
        # ("Attempting to unscale FP16 gradients"): full fine-tuning with float16 weights fails at its first step, after
        # the model has loaded, unless DeepSpeed or FSDP keep float32 master weights themselves. LoRA adapters are
        # float32 whatever the base's dtype.
        model, launch = self.model, self.distributed.accelerate_config
        pure_fp16 = model.train_precision == "pure" and model.dtype == "float16" and model.lora is None
        if pure_fp16 and not _keeps_master_weights(launch):
            raise ValueError(
                "model.train_precision is 'pure' with model.dtype float16: fp16 training on CUDA scales the loss and "
                "cannot unscale float16 gradients ('Attempting to unscale FP16 gradients'), so it would fail at its "
                "first step; set model.train_precision=mixed (float32 master weights, fp16 autocast), or "
                "model.dtype=bfloat16, or train with DeepSpeed or FSDP, which keep float32 master weights themselves "
                "(distributed.accelerate_config=configs/accelerate/zero2.yaml, or fsdp2.yaml)"
                + (f"; {launch} is not one of them" if launch else "")
            )
        return self

    def gating_suite(self) -> str:
        """The suite whose metric the gate decides on."""
        return split_metric(self.registry.gating_metric, self.eval.suite_names())[0]

    def stage_configs(self) -> list[tuple[StageSpec | None, PipelineConfig]]:
        """Each stage with the config its rounds run with (configs/stages.py, `stage_configs`); [(None, self)]
        without stages."""
        return stage_configs(self)

    @model_validator(mode="after")
    def _stages_resolve(self) -> PipelineConfig:
        check_stages(self)  # when the recipe loads, as the recipe is (configs/stages.py)
        return self

    @model_validator(mode="after")
    def _probe_has_rows(self) -> PipelineConfig:
        if self.grpo.keep == "best_probe" and not self.data.num_probe:
            raise ValueError(
                "grpo.keep is 'best_probe' but data.num_probe is 0, so there is no probe split to choose the step "
                "by; set data.num_probe (e.g. 128) or grpo.keep=last"
            )
        return self

    @model_validator(mode="after")
    def _best_probe_can_restore_its_step(self) -> PipelineConfig:
        # The probe keeps a step by copying the trainable parameters it sees (tasks/training/probe.py,
        # `trainable_copy`); under ZeRO-3 each process holds only its shard and the module's parameters are empty
        # placeholders outside DeepSpeed's gather, so the copy is empty and the kept step could not be restored.
        launch = self.distributed.accelerate_config
        if self.grpo.keep == "best_probe" and _zero_stage(launch) == 3:
            raise ValueError(
                f"grpo.keep is 'best_probe' but distributed.accelerate_config ({launch}) runs DeepSpeed ZeRO stage 3, "
                "which partitions the parameters: the probe's copy of the kept step would be empty and could not be "
                "restored; set grpo.keep=last, or train with configs/accelerate/zero2.yaml (or fsdp2.yaml, ddp.yaml)"
            )
        return self

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
        n, field = self.distributed.world_size, self.distributed.size_field
        completions = self.grpo.prompts_per_step * self.grpo.generations_per_prompt
        if completions % n:
            raise ValueError(
                f"one GRPO step's {completions} completions (grpo.prompts_per_step x grpo.generations_per_prompt) do "
                f"not split evenly across {field} ({n}); make the product a multiple of {n}"
            )
        if self.sft.batch_size % n:
            raise ValueError(
                f"sft.batch_size ({self.sft.batch_size}) does not split evenly across {field} ({n}); make it a "
                f"multiple of {n}"
            )
        return self

    def fingerprint(self) -> str:
        """sha256 of the canonical JSON of the whole config (the MLflow tag `config_hash`), where it came from aside."""
        return section_hash(self.model_dump(mode="json", exclude={"code_dir"}))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def _keeps_master_weights(accelerate_config: str | None) -> bool:
    """Whether the accelerate config at `accelerate_config` runs DeepSpeed or FSDP (which keep float32 master weights
    of half-precision ones). A file that cannot be read here is taken at its word: launching names it if it is
    missing (tasks/core/launch.py)."""
    if accelerate_config is None:
        return False
    try:
        launch = yaml.safe_load(Path(accelerate_config).read_text())
    except (OSError, yaml.YAMLError):
        return True
    return not isinstance(launch, dict) or launch.get("distributed_type") in ("DEEPSPEED", "FSDP")


def _zero_stage(accelerate_config: str | None) -> int | None:
    """The DeepSpeed ZeRO stage the accelerate config at `accelerate_config` sets (`deepspeed_config.zero_stage`),
    None when it sets none or cannot be read here (launching names a missing file, tasks/core/launch.py)."""
    if accelerate_config is None:
        return None
    try:
        launch = yaml.safe_load(Path(accelerate_config).read_text())
    except (OSError, yaml.YAMLError):
        return None
    deepspeed = launch.get("deepspeed_config") if isinstance(launch, dict) else None
    stage = deepspeed.get("zero_stage") if isinstance(deepspeed, dict) else None
    return stage if isinstance(stage, int) else None


def _as_trained(spec: Any, trained: dict[str, dict]) -> Any:
    """`spec` with the params and timeout of the training reward it names, when it gives a name alone."""
    name = spec if isinstance(spec, str) else spec.get("name") if isinstance(spec, dict) else None
    if name not in trained or (isinstance(spec, dict) and set(spec) - {"name"}):
        return spec  # a spec of its own, or a reward training does not use
    return {"name": name, **{k: trained[name][k] for k in ("params", "timeout_s") if k in trained[name]}}


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
        raise ConfigError(format_validation_error(e, origin)) from None
