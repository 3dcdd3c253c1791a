"""What `grpo-pipeline run` prints: no library deprecation noise, no raw trainer log dicts, one progress line per
training stage with its key numbers, and a summary whose tables keep every metric name whole at 100 columns. What
the session's cold micro run printed is read in tests/test_pipeline_integration.py, beside the other tests of that
run."""

from __future__ import annotations

import io
import re
import warnings
from types import SimpleNamespace

from rich.console import Console
from rich.markdown import Markdown

from grpo_pipeline.configs.schema import ModelConfig
from grpo_pipeline.flows.summary import RoundRow, ScoreRow, StageRecord, Summary
from grpo_pipeline.flows.summary_tables import as_markdown, headline, score_groups
from grpo_pipeline.tasks.core.runtime import LIBRARY_WARNINGS, configure_warnings
from grpo_pipeline.tasks.release.gate import GateDecision
from grpo_pipeline.tasks.release.versions import Registration
from grpo_pipeline.tasks.training.progress import ConsoleProgress
from grpo_pipeline.tasks.training.trainer import shared_args

METRICS = ["accuracy", "pass_at_1", "pass_at_4", "pass_at_8", "maj_at_1", "maj_at_4", "maj_at_8"]
METRICS += ["reward/correctness", "reward/format"]  # the default recipe's columns (eval.k: [1, 4, 8], two rewards)
UNSCORED_REASON = "only 5 of 24 items have a accuracy score for the challenger (19 unscored for the challenger)"


def test_the_trainers_arguments_raise_no_deprecation_warning():
    from trl import GRPOConfig, SFTConfig

    common = shared_args("/tmp/unused", main=False, seed=0, model_cfg=ModelConfig())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for config in (SFTConfig, GRPOConfig):
            args = config(**common, max_steps=1)
            assert args.activation_checkpointing is True  # as TRL's default had it, under transformers 5's name
    assert not [w for w in caught if issubclass(w.category, FutureWarning | DeprecationWarning)], caught


def test_library_warnings_are_silenced_by_message_and_module_and_verbose_shows_them():
    message = "`gradient_checkpointing_disable` is deprecated and will be removed in v6. Use `x` instead."

    def raised(module: str) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.warn_explicit(message, FutureWarning, "f.py", 1, module=module, registry={})
        return [str(w.message) for w in caught]

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        configure_warnings(verbose=False)
        assert raised("transformers.modeling_utils") == []
        assert raised("somebody_else") == [message]  # the same text from another module still shows
        configure_warnings(verbose=False)  # a second setup adds nothing twice
        ours = {m for _, m, _ in LIBRARY_WARNINGS}
        assert sum(1 for f in warnings.filters if f[1] is not None and f[1].pattern in ours) == len(ours)
        configure_warnings(verbose=True)
        assert raised("transformers.modeling_utils") == [message]


def test_the_progress_line_carries_the_key_numbers_and_the_probe():
    progress = ConsoleProgress("grpo-round1", probe=SimpleNamespace(history=[(0, 0.25), (10, 0.5)]))
    state = SimpleNamespace(is_world_process_zero=True, global_step=10)
    progress.on_log(None, state, None, logs={"loss": 0.0123, "reward": 0.875, "reward_std": 0.1, "grad_norm": 2.0})
    assert progress.line() == "loss=0.0123, reward=0.875, probe acc=0.5"
    progress.on_log(None, state, None, logs={"train_loss": 0.02, "train_runtime": 3.0})  # the trainer's last log
    assert progress.line() == "loss=0.0123, reward=0.875, probe acc=0.5" and progress.train_loss == 0.02
    assert ConsoleProgress("sft").line() == ""


