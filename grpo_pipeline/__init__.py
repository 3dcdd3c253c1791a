"""grpo-pipeline: GRPO post-training for language models as a Prefect DAG of cached, retryable stages.

This folder is the command line, the top layer: nothing below it imports it (pyproject.toml's import-linter
contracts; `make lint`). The design folders (configs/, flows/, tasks/, rewards/, agents/) install as this
namespace's subpackages.

    grpo_pipeline/
      cli.py          `grpo-pipeline run | config | ...`: the commands, each importing what it runs
      eval_cli.py     `grpo-pipeline eval`: any checkpoint or registered version scored on a recipe's eval split
      rewards_cli.py  `grpo-pipeline rewards`: try rewards on your own completions before training
      rehearse.py     `grpo-pipeline rehearse`: a real recipe's whole DAG on CPU in minutes
      serve_model.py  `grpo-pipeline serve-model`: MLflow's scoring server for a registered version
      stack.py        `grpo-pipeline serve | stop | status`: the local production stack on loopback
"""

__version__ = "0.1.0"
