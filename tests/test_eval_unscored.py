"""A missing score is not a wrong answer: completions the correctness reward scores None are scored once more, then
left out of accuracy, pass@k and maj@k and counted (`unscored`); above `eval.max_unscored_fraction` the evaluation
stops with the reward's reason and writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from grpo_pipeline.configs.schema import EvalConfig, TinyModelConfig
from grpo_pipeline.rewards.registry import REGISTRY, RewardError
from grpo_pipeline.tasks.core.common import Ref, fingerprint_path
from grpo_pipeline.tasks.scoring.evaluation import evaluate_model
from grpo_pipeline.tasks.scoring.items import score_items
from grpo_pipeline.tasks.scoring.metrics import majority_correct, pass_at_k, scored_pass_at_k
from grpo_pipeline.tasks.scoring.results import ITEMS_FILE, UnscoredError, check_unscored, summarize
from grpo_pipeline.tasks.training.tiny_model import build_tiny_model

TINY = TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_positions=64)
SANDBOX_DOWN = "sandbox error: could not start the program (bwrap: Resource temporarily unavailable)"


def unscorable_reward(calls: list[list[str]] | None = None, fail_first_call: bool = False):
    """A correctness reward like code_tests: "?" cannot be scored (None, with the sandbox's reason in
    `none_reasons`), otherwise 1.0 when the completion is the answer. With `fail_first_call`, only its first call
    leaves the "?" rows unscored (an infrastructure hiccup that a second try gets past)."""

    def factory():
        def reward(prompts, completions, answer, **kwargs):
            if calls is not None:
                calls.append(list(completions))
            first = calls is None or len(calls) == 1 or not fail_first_call
            unscorable = [c == "?" and first for c in completions]
            reward.none_reasons[:] = [SANDBOX_DOWN if u else None for u in unscorable]
            scores = [
                1.0 if c == a or (c == "?" and not u) else 0.0
                for c, a, u in zip(completions, answer, unscorable, strict=True)
            ]
            return [None if u else s for s, u in zip(scores, unscorable, strict=True)]

        reward.none_reasons = []
        return reward

    return factory


@pytest.fixture
def rows() -> pd.DataFrame:
    return pd.DataFrame({"prompt": ["a", "b", "c", "d"], "answer": ["1", "2", "3", "4"]})


def scored(rows, greedy, sampled, monkeypatch, cfg=None, **reward):
    monkeypatch.setitem(REGISTRY, "flaky_check", unscorable_reward(**reward))
    cfg = cfg or EvalConfig(n_samples=2, k=[1, 2], correctness_reward="flaky_check", max_unscored_fraction=1.0)
    items = score_items(rows, greedy, sampled, cfg)
    held_out = Ref(path="eval.parquet", fingerprint="f" * 64)
    return items, summarize(items, cfg, "m", 0, held_out, Path("items.jsonl"))


def test_scored_pass_at_k_uses_only_the_scored_samples():
    assert scored_pass_at_k([True, None, False, None], 1) == pass_at_k(2, 1, 1) == 0.5
    assert scored_pass_at_k([True, None, False, None], 2) == pass_at_k(2, 1, 2) == 1.0
    assert scored_pass_at_k([True, None, None], 2) is None  # one scored sample cannot estimate pass@2
    assert scored_pass_at_k([None, None], 1) is None


def test_majority_vote_with_an_unscored_winner():
    # the winner "7" is judged by its first scored sample, not by the unscored first one
    assert majority_correct(["7", "7", "3"], [None, True, False], 3) is True
    assert majority_correct(["7", "7", "3"], [None, None, True], 3) is None
    assert majority_correct([None, None], [None, None], 2) is False  # no answer at all: wrong, not unscored


def test_unscored_completions_are_left_out_and_counted(rows, monkeypatch):
    greedy = ["1", "?", "0", "4"]
    sampled = [["1", "?"], ["?", "?"], ["0", "3"], ["4", "4"]]
    items, result = scored(rows, greedy, sampled, monkeypatch)
    assert [it["greedy_correct"] for it in items] == [1, None, 0, 1]  # None kept, not 0
    assert items[0]["sample_correct"] == [1, None] and items[0]["scored_count"] == 1
    assert result.accuracy == pytest.approx(2 / 3)  # over the 3 scored items, not 2/4
    assert result.unscored["accuracy"] == 1 and result.scored("accuracy") == 3
    # pass@1: item a 1/1, b unscored, c 1/2, d 2/2; pass@2 needs two scored samples: a and b unscored
    assert result.pass_at_k["1"] == pytest.approx((1 + 0.5 + 1) / 3)
    assert result.pass_at_k["2"] == pytest.approx((1 + 1) / 2)
    assert result.unscored["pass_at_1"] == 1 and result.unscored["pass_at_2"] == 2
    assert result.unscored_completions == 1 + 3
    assert result.unscored_reason == SANDBOX_DOWN and items[1]["unscored_reason"] == SANDBOX_DOWN
    assert items[3]["unscored_reason"] is None
    line = result.unscored_line()
    assert "4 of 12 completions" in line and "accuracy over 3 of 4" in line and SANDBOX_DOWN in line


def test_unscored_completions_are_scored_once_more(rows, monkeypatch):
    calls: list[list[str]] = []
    greedy = ["1", "?", "0", "4"]
    sampled = [["1", "?"], ["2", "2"], ["0", "3"], ["4", "4"]]
    items, result = scored(rows, greedy, sampled, monkeypatch, calls=calls, fail_first_call=True)
    # greedy call, its retry of the one "?"; then the sampled call (first of its kind fails again only once)
    assert calls[1] == ["?"]
    assert result.unscored_completions == 0 and not any(result.unscored.values())
    assert items[1]["greedy_correct"] == 1 and items[1]["unscored_reason"] is None


def test_too_many_unscored_stops_with_the_first_reason(rows, monkeypatch):
    cfg = EvalConfig(n_samples=2, k=[1, 2], correctness_reward="flaky_check", max_unscored_fraction=0.25)
    _, result = scored(rows, ["1", "?", "0", "4"], [["1", "?"], ["?", "?"], ["0", "3"], ["4", "4"]], monkeypatch, cfg)
    with pytest.raises(UnscoredError) as e:
        check_unscored(result, "r1")  # accuracy 1 of 4 is at the limit; pass@2 2 of 4 and the samples 3 of 8 are over
    message = str(e.value)
    assert "pass_at_2: 2 of 4 (50.0%)" in message and "sampled completions: 3 of 8 (37.5%)" in message
    assert "accuracy:" not in message and "pass_at_1" not in message  # 1 of 4 each: at the limit, not over it
    assert "eval.max_unscored_fraction=0.25" in message and SANDBOX_DOWN in message
    assert "nothing is registered" in message
    # a bad input of the pipeline (printed as one error line, not retried) like every RewardError
    from grpo_pipeline.flows.stages import BAD_INPUT

    assert isinstance(e.value, BAD_INPUT) and isinstance(e.value, RewardError)
    check_unscored(result.model_copy(update={"config": cfg.model_copy(update={"max_unscored_fraction": 0.5})}))


def test_the_cap_holds_for_each_metric_on_its_own_items(monkeypatch):
    """Pooled over greedy and sampled completions, 9 unscored greedy items of 50 with 8 scored samples each are 9 of
    450 completions (2%): under the default cap, though accuracy would be over 41 of its 50 items. Each metric is
    capped on its own items, so accuracy's 18% stops the evaluation; 9 unscored samples leave pass@1 scored on every
    problem, and pass@8 (which needs all 8) on 41."""
    many = pd.DataFrame({"prompt": [f"p{i}" for i in range(50)], "answer": [str(i % 10) for i in range(50)]})
    answers = many["answer"].tolist()
    cfg = EvalConfig(n_samples=8, k=[1, 8], correctness_reward="flaky_check")
    greedy = ["?" if i < 9 else a for i, a in enumerate(answers)]
    _, result = scored(many, greedy, [[a] * 8 for a in answers], monkeypatch, cfg)
    assert result.unscored_completions / result.total_completions == pytest.approx(0.02)
    with pytest.raises(UnscoredError, match=r"accuracy: 9 of 50 \(18\.0%\)"):
        check_unscored(result)
    sampled = [["?" if i < 9 and j == 0 else a for j in range(8)] for i, a in enumerate(answers)]
    _, spread = scored(many, answers, sampled, monkeypatch, cfg)
    assert spread.unscored["pass_at_1"] == 0 and spread.unscored["pass_at_8"] == 9  # 7 scored cannot give pass@8
    with pytest.raises(UnscoredError, match=r"pass_at_8: 9 of 50") as e:
        check_unscored(spread)
    assert "pass_at_1" not in str(e.value) and "accuracy:" not in str(e.value)
    check_unscored(spread.model_copy(update={"config": cfg.model_copy(update={"max_unscored_fraction": 0.18})}))


def test_the_default_limit_is_a_config_field_with_a_description():
    field = EvalConfig.model_fields["max_unscored_fraction"]
    assert field.default == 0.02 and field.description
    with pytest.raises(ValueError):
        EvalConfig(max_unscored_fraction=1.5)


@pytest.fixture
def tiny(tmp_path) -> tuple[Path, Ref]:
    model = build_tiny_model(TINY, tmp_path / "tiny", seed=0)
    path = tmp_path / "eval.parquet"
    pd.DataFrame({"prompt": [f"{i}+{i}=" for i in range(6)], "answer": [str(2 * i) for i in range(6)]}).to_parquet(path)
    return model, Ref(path=str(path), fingerprint=fingerprint_path(path))


def never_scores():
    def reward(prompts, completions, **kwargs):
        return [None] * len(completions)

    return reward


def test_an_evaluation_over_the_limit_raises_and_writes_no_items(tmp_path, tiny, monkeypatch):
    monkeypatch.setitem(REGISTRY, "never_scores", never_scores)
    model, held_out = tiny
    cfg = EvalConfig(n_samples=2, k=[1], max_new_tokens=2, correctness_reward="never_scores")
    out = tmp_path / "eval-r1"
    with pytest.raises(UnscoredError) as e:
        evaluate_model(str(model), held_out, cfg, seed=0, out=out, label="r1")
    assert "accuracy: 6 of 6 (100.0%)" in str(e.value) and "sampled completions: 12 of 12" in str(e.value)
    assert "never_scores" in str(e.value)
    assert "returned None without saying why" in str(e.value) and "log" in str(e.value)  # no reason: where to look
    assert not out.exists()


def test_the_eval_command_prints_one_error_line(tmp_path, tiny, monkeypatch):
    from typer.testing import CliRunner

    from grpo_pipeline.cli import app

    monkeypatch.setitem(REGISTRY, "correctness", never_scores)  # what the GSM8K format scores with
    model, _ = tiny
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+{i}?", "answer": f"#### {2 * i}"}) + "\n" for i in range(4)))
    args = ["eval", "--model", str(model), "--data", str(data), "--n", "2", "--max-new-tokens", "2"]
    result = CliRunner().invoke(app, [*args, "--run-dir", str(tmp_path / "runs")])
    assert result.exit_code == 2, result.output
    assert result.output.count("error:") == 1 and "max_unscored_fraction" in result.output
    assert "Traceback" not in result.output


def test_items_file_keeps_none(tmp_path, tiny, monkeypatch):
    """Below the limit the items file keeps None (not False) and the result says how many were left out."""

    def every_other():
        def reward(prompts, completions, **kwargs):  # the items of odd numbers cannot be scored
            return [None if int(p.split("+")[0]) % 2 else 0.0 for p in prompts]

        return reward

    monkeypatch.setitem(REGISTRY, "every_other", every_other)
    model, held_out = tiny
    cfg = EvalConfig(n_samples=2, k=[1], max_new_tokens=2, correctness_reward="every_other", max_unscored_fraction=1)
    result = evaluate_model(str(model), held_out, cfg, seed=0, out=tmp_path / "e", label="x")
    items = [json.loads(line) for line in (tmp_path / "e" / ITEMS_FILE).read_text().splitlines()]
    assert [it["greedy_correct"] for it in items] == [0, None] * 3
    assert [it["sample_correct"] for it in items] == [[0, 0], [None, None]] * 3
    assert result.unscored["accuracy"] == 3 and result.accuracy == 0.0 and result.unscored_completions == 9
    assert result.items()["greedy_correct"].isna().sum() == 3
