"""Pipeline config schema and the bundled YAML recipes (`*.yaml`; accelerate launch configs in accelerate/).

configs/
  schema.py       the pipeline's one typed config (PipelineConfig), loading and overrides
  base.py         what every section shares: the strict base class, ConfigError, unkeyed fields
  model.py        model:        the base model, dtype, LoRA / QLoRA
  data.py         data:         the source, splits, prompt format, decontamination
  sft.py          sft:          the supervised warmup
  grpo.py         grpo:         the GRPO rounds, rewards, rollouts, checkpoints
  algorithm.py    grpo.algorithm: loss type, clipping, importance sampling, entropy controls
  eval.py         eval:         held-out accuracy, pass@k / maj@k, benchmark suites
  metrics.py      the one grammar of eval metric names (gating, guards, the summary)
  sampling.py     how a policy is sampled (rollouts, probes, the difficulty filter, evaluation), as one value
  registry.py     registry:     the MLflow experiment, registered model and champion gate
  monitors.py     monitors:     the GRPO rounds' training-health alarms
  stages.py       stages:       alignment in stages, each its own data and rewards, gated on its own suite
  distributed.py  distributed:  processes per stage, accelerate or Ray
  rehearsal.py    rehearsal:    set by `grpo-pipeline rehearse`, never by hand
  reference.py    the configuration reference page (docs/configuration-reference.md), generated from the schema
"""

from grpo_pipeline.configs.schema import ConfigError, PipelineConfig, load_config

__all__ = ["ConfigError", "PipelineConfig", "load_config"]
