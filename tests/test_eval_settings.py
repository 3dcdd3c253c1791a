"""What makes two evaluations comparable: the scorer (correctness reward, the rewards and their params, the reward
code) is part of the eval settings, so the gate scores a champion again after a change of scorer; and
`eval.n_samples: 1` samples, as the recorded temperature says."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from grpo_pipeline.configs.schema import EvalConfig, RewardSpec, TinyModelConfig
from grpo_pipeline.tasks.core.common import Ref, fingerprint_path
from grpo_pipeline.tasks.core.stage import RunContext
from grpo_pipeline.tasks.release import champion
from grpo_pipeline.tasks.release.lineage import provenance_tags
from grpo_pipeline.tasks.scoring.evaluation import evaluate_model
from grpo_pipeline.tasks.scoring.generation import generate
from grpo_pipeline.tasks.scoring.items import item_id
from grpo_pipeline.tasks.scoring.results import ITEMS_FILE, EvalResult, scorer_version, summarize
from grpo_pipeline.tasks.training.tiny_model import build_tiny_model

TINY = TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_positions=64)
EVAL = EvalConfig(n_samples=2, k=[1, 2])


def result(
    tmp_path: Path, cfg: EvalConfig = EVAL, rewards: list[RewardSpec] | None = None, name: str = "m"
) -> EvalResult:
    items = [
        {
            "id": item_id(p),
            "prompt": p,
            "answer": "2",
            "greedy": "2",
            "greedy_correct": 1,
            "samples": ["2", "x"],
            "sample_correct": [1, 0],
            "correct_count": 1,
            "scored_count": 2,
            "pass_at_k": {"1": 0.5, "2": 1.0},
            "maj_at_k": {"1": 1, "2": 1},
            "sample_rewards": {},
            "reward_means": {},
            "unscored_reason": None,
        }
        for p in ("1+1=", "0+2=")
    ]
    path = tmp_path / f"items-{name}" / ITEMS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(it) + "\n" for it in items))
    return summarize(items, cfg, name, 0, Ref(path="eval.parquet", fingerprint="f" * 64), path, rewards or [])


def test_the_scorer_is_part_of_the_eval_settings(tmp_path):
    base = result(tmp_path).settings()
    assert base["eval_correctness_reward"] == '[["correctness",{}]]' and base["eval_scorer_version"]
    other_reward = result(
        tmp_path, EVAL.model_copy(update={"correctness_reward": RewardSpec(name="digit_match")})
    ).settings()
    assert other_reward["eval_correctness_reward"] == '[["digit_match",{}]]' and other_reward != base
    short = result(tmp_path, rewards=[RewardSpec(name="overlong", params={"max_len": 8, "cache_len": 4})])
    long = result(tmp_path, rewards=[RewardSpec(name="overlong", params={"max_len": 16, "cache_len": 4})])
    assert short.settings() != long.settings() and short.settings() != base
    assert json.loads(short.settings()["eval_rewards"]) == [["overlong", {"cache_len": 4, "max_len": 8}]]
    # a timeout is how long to wait, not how to score: the same settings
    waits = result(tmp_path, rewards=[RewardSpec(name="overlong", params={"max_len": 8, "cache_len": 4}, timeout_s=9)])
    assert waits.settings() == short.settings()
    # what decides pass/fail of the evaluation is no part of how it scores
    assert result(tmp_path, EVAL.model_copy(update={"max_unscored_fraction": 0.5})).settings() == base


def test_long_reward_params_are_recorded_by_their_hash(tmp_path):
    specs = [RewardSpec(name="judge", params={"prompt_template": "x" * 1000})]
    recorded = result(tmp_path, rewards=specs).settings()["eval_rewards"]
    assert recorded.startswith("sha256:") and len(recorded) < 40


def test_the_scorer_version_follows_the_reward_code(tmp_path, monkeypatch):
    module = tmp_path / "my_scorer.py"
    module.write_text("def check(prompts, completions, **kw):\n    return [1.0] * len(completions)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = scorer_version(["my_scorer:check"])
    assert before == scorer_version(["my_scorer:check"])
    module.write_text("def check(prompts, completions, **kw):\n    return [0.0] * len(completions)\n")
    assert scorer_version(["my_scorer:check"]) != before
    assert scorer_version(["correctness"]) != scorer_version(["my_scorer:check"])


class FakeVersion(SimpleNamespace):
    pass


def test_the_gate_scores_the_champion_again_after_a_change_of_scorer(tmp_path, monkeypatch):
    logged = pd.DataFrame({"id": ["logged"]})
    rescored: list[EvalResult] = []

    def fake_evaluate(model_path, held_out, cfg, **kwargs):
        rescored.append(cfg)
        return SimpleNamespace(items=lambda: pd.DataFrame({"id": ["rescored"]}))

    monkeypatch.setattr(champion, "_logged_items", lambda run_id, artifact=champion.ITEMS_ARTIFACT: logged)
    monkeypatch.setattr(champion, "evaluate_model", fake_evaluate)
    monkeypatch.setattr(champion, "fetch_registered", lambda version, run_dir, out: out)
    ctx = RunContext(run_dir=str(tmp_path), experiment="e", recipe="r", seed=0)
    scored_before = result(tmp_path, rewards=[RewardSpec(name="overlong", params={"max_len": 8, "cache_len": 4})])
    current = FakeVersion(tags=provenance_tags(scored_before), run_id="run", version="1", name="m")

    same = result(tmp_path, rewards=[RewardSpec(name="overlong", params={"max_len": 8, "cache_len": 4})])
    assert champion.champion_items(None, current, same, ctx) is logged and not rescored

    changed = result(tmp_path, rewards=[RewardSpec(name="overlong", params={"max_len": 16, "cache_len": 4})])
    assert list(champion.champion_items(None, current, changed, ctx)["id"]) == ["rescored"]
    other_scorer = result(tmp_path, EVAL.model_copy(update={"correctness_reward": RewardSpec(name="digit_match")}))
    assert list(champion.champion_items(None, current, other_scorer, ctx)["id"]) == ["rescored"]
    # a champion registered before the scorer was recorded has none of its keys: scored again too
    scorer_keys = ("eval_correctness_reward", "eval_rewards", "eval_scorer_version", "eval_items_version")
    old_tags = {k: v for k, v in current.tags.items() if k not in scorer_keys}
    old = FakeVersion(tags=old_tags, run_id="run", version="1", name="m")
    assert list(champion.champion_items(None, old, same, ctx)["id"]) == ["rescored"]
    # the same items sampled by another generator (vLLM, another dtype or vLLM version): scored again
    for generation in ({"backend": "vllm", "dtype": "bfloat16", "vllm_version": "0.32.0"},
                       {"backend": "hf", "dtype": "bfloat16"}):  # fmt: skip
        sampled_otherwise = same.model_copy(update={"generation": generation})
        assert list(champion.champion_items(None, current, sampled_otherwise, ctx)["id"]) == ["rescored"]
    assert len(rescored) == 5


@pytest.fixture
def tiny(tmp_path) -> tuple[Path, Ref]:
    model = build_tiny_model(TINY, tmp_path / "tiny", seed=0)
    path = tmp_path / "eval.parquet"
    rows = pd.DataFrame({"prompt": [f"{i}+{i}=" for i in range(8)], "answer": [str(2 * i) for i in range(8)]})
    rows.to_parquet(path)
    return model, Ref(path=str(path), fingerprint=fingerprint_path(path))


def test_one_sample_per_item_is_sampled_not_greedy(tmp_path, tiny):
    model, held_out = tiny
    cfg = EvalConfig(n_samples=1, k=[1], max_new_tokens=6, temperature=1.0)
    scores = evaluate_model(str(model), held_out, cfg, seed=0, out=tmp_path / "e", label="n1")
    items = scores.items()
    # an untrained model's greedy text is one of many at temperature 1: pass@1 comes from real samples
    assert sum(s[0] != g for s, g in zip(items["samples"], items["greedy"], strict=True)) >= 4
    assert scores.temperature == 1.0 and scores.n_samples == 1


def test_several_completions_need_a_temperature(tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, _ = tiny
    tokenizer = AutoTokenizer.from_pretrained(model)
    with pytest.raises(ValueError, match="temperature"):
        generate(AutoModelForCausalLM.from_pretrained(model), tokenizer, ["1+1="], max_new_tokens=2, batch_size=4, n=4)


# ----------------------------------------------------------------------------- the sampler a checkpoint ships


INSTRUCT_DEFAULTS = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}


def test_a_checkpoints_sampling_defaults_neither_change_the_scores_nor_go_unrecorded(tmp_path, tiny):
    """An instruct checkpoint's generation_config (Qwen2.5-Instruct: repetition_penalty 1.05, top_k 20, ...) would
    apply to every `generate` call that does not set those fields. Evaluation samples as GRPO training does (TRL:
    top_k off, repetition_penalty 1.0), so the same weights score the same with or without those defaults, and the
    result records the sampler applied and the defaults it did not apply."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    from grpo_pipeline.tasks.scoring.generation import AS_IN_TRAINING, applied_settings, generation_kwargs

    model, held_out = tiny
    shipped = tmp_path / "instruct"
    loaded = AutoModelForCausalLM.from_pretrained(model)
    loaded.generation_config = GenerationConfig(**loaded.generation_config.to_diff_dict() | INSTRUCT_DEFAULTS)
    loaded.save_pretrained(shipped)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (model / name).exists():
            (shipped / name).write_bytes((model / name).read_bytes())
    cfg = EvalConfig(n_samples=2, k=[1, 2], max_new_tokens=6, temperature=1.0)
    plain = evaluate_model(str(model), held_out, cfg, seed=0, out=tmp_path / "eval-plain", label="plain")
    instruct = evaluate_model(str(shipped), held_out, cfg, seed=0, out=tmp_path / "eval-instruct", label="instruct")
    pd.testing.assert_series_equal(plain.items()["greedy"], instruct.items()["greedy"])
    assert plain.items()["samples"].tolist() == instruct.items()["samples"].tolist()
    sampled, greedy = instruct.generation["sampled"], instruct.generation["greedy"]
    assert (sampled["temperature"], sampled["top_p"], sampled["repetition_penalty"]) == (1.0, 1.0, 1.0)
    assert "top_k" not in sampled and greedy["do_sample"] is False and sampled["do_sample"] is True
    assert instruct.generation["checkpoint_not_applied"] == INSTRUCT_DEFAULTS
    assert "checkpoint_not_applied" not in plain.generation
    # The record is transformers' own merge, not an echo of the arguments: without them the defaults would apply.
    ours = generation_kwargs(max_new_tokens=6, n=1, temperature=1.0, top_p=1.0, pad=0, stop=[1])
    echo = {k: v for k, v in ours.items() if k not in AS_IN_TRAINING}
    assert applied_settings(AutoModelForCausalLM.from_pretrained(shipped), echo)["repetition_penalty"] == 1.05


def test_the_card_names_the_backend_that_sampled():
    from grpo_pipeline.tasks.release.card import generation_lines

    record = {"greedy": {"temperature": 0.0}, "sampled": {"n": 4, "temperature": 1.0}}
    assert generation_lines({"backend": "vllm", **record})[0].startswith(
        "Sampler applied by vLLM: greedy temperature=0.0"
    )
    assert generation_lines({"backend": "hf", **record})[0].startswith("Sampler applied by `generate`:")
    assert generation_lines({}) == []
