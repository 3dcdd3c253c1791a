"""Pipeline config schema and the bundled YAML recipes."""

from configs.schema import ConfigError, PipelineConfig, load_config

__all__ = ["ConfigError", "PipelineConfig", "load_config"]
