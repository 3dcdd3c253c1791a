"""The policy as an MLflow model: a transformers model logged with its model card and pinned requirements, found
again by the checkpoint it holds (so a retried registration reuses it), and the table of sample completions."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_pipeline.tasks.core.common import Checkpoint, load_tokenizer

if TYPE_CHECKING:  # mlflow loads when a version is registered, not when the flow is imported
    import pandas as pd
    from mlflow import MlflowClient
    from mlflow.models.model import ModelInfo


COMPLETIONS_TABLE = "eval/completions.json"

# Set on a logged model once all of it (files and card) is stored: which checkpoint it holds, so a retry reuses it.
CHECKPOINT_TAG = "checkpoint_fingerprint"


def logged_model_of(client: MlflowClient, policy: Checkpoint) -> str | None:
    """A model that an earlier, interrupted registration logged to the policy's run, whole, from this checkpoint."""
    from mlflow.entities import LoggedModelStatus

    experiment = client.get_run(policy.run_id).info.experiment_id
    query = f"source_run_id = '{policy.run_id}' AND tags.{CHECKPOINT_TAG} = '{policy.fingerprint}'"
    found = client.search_logged_models([experiment], filter_string=query)
    return next((m.model_id for m in found if m.status == LoggedModelStatus.READY), None)


def completions_table(items: pd.DataFrame, max_items: int = 25) -> dict[str, list]:
    """A sample of eval items, one row per sampled completion: prompt, completion (a tool episode's final answer),
    correct, reward per function; for tool episodes also the whole conversation (each model turn, tool call and
    tool result, tasks/scoring/evaluation.py `tool_stats`) and its tool calls."""
    items = items.head(max_items)
    table: dict[str, list] = {"item": [], "prompt": [], "completion": [], "correct": []}
    episodes = "sample_conversations" in items
    if episodes:
        table |= {"conversation": [], "tool_calls": []}
    names = (
        sorted({name for rewards in items["sample_rewards"] for name in rewards}) if "sample_rewards" in items else []
    )
    for name in names:
        table[f"reward/{name}"] = []
    for _, item in items.iterrows():
        for j, completion in enumerate(item["samples"]):
            table["item"].append(item["id"])
            table["prompt"].append(str(item["prompt"]))
            table["completion"].append(completion)
            ok = item["sample_correct"][j]
            table["correct"].append(None if ok is None else bool(ok))  # None: unscored
            if episodes:
                table["conversation"].append(transcript(item["sample_conversations"][j]))
                table["tool_calls"].append(int(item["sample_tool_calls"][j]))
            for name in names:
                table[f"reward/{name}"].append(item["sample_rewards"][name][j])
    return table


def transcript(messages: list[dict[str, Any]]) -> str:
    """An episode's turns as text, one block per turn: `[assistant]` with its content and any tool calls it asked
    for (`-> name(arguments)`), `[tool name]` with the result the model read."""
    blocks = []
    for message in messages:
        role = message.get("role", "?")
        head = f"[tool {message['name']}]" if role == "tool" and message.get("name") else f"[{role}]"
        calls = [
            f"-> {call['function']['name']}({json.dumps(call['function'].get('arguments'), ensure_ascii=False)})"
            for call in message.get("tool_calls") or []
            if isinstance(call, dict) and "function" in call
        ]
        content = str(message.get("content") or "")
        blocks.append("\n".join([head, *([content] if content else []), *calls]))
    return "\n\n".join(blocks)


def log_transformers_model(path: Path, card: str, max_new_tokens: int) -> ModelInfo:
    """The checkpoint as an MLflow transformers model (text generation, with its tokenizer, a signature, pinned
    requirements and the model card), so `mlflow.transformers.load_model` and `mlflow.pyfunc.load_model` work on
    its registered versions and `mlflow models serve` can serve them."""
    import mlflow
    from huggingface_hub import ModelCard
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, DataType, ParamSchema, ParamSpec, Schema
    from transformers import AutoModelForCausalLM

    signature = ModelSignature(
        inputs=Schema([ColSpec(DataType.string)]),
        outputs=Schema([ColSpec(DataType.string)]),
        params=ParamSchema(
            [
                ParamSpec("max_new_tokens", DataType.long, max_new_tokens),
                ParamSpec("do_sample", DataType.boolean, False),
                ParamSpec("temperature", DataType.double, 1.0),
                ParamSpec("top_p", DataType.double, 1.0),
            ]
        ),
    )
    components = {"model": AutoModelForCausalLM.from_pretrained(path), "tokenizer": load_tokenizer(str(path))}
    with tempfile.TemporaryDirectory() as tmp:
        info = mlflow.transformers.log_model(
            transformers_model=components,
            name="model",
            task="text-generation",
            signature=signature,
            pip_requirements=pinned_requirements(),
            # Hugging Face's card format wants a metadata block; the card itself is also README.md (below).
            model_card=ModelCard(f"---\nlibrary_name: transformers\ntags: [grpo, grpo-pipeline]\n---\n{card}"),
            metadata={"source_checkpoint": path.name},
        )
        readme = Path(tmp) / "README.md"
        readme.write_text(card)
        mlflow.MlflowClient().log_model_artifact(info.model_id, str(readme))
    return info


def pinned_requirements() -> list[str]:
    """What loading the model needs, pinned to the versions it was saved with (no slow inference by MLflow)."""
    from importlib.metadata import version

    pins = [f"{name}=={version(name)}" for name in ("mlflow", "transformers", "tokenizers", "safetensors")]
    return [*pins, f"torch=={version('torch').split('+')[0]}"]
