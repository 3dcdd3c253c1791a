"""The check before GRPO (tasks/sft_check.py): an SFT policy far below its own training data is said to be so."""

from __future__ import annotations

import pandas as pd
import pytest

from grpo_pipeline.configs.schema import CORRECTNESS, EvalConfig, MonitorsConfig, load_config
from grpo_pipeline.tasks.core.common import Ref
from grpo_pipeline.tasks.scoring.results import EvalResult
from grpo_pipeline.tasks.sft_check import SFTNotLearnedError, check_sft


def evaluated(accuracy: float) -> EvalResult:
    """An SFT policy's evaluation, as far as the check reads it: its greedy held-out accuracy."""
    return EvalResult(
        model="sft", accuracy=accuracy, accuracy_ci=(0.0, 1.0), pass_at_k={"1": accuracy}, num_problems=500,
        n_samples=1, temperature=1.0, top_p=1.0, max_new_tokens=8, seed=0, eval_fingerprint="eval", eval_path="eval",
        config=EvalConfig(n_samples=1, k=[1]), items_path="items",
    )  # fmt: skip


@pytest.fixture(scope="module")
def slipped_train(tmp_path_factory) -> tuple[Ref, float]:
    """The default recipe's kind of data: an imperfect teacher whose SFT targets drop half the carries; and the
    accuracy of those targets as plain Python counts it (target == answer)."""
    from grpo_pipeline.tasks.data import prepare_data

    overrides = ["data.num_train=300", "data.num_eval=20", "data.synthetic.teacher_carry_slip=0.5"]
    cfg = load_config(None, [*overrides, f"run_dir={tmp_path_factory.mktemp('sft-check')}"])
    refs = prepare_data(cfg.data, cfg.run_dir)
    rows = pd.read_parquet(refs.train.path).head(256)
    return refs.train, float((rows["completion"] == rows["answer"]).mean())


def test_the_bar_is_the_accuracy_of_the_training_targets(slipped_train):
    train, targets = slipped_train
    assert 0.6 < targets < 0.95  # the slips make the targets imperfect, as the default recipe's are
    check = check_sft(train, evaluated(0.9 * targets), CORRECTNESS, MonitorsConfig())
    assert check.targets_accuracy == pytest.approx(targets) and check.rows == 256
    assert check.warning is None


def test_an_sft_on_the_plateau_is_said_to_have_not_learned_with_the_figures(slipped_train, caplog):
    train, targets = slipped_train
    check = check_sft(train, evaluated(0.074), CORRECTNESS, MonitorsConfig(sft_min_ratio=0.5))
    assert check.warning is not None
    assert check.warning.startswith(
        f"SFT has not learned its data: the SFT policy's greedy held-out accuracy is 7.4%, below "
        f"monitors.sft_min_ratio=0.5 x {targets:.1%}, the accuracy of its own training targets (256 rows scored by "
        "'correctness')"
    )
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [check.warning]


def test_a_recipe_can_make_it_an_error(slipped_train):
    train, _ = slipped_train
    with pytest.raises(SFTNotLearnedError, match=r"7.4%.*monitors.sft_not_learned=error stops the run here"):
        check_sft(train, evaluated(0.074), CORRECTNESS, MonitorsConfig(sft_not_learned="error"))