def default_like_summary() -> Summary:
    """The default recipe's summary shape: three models, nine metrics, a champion, a kept champion and a version
    the gate could not score."""
    metrics = dict.fromkeys(METRICS, 0.75)
    scores = [
        ScoreRow(model=m, metrics=metrics, accuracy_ci=(0.75, 0.82)) for m in ("sft", "grpo round 1", "grpo round 2")
    ]
    gates = [
        GateDecision(metric="accuracy", promote=True, reason="first version", challenger=1.0, n=500, min_delta=0),
        GateDecision(
            metric="accuracy", promote=False, reason="the CI's lower bound is not above min_delta 0.0", n=500,
            challenger=0.992, min_delta=0, champion=1.0, champion_version="1", delta=-0.008, ci_low=-0.016,
            ci_high=-0.002,
        ),
        GateDecision(
            metric="accuracy", promote=False, unscored=True, reason=UNSCORED_REASON, challenger=0.5, n=5, min_delta=0,
            n_excluded=19,
        ),
    ]  # fmt: skip
    return Summary(
        recipe="tiny-arith",
        config_hash="0123456789ab",
        stages=[StageRecord(stage="sft_warmup", seconds=148.0, cached=False, state="Completed")],
        scores=scores,
        registrations=[
            Registration(model_name="tiny-arith-grpo", version=str(i), alias=alias, run_id="r", model_uri="m", gate=g)
            for i, (alias, g) in enumerate(zip(["champion", "challenger", "challenger"], gates, strict=True), 1)
        ],
        eval_settings={"problems": 500, "n": 8, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 5, "seed": 0},
        rounds=[
            RoundRow(model="sft", metric="accuracy", value=0.786, n=500),
            RoundRow(model="grpo round 1", metric="accuracy", value=1.0, change=0.214, change_ci=(0.17, 0.25), n=500),
        ],
        health=[[], []],
    )


def rendered(summary: Summary, width: int) -> str:
    """The summary as the CLI prints it on a console `width` columns wide."""
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(Markdown(as_markdown(summary, width=console.width)))
    return console.export_text()


def test_the_summary_keeps_every_metric_name_whole_at_100_columns():
    text = rendered(default_like_summary(), 100)
    assert "…" not in text
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 100
    headers = {word for line in text.splitlines() for word in line.split()}
    assert set(METRICS) <= headers
    for model in ("sft", "grpo round 1", "grpo round 2"):  # every model has every score
        assert sum(line.startswith(f" {model} ") for line in text.splitlines()) >= 2


def test_the_summary_shows_why_the_gate_left_a_version_unscored():
    text = rendered(default_like_summary(), 100)
    assert "Registered versions of tiny-arith-grpo:" in text
    assert re.search(r"^ v3 +challenger +unscored", text, re.MULTILINE)
    flat = " ".join(text.split())  # the reason wraps over lines
    assert f"tiny-arith-grpo v3: {UNSCORED_REASON}" in flat
    assert "kept champion" in text and "-0.008 [-0.016, -0.002]" in text


def test_an_80_column_console_truncates_nothing():
    text = rendered(default_like_summary(), 80)
    assert "…" not in text
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80
    assert re.search(r"^ v2 +challenger +kept champion +0.992 +v1 \(1.000\)", text, re.MULTILINE)


def test_a_narrow_width_splits_the_score_columns_by_family():
    groups = score_groups(default_like_summary().scores, width=60)
    assert [c for g in groups for c in g] == METRICS
    assert ["reward/correctness", "reward/format"] in groups and ["maj_at_1", "maj_at_4", "maj_at_8"] in groups


def test_the_log_gets_a_one_line_headline_of_the_summary():
    line = headline(default_like_summary())
    assert "\n" not in line
    assert line.startswith("accuracy: sft 0.786, grpo round 1 1.000; registered tiny-arith-grpo v1 -> champion")
    assert line.endswith("; 148 s")


def test_round_notes_are_listed_after_the_health_part():
    summary = default_like_summary().model_copy(update={"notes": [[], ["saturated at step 40: 95% of the groups"]]})
    text = as_markdown(summary)
    assert "Round notes:\n\n- round 2: saturated at step 40: 95% of the groups" in text
    assert "Round notes" not in as_markdown(default_like_summary())  # none to say: no heading
