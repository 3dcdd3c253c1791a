"""The model card of a registered version: what it is, what it was trained and evaluated on, what the gate decided
and how to load it. It is the version's description in the MLflow UI and README.md among its artifacts."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

from grpo_pipeline.configs.schema import RegistryConfig
from grpo_pipeline.tasks.core.common import Checkpoint
from grpo_pipeline.tasks.release.gate import GateDecision
from grpo_pipeline.tasks.scoring.matrix import StageRow, matrix_lines
from grpo_pipeline.tasks.scoring.results import EvalResult
from grpo_pipeline.tasks.scoring.tool_use import is_tool_metric, tool_use_lines


def score_table(result: EvalResult, baseline: EvalResult | None) -> list[str]:
    """The card's scores as markdown table rows: each metric, over how many items, and before GRPO."""
    rows = [
        "| metric | this model | items scored |" + (" before GRPO |" if baseline else ""),
        "|---|---:|---:|" + ("---:|" if baseline else ""),
    ]
    before = baseline.metrics() if baseline else {}
    for name, value in result.metrics().items():
        if is_tool_metric(name):
            continue  # the tool-use table shows them (`tool_lines`)
        shown = f"{value:.3f}"
        if name == "accuracy":
            shown += f" [{result.accuracy_ci[0]:.3f}, {result.accuracy_ci[1]:.3f}]"
        rows.append(
            f"| {name} | {shown} | {result.scored(name)}/{result.num_problems} |"
            + (f" {before[name]:.3f} |" if name in before else (" - |" if baseline else ""))
        )
    return rows


def model_card(
    cfg: RegistryConfig,
    policy: Checkpoint,
    result: EvalResult,
    baseline: EvalResult | None,
    gate: GateDecision,
    tags: dict[str, str],
    config_yaml: str,
    prompt: str,
    suites: dict[str, EvalResult] | None = None,
    baselines: dict[str, EvalResult] | None = None,
    text_calls: bool = False,
    matrix: list[StageRow] | None = None,
) -> str:
    """The card as markdown; `prompt` (an eval prompt) shows how to call the model. `result` and `baseline` are
    the gating suite's scores; every other suite in `suites` gets a table of its own. A policy trained with tools
    gets a Tools section: which, how to give them to it (`text_calls`: the text call protocol of a model whose chat
    template cannot carry tool calls), and how it used them on every suite. A staged recipe's version shows the
    stage x suite matrix so far (`matrix`, this version its last row)."""
    recipe = tags.get("recipe", "?")
    lines = [
        f"# {cfg.model_name}: the {policy.stage} policy of recipe `{recipe}`",
        "",
        f"Trained by grpo-pipeline ({policy.stage}) from `{tags.get('parent_model', policy.parent)}`; config hash "
        f"`{tags.get('config_hash', '?')[:12]}`, code `{tags.get('code_version', '?')}`.",
        "",
        *rehearsal_lines(tags),
        "## Data",
        f"- training data fingerprint `{tags.get('data_fingerprint', '?')[:12]}`",
        f"- eval set fingerprint `{result.eval_fingerprint[:12]}`, {result.num_problems} items",
        *([f"- {tags['decontam.line']}"] if tags.get("decontam.line") else []),
        "",
        *training_lines(policy, tags),
        *evaluation_lines(result, baseline, suites or {}),
        *other_suite_lines(result, suites or {}, baselines or {}),
        *stage_lines(matrix or []),
        *tool_lines(config_yaml, text_calls, {result.suite: result, **(suites or {})}, baselines or {}),
    ]
    notes = [*([f"**Warning**: {tags['sft_warning']}."] if tags.get("sft_warning") else []), *policy.notes]
    if notes:
        lines += ["", "## Training notes", *(f"- {note}" for note in notes)]
    lines += [
        "",
        "## Promotion gate",
        f"**{gate.decision}**: {gate.explain()}.",
        *(f"- {line}" for line in gate.guard_lines()),
        "",
        *load_lines(cfg.model_name, prompt, result.max_new_tokens),
        "",
        CONFIG_HEADING,
        "```yaml",
        config_yaml.rstrip(),
        "```",
    ]
    return "\n".join(lines) + "\n"


