"""A tiny Qwen2-architecture stand-in whose tokenizer carries Qwen2.5-Instruct's own chat template (with its
tool-calling branches: TRL's copy, trl/chat_templates/qwen2_5.jinja, which is what TRL matches to pick its response
template), built locally as tasks/training/family_model.py builds rehearsal stand-ins: nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from grpo_pipeline.tasks.training.family_model import build_family_model

QWEN_INSTRUCT = "Qwen/Qwen2.5-0.5B-Instruct"  # only its family and "instruct" are read from the name
# Text the BPE is trained on: what tool-calling turns contain, so the tokens are not all single bytes.
TEXTS = [
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "123 + 456"}}\n</tool_call>',
    "<tools>\n</tools>\n# Tools\n\nYou may call one or more functions to assist with the user query.",
    "What is 123 + 456? The answer is 579.",
    "<tool_response>\n579\n</tool_response>",
] * 20


def qwen_tool_model(out: Path, seed: int = 0) -> Path:
    """Build the stand-in at `out` (once) with Qwen2.5's tool-calling chat template; returns `out`."""
    from trl.chat_template_utils import qwen2_5_chat_template

    if not (out / "config.json").is_file():
        build_family_model(QWEN_INSTRUCT, TEXTS, out, seed)
        tokenizer = AutoTokenizer.from_pretrained(out)
        tokenizer.chat_template = qwen2_5_chat_template
        tokenizer.save_pretrained(out)
    return out
