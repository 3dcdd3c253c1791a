"""A tool-using policy's episodes where a run is read: the run summary's tool-use table per suite and the model card's
Tools section (what it was trained with, how to give it the tools, how it used them)."""

from __future__ import annotations

import json
from pathlib import Path

from grpo_pipeline.configs.schema import EvalConfig, RegistryConfig, load_config
from grpo_pipeline.flows.summary import Summary
from grpo_pipeline.flows.summary_tables import as_markdown, score_columns, score_table
from grpo_pipeline.tasks.core.common import Checkpoint
from grpo_pipeline.tasks.release.card import model_card
from grpo_pipeline.tasks.release.gate import GateDecision
from grpo_pipeline.tasks.scoring.results import EvalResult
from grpo_pipeline.tasks.scoring.tool_use import tool_use_table

ROOT = Path(__file__).parents[1]
TOOLS = {"tools/greedy_call_frequency": 1.0, "tools/greedy_used_share": 1.0, "tools/greedy_failure_frequency": 0.0,
         "tools/greedy_turn_limit_share": 0.0, "tools/sampled_call_frequency": 0.95, "tools/sampled_used_share": 0.9,
         "tools/sampled_failure_frequency": 0.05, "tools/sampled_turn_limit_share": 0.125}  # fmt: skip


def result(accuracy: float, tools: dict[str, float], items: Path = Path("items.jsonl")) -> EvalResult:
    """Scores of 8 items (their items file written where `items` is under a test's folder)."""
    if items.parent != Path():
        items.write_text("".join(json.dumps({"id": str(i), "greedy_correct": int(i < 8 * accuracy)}) + "\n"
                                 for i in range(8)))  # fmt: skip
    return EvalResult(model="m", accuracy=accuracy, accuracy_ci=(0.0, 1.0), pass_at_k={"1": accuracy}, num_problems=8,
                      n_samples=1, temperature=1.0, top_p=1.0, max_new_tokens=8, seed=0, eval_fingerprint="e",
                      eval_path="e", config=EvalConfig(n_samples=1, k=[1]), items_path=str(items),
                      tools=tools)  # fmt: skip


def test_the_summary_shows_tool_use_in_a_table_of_its_own(tmp_path: Path) -> None:
    cfg = load_config(ROOT / "configs" / "tiny-tools.yaml")
    sft = {"tools/greedy_call_frequency": 0.5, "tools/sampled_call_frequency": 0.4}
    scores = result(0.625, sft, tmp_path / "items.jsonl")
    summary = Summary.build(cfg, [], scores, [], scores_of={"sft": {"heldout": scores}})
    text = as_markdown(summary)
    assert "Tool use (greedy / sampled episodes" in text
    assert "| sft | 0.50 / 0.40 | - / - |" in text
    assert "tools/" not in " ".join(score_columns(summary.scores))  # not among the scores
    assert score_table(summary)[0]["tools/greedy_call_frequency"] == 0.5  # the Prefect table keeps them
    plain = scores.model_copy(update={"tools": {}})
    assert "Tool use" not in as_markdown(Summary.build(cfg, [], plain, [], scores_of={"sft": {"heldout": plain}}))


def test_the_table_gives_each_reading_greedy_and_sampled() -> None:
    (head, _, row) = tool_use_table([("grpo round 1", TOOLS), ("no tools", {})])
    assert head.startswith("| model | tool calls per problem | episodes that called | failed calls")
    assert row == "| grpo round 1 | 1.00 / 0.95 | 100% / 90% | 0% / 5% | 0% / 12% |"


def test_the_card_says_which_tools_how_to_give_them_and_how_they_were_used(tmp_path: Path) -> None:
    cfg = load_config(ROOT / "configs" / "tiny-tools.yaml")
    gate = GateDecision(metric="accuracy", promote=True, reason="first version", challenger=1.0, n=8, min_delta=0)
    policy = Checkpoint(path=str(tmp_path), fingerprint="c" * 64, stage="grpo-round1")
    card = model_card(RegistryConfig(), policy, result(1.0, TOOLS), result(0.6, {}), gate, {}, cfg.to_yaml(),
                      "1+2=", text_calls=True)  # fmt: skip
    assert "## Tools" in card and "Trained with tools `calculator`, at most 1 tool call turn(s)" in card
    assert "`<<expression=`" in card and "| this model | 1.00 / 0.95 |" in card
    assert "| tools/greedy_call_frequency |" not in card  # not in the score table
    chat = model_card(RegistryConfig(), policy, result(1.0, TOOLS), None, gate, {}, cfg.to_yaml(), "1+2=")
    assert "apply_chat_template(messages, tools=[...]" in chat and "parse_response" in chat
    plain = load_config(ROOT / "configs" / "tiny-arith.yaml").to_yaml()
    assert "## Tools" not in model_card(RegistryConfig(), policy, result(1.0, {}), None, gate, {}, plain, "1+2=")