def evaluation_lines(result: EvalResult, baseline: EvalResult | None, suites: dict[str, EvalResult]) -> list[str]:
    """The gating suite's section: how it was scored and generated, and its scores beside the baseline's."""
    gating_note = f" on `{result.suite}` (the gating suite)" if len(suites) > 1 else ""
    correct = result.config.correctness_reward.name
    return [
        f"## Evaluation{gating_note} (n={result.n_samples}, temperature {result.temperature}, top_p {result.top_p}, "
        f"max new tokens {result.max_new_tokens}, seed {result.seed}; correct means "
        f"`{correct}` gives 1.0, reward code `{result.scorer_version or '?'}`)",
        "",
        *generation_lines(result.generation),
        *score_table(result, baseline),
        "",
        result.unscored_line() or f"Every completion was scored by the correctness reward `{correct}`.",
    ]


def stage_lines(matrix: list[StageRow]) -> list[str]:
    """A staged recipe's section: the matrix of the stages so far, this version in its last row."""
    if not matrix:
        return []
    note = "The last row is this version; the promotion gate below says whether its stage is kept."
    return ["", "## Stages", "", *matrix_lines(matrix), "", note]


def other_suite_lines(gating: EvalResult, suites: dict[str, EvalResult], baselines: dict[str, EvalResult]) -> list[str]:
    """A table for each suite besides the gating one (the Evaluation section's), with its settings."""
    lines = []
    for name, res in suites.items():
        if name == gating.suite:
            continue
        lines += [
            "",
            f"### Suite `{name}` ({res.num_problems} items, n={res.n_samples}, temperature {res.temperature}, "
            f"max new tokens {res.max_new_tokens}; correct means `{res.config.correctness_reward.name}` gives 1.0)",
            "",
            *score_table(res, baselines.get(name)),
            *([res.unscored_line()] if res.unscored_line() else []),
        ]
    return lines


def tool_lines(
    config_yaml: str, text_calls: bool, suites: dict[str, EvalResult], baselines: dict[str, EvalResult]
) -> list[str]:
    """The Tools section (none for a policy trained without tools): what it was trained with (the resolved config's
    grpo.tools, grpo.environment, grpo.max_tool_turns), how to give it the tools, and its tool use per suite."""
    grpo = trained_tools(config_yaml)
    if not grpo:
        return []
    tools, environment, turns = grpo["tools"], grpo["environment"], grpo["max_tool_turns"]
    trained = ", ".join(f"`{t}`" for t in tools) + (f"; environment `{environment}`" if environment else "")
    lines = ["", "## Tools", f"Trained with tools {trained}, at most {turns} tool call turn(s) per episode.", ""]
    if text_calls:
        lines.append(
            "Its chat template cannot carry tool calls, so it calls in text (agents/text_tools.py): it writes "
            "`<<expression=`; stop it there, run the tool on the expression, append `result>>` and let it go on "
            f"(at most {turns} call(s)); its answer is the text after the last `>>`."
        )
    else:
        lines.append(
            "Give it the same tools through its chat template, as training did (TRL's GRPOTrainer): "
            "`tokenizer.apply_chat_template(messages, tools=[...], add_generation_prompt=True)` with the same "
            "functions (their JSON schemas are rendered into the prompt); parse each reply with "
            "`tokenizer.parse_response` (transformers), run its `tool_calls`, append one "
            '`{"role": "tool", "name": ..., "content": ...}` message per call and generate again, '
            f"at most {turns} time(s); the last assistant message is the answer."
        )
    for name, res in suites.items():
        rows = [("this model", res.tools), ("before GRPO", baselines[name].tools if name in baselines else {})]
        table = tool_use_lines(rows)
        if table:
            lines += ["", f"On `{name}`:", *table[1:]]
    return lines


def trained_tools(config_yaml: str) -> dict[str, Any]:
    """The resolved config's grpo.tools, grpo.environment and grpo.max_tool_turns; {} for a recipe without tools."""
    import yaml

    grpo = (yaml.safe_load(config_yaml) or {}).get("grpo") or {}
    if not grpo.get("tools") and not grpo.get("environment"):
        return {}
    return {"tools": grpo.get("tools") or [], "environment": grpo.get("environment"),
            "max_tool_turns": grpo.get("max_tool_turns")}  # fmt: skip


def training_lines(policy: Checkpoint, tags: dict[str, str]) -> list[str]:
    """How the policy was trained: its GRPO objective, the dtypes training used and what generated the rollouts."""
    return [
        *objective_lines(tags),
        *([f"Trained with {policy.precision}.", ""] if policy.precision else []),
        *([f"GRPO rollouts generated by {policy.rollouts}.", ""] if policy.rollouts else []),
    ]


