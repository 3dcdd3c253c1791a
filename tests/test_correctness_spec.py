"""The correctness reward is one spec (`eval.correctness_reward: {name, params}`) that evaluation, the probes, the
difficulty filter, the SFT check and the preflight all build from; a bare name that is also a training reward takes
that reward's params, so a recipe that trains with `code_tests` under bubblewrap and a float tolerance is evaluated
under the same."""

from __future__ import annotations

import json
import shutil
from typing import Any

import pandas as pd
import pytest

from grpo_pipeline.configs.schema import ConfigError, EvalConfig, RewardSpec, load_config
from grpo_pipeline.rewards.registry import REGISTRY
from grpo_pipeline.tasks.preflight import reward_entries
from grpo_pipeline.tasks.scoring.items import score_items
from grpo_pipeline.tasks.scoring.rollouts import Rollouts

CODE = ["grpo.rewards=[{name: code_tests, params: {isolation: bwrap, float_tolerance: 0.01}}]"]


def test_a_bare_name_takes_the_training_rewards_params():
    cfg = load_config(None, [*CODE, "eval.correctness_reward=code_tests"])
    spec = cfg.eval.correctness_reward
    assert spec == RewardSpec(name="code_tests", params={"isolation": "bwrap", "float_tolerance": 0.01})
    assert ("eval.correctness_reward", "code_tests", spec.params) in reward_entries(cfg.grpo, cfg.eval)
    assert Rollouts.of(cfg).correctness_reward == spec  # the difficulty filter scores with it
    # a spec of its own is kept as given, and a name that is not a training reward has no params to take
    own = load_config(None, [*CODE, "eval.correctness_reward={name: code_tests, params: {mode: fraction}}"])
    assert own.eval.correctness_reward.params == {"mode": "fraction"}
    assert load_config(None, CODE).eval.correctness_reward == RewardSpec(name="correctness")


def test_the_spec_is_part_of_the_eval_settings():
    bare = EvalConfig(correctness_reward="code_tests")
    with_params = EvalConfig(correctness_reward={"name": "code_tests", "params": {"float_tolerance": 0.01}})
    assert bare.correctness_reward.name == with_params.correctness_reward.name == "code_tests"
    assert bare != with_params
    with pytest.raises(ConfigError, match=r"eval\.correctness_reward"):
        load_config(None, ["eval.correctness_reward={params: {}}"])  # no name


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed (apt-get install bubblewrap)")
def test_evaluation_scores_with_the_trained_params(monkeypatch):
    """A stdin program printing 0.301 where 0.3 is expected: right within the recipe's float_tolerance, wrong
    without it. Evaluation built from the pipeline's spec passes it, and builds the sandbox with bubblewrap."""
    built: list[dict[str, Any]] = []
    factory = REGISTRY["code_tests"]

    def spy(**params: Any) -> Any:
        built.append(params)
        return factory(**params)

    monkeypatch.setitem(REGISTRY, "code_tests", spy)
    rows = pd.DataFrame(
        {"prompt": ["print a third of 0.9"], "answer": [""],
         "input_output": [json.dumps({"inputs": [""], "outputs": ["0.3\n"]})]}
    )  # fmt: skip
    greedy, sampled = ["print(0.301)"], [["print(0.301)", "print(0.4)"]]
    cfg = load_config(None, [*CODE, "eval.correctness_reward=code_tests", "eval.n_samples=2", "eval.k=[1]"]).eval
    items = score_items(rows, greedy, sampled, cfg)
    assert built[-1] == {"isolation": "bwrap", "float_tolerance": 0.01}
    assert items[0]["greedy_correct"] == 1 and items[0]["sample_correct"] == [1, 0]
    plain = score_items(rows, greedy, sampled, EvalConfig(n_samples=2, k=[1], correctness_reward="code_tests"))
    assert built[-1] == {} and plain[0]["greedy_correct"] == 0 and plain[0]["sample_correct"] == [0, 0]
