"""Pipeline config schema and the bundled YAML recipes."""

from grpo_pipeline.configs.schema import ConfigError, PipelineConfig, load_config

__all__ = ["ConfigError", "PipelineConfig", "load_config"]