def load_lines(model_name: str, prompt: str, max_new_tokens: int) -> list[str]:
    """How to load the champion (transformers and pyfunc flavours) and serve it, called on `prompt`."""
    return [
        "## Load it",
        "```python",
        "import mlflow",
        f'generator = mlflow.transformers.load_model("models:/{model_name}@champion")',
        f"print(generator({prompt!r}, max_new_tokens={max_new_tokens}, do_sample=False))",
        f'model = mlflow.pyfunc.load_model("models:/{model_name}@champion")',
        f"print(model.predict([{prompt!r}]))",
        "```",
        f"Serve it: `{serve_line(model_name)}`, then POST `{json.dumps({'inputs': [prompt]})}` to "
        "http://127.0.0.1:5001/invocations (Content-Type: application/json).",
    ]


# MLflow keeps a model version's description in a VARCHAR(5000) column, which PostgreSQL and MySQL enforce (SQLite
# does not): a longer description fails the registration there.
DESCRIPTION_LIMIT = 5000
CONFIG_HEADING = "## Resolved config"


def version_description(card: str) -> str:
    """The card as a model version's description: all of it but the resolved config (the run's `config.yaml` artifact
    and the logged model's README.md have it), and cut at a line to MLflow's limit where it is still longer."""
    head = card.split(f"\n{CONFIG_HEADING}\n", 1)[0].rstrip()
    note = "\n\nThe whole card, resolved config included: README.md of the logged model (and config.yaml of its run).\n"
    if len(head) + len(note) > DESCRIPTION_LIMIT:
        cut = head[: DESCRIPTION_LIMIT - len(note) - 2].rsplit("\n", 1)[0]
        head = cut + "\n…"
    return head + note


def generation_lines(generation: dict) -> list[str]:
    """The sampler the evaluation applied, and what the checkpoint's generation_config asked for that it did not."""
    if not generation:
        return []

    def shown(settings: dict) -> str:
        return ", ".join(f"{k}={v}" for k, v in settings.items())

    engine = "vLLM" if generation.get("backend") == "vllm" else "`generate`"
    lines = [
        f"Sampler applied by {engine}: greedy {shown(generation['greedy'])}; sampled {shown(generation['sampled'])}."
    ]
    if generation.get("checkpoint_not_applied"):
        lines.append(
            f"The checkpoint's generation_config also asks for {shown(generation['checkpoint_not_applied'])}: not "
            "applied, as GRPO training's rollouts do not apply it."
        )
    return [*lines, ""]


def rehearsal_lines(tags: dict[str, str]) -> list[str]:
    """A rehearsal's version (`grpo-pipeline rehearse`) says so first: its scores are not the recipe's."""
    if "rehearsal_of" not in tags:
        return []
    return [
        f"**A rehearsal of recipe `{tags['rehearsal_of']}`** (`grpo-pipeline rehearse`) on a tiny stand-in model with "
        "random initial weights: it proves the recipe's DAG runs, not how well it trains; not for use. What the "
        "rehearsal changed and could not rehearse: `rehearsal:` in the resolved config below.",
        "",
    ]


def objective_lines(tags: dict[str, str]) -> list[str]:
    """The GRPO objective the policy was trained with (the version's `grpo.*` tags, TRL's names), when it has one."""
    settings = [f"{key.removeprefix('grpo.')}={value}" for key, value in tags.items() if key.startswith("grpo.")]
    return ["## Objective (TRL's GRPOConfig)", ", ".join(settings), ""] if settings else []


def serve_line(model_name: str) -> str:
    """The command that serves the champion as written, from any shell: this installation's `grpo-pipeline
    serve-model` by its absolute path (it puts the interpreter's bin directory, where MLflow's server finds uvicorn,
    first on PATH) with the tracking URI of the registry this version is in."""
    import mlflow

    cli = Path(sys.executable).with_name("grpo-pipeline")
    command = [str(cli)] if cli.exists() else [sys.executable, "-m", "grpo_pipeline.cli"]
    args = [
        "serve-model",
        f"models:/{model_name}@champion",
        "--tracking-uri",
        mlflow.get_tracking_uri(),
        "--port",
        "5001",
    ]
    return shlex.join([*command, *args])
