"""grpo-pipeline: GRPO post-training for language models as a Prefect DAG of cached, retryable stages."""

__version__ = "0.1.0"
