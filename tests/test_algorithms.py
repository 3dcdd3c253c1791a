"""The GRPO objective's options (configs/algorithm.py): each in the schema with its help, contradictions refused
with the change that fixes them, and each passed to TRL: a micro GRPO round trains with it, the trainer's own
arguments (read back from it into the round's meta.json) hold the value, and where TRL logs a metric only that
option's code path produces, the round's MLflow run has it."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import mlflow
import pytest

from grpo_pipeline.configs.algorithm import PolicyLossConfig
from grpo_pipeline.configs.schema import ConfigError, PipelineConfig, load_config
from grpo_pipeline.tasks.core.stage import RunContext

MICRO = [
    "seed=0",
    "data.synthetic.max_digits=1",
    "data.num_train=32",
    "data.num_eval=4",
    "data.num_probe=0",
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=1",
    "model.tiny.num_heads=2",
    "model.tiny.intermediate_size=64",
    "model.tiny.max_positions=16",
    "grpo.steps_per_round=2",
    "grpo.prompts_per_step=2",
    "grpo.generations_per_prompt=4",
    "grpo.max_completion_tokens=4",
    "grpo.log_every_steps=1",
    "grpo.save_every_steps=0",
    "grpo.probe_problems=0",
]
# Every option, in the micro runs that exercise it, with a metric TRL logs only on that option's code path.
RUNS = {
    "grpo": (["grpo.loss_type=grpo", "grpo.beta=0.04"], "kl"),
    "dr_grpo": (["grpo.loss_type=dr_grpo", "grpo.scale_rewards=none", "grpo.mask_truncated_completions=true"], None),
    "dapo": (
        ["grpo.loss_type=dapo", "grpo.epsilon_high=0.28", "grpo.delta=1.5", "grpo.top_entropy_quantile=0.2"],
        "clip_ratio/high_mean",
    ),
    "bnpo": (
        ["grpo.loss_type=bnpo", "grpo.num_iterations=2", "grpo.off_policy_mask_threshold=0.5", "grpo.use_vllm=false"],
        None,
    ),
    "cispo": (["grpo.loss_type=cispo", "grpo.epsilon_high=5.0", "grpo.steps_per_generation=2"], "cispo_clip_ratio"),
    "sapo": (["grpo.loss_type=sapo", "grpo.entropy_coef=0.01"], "entropy_coef"),
    "luspo": (["grpo.loss_type=luspo", "grpo.importance_sampling_level=sequence"], None),
    "vespo": (["grpo.loss_type=vespo", "grpo.scale_rewards=batch", "grpo.use_vllm=false"], "vespo/phi_seq_mean"),
    "gspo": (["grpo.loss_type=grpo", "grpo.importance_sampling_level=sequence", "grpo.epsilon=3e-4"], None),
    # vLLM's correction: no vLLM here, so TRL receives the values and the round says they have no effect
    "vllm_correction": (
        [
            "grpo.vllm_importance_sampling_mode=token_truncate",
            "grpo.vllm_importance_sampling_clip_min=0.5",
            "grpo.vllm_importance_sampling_clip_max=2.0",
            "grpo.vllm_importance_sampling_correction=true",
        ],
        None,
    ),
}


def test_every_option_is_in_the_schema_with_its_help():
    fields = PipelineConfig.model_json_schema()["$defs"]["GRPOStageConfig"]["properties"]
    for name in PolicyLossConfig.model_fields:
        assert len(fields[name]["description"]) > 40, name
    assert set(fields["loss_type"]["enum"]) == {"grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"}


def test_every_option_is_exercised_by_a_micro_run():
    exercised = {o.split("=")[0].removeprefix("grpo.") for overrides, _ in RUNS.values() for o in overrides}
    assert exercised | {"epsilon"} >= set(PolicyLossConfig.model_fields)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["grpo.loss_type=cispo"], r"loss_type cispo caps importance weights at epsilon_high.*grpo.epsilon_high"),
        (["grpo.epsilon_high=0.1"], r"epsilon_high \(0.1\) is below epsilon \(0.2\)"),
        (["grpo.loss_type=sapo", "grpo.delta=2"], r"delta \(two-sided clipping\) applies to the clipped losses"),
        (["grpo.delta=1.1"], r"delta \(1.1\) must exceed 1 \+ the upper clipping bound \(1.2\)"),
        (["grpo.loss_type=luspo"], r"luspo is a sequence-level loss; set grpo.importance_sampling_level=sequence"),
        (["grpo.loss_type=vespo", "grpo.importance_sampling_level=sequence"], r"set grpo.importance_sampling_level="),
        (["grpo.importance_sampling_level=sequence"], r"GSPO.*with loss_type dapo.*set grpo.loss_type"),
        (
            ["grpo.vllm_importance_sampling_mode=sequence_truncate", "grpo.vllm_importance_sampling_clip_max=null"],
            r"neither vllm_importance_sampling_clip_min nor _clip_max is set",
        ),
        (["grpo.vllm_importance_sampling_clip_min=4"], r"clip_min \(4.0\) must be below .*clip_max \(3.0\)"),
        (
            ["grpo.use_vllm=false", "grpo.vllm_importance_sampling_mode=token_mask"],
            r"vllm_importance_sampling_mode correct vLLM rollouts but use_vllm is false",
        ),
        (
            ["grpo.use_vllm=false", "grpo.off_policy_mask_threshold=0.5"],
            r"every completion is on-policy; raise grpo.num_iterations",
        ),
        (
            ["grpo.loss_type=vespo", "grpo.vllm_importance_sampling_mode=sequence_mask"],
            r"vespo with vLLM rollouts needs a per-token correction",
        ),
    ],
)
def test_contradictions_are_refused_with_the_fix(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_consistent_settings_load():
    for overrides, _ in RUNS.values():
        load_config(None, [*MICRO, *overrides])
    gspo = load_config(None, ["grpo.loss_type=sapo", "grpo.importance_sampling_level=sequence"]).grpo
    assert gspo.algorithm()["importance_sampling_level"] == "sequence"


def test_trl_gets_every_option_under_its_own_name(tmp_path):
    from grpo_pipeline.tasks.grpo import trl_grpo_args
    from grpo_pipeline.tasks.training.trainer import shared_args

    config = load_config(
        None,
        [*MICRO, *RUNS["dapo"][0], "grpo.entropy_coef=0.05", "grpo.num_iterations=3", "grpo.steps_per_generation=2"],
    )
    cfg = config.grpo
    args = trl_grpo_args(cfg, shared_args(str(tmp_path), True, 0, config.model), [1.0, 0.2])
    for name, value in cfg.algorithm().items():
        assert getattr(args, name) == value, name


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from grpo_pipeline.tasks.data import prepare_data
    from grpo_pipeline.tasks.model import prepare_base_model

    run_dir = tmp_path_factory.mktemp("algorithms")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.setenv("DISABLE_MLFLOW_INTEGRATION", "FALSE")
        cfg = load_config(None, [*MICRO, f"run_dir={run_dir}"])
        data = prepare_data(cfg.data, cfg.run_dir)
        yield run_dir, data.train, prepare_base_model(cfg.model, cfg.run_dir, cfg.seed)


@pytest.mark.integration
@pytest.mark.parametrize("run", list(RUNS))
def test_a_micro_round_trains_with_the_option(base, run, caplog):
    from grpo_pipeline.tasks.grpo import GRPORound, grpo_train

    run_dir, train, start = base
    overrides, metric = RUNS[run]
    cfg = load_config(None, [*MICRO, f"run_dir={run_dir}", *overrides])
    ctx = RunContext(run_dir=str(run_dir), experiment="algorithms", recipe=run, seed=0)
    with caplog.at_level(logging.WARNING):
        policy = grpo_train(
            GRPORound(start=start, train=train, cfg=cfg.grpo, model_cfg=cfg.model, round_index=1, ctx=ctx)
        )
    received = json.loads((Path(policy.path) / "meta.json").read_text())["objective"]
    for override in overrides:
        name = override.split("=")[0].removeprefix("grpo.")
        if name in PolicyLossConfig.model_fields:
            assert received[name] == getattr(cfg.grpo, name), name  # what the trainer ran with, read back from it
    history = mlflow.MlflowClient().get_metric_history(policy.run_id, "loss")
    assert len(history) == 2 and all(math.isfinite(m.value) for m in history)
    if metric is not None:
        assert mlflow.MlflowClient().get_metric_history(policy.run_id, metric), metric
    if run == "vllm_correction":
        assert "correct vLLM rollouts; vLLM is not used here, so they have no effect" in caplog.text


def test_the_registered_version_and_card_record_the_objective():
    from grpo_pipeline.tasks.release.card import objective_lines

    cfg = load_config(None, ["grpo.loss_type=cispo", "grpo.epsilon_high=5.0"]).grpo
    tags = {f"grpo.{name}": str(value) for name, value in cfg.algorithm().items()}
    heading, line, _ = objective_lines(tags)
    assert heading.startswith("## Objective") and "loss_type=cispo" in line and "epsilon_high=5.0" in line
    assert objective_lines({"recipe": "x"}) == []


def test_each_round_peaks_at_its_decayed_learning_rate(tmp_path):
    from grpo_pipeline.tasks.grpo import trl_grpo_args
    from grpo_pipeline.tasks.training.trainer import shared_args

    config = load_config(None, [*MICRO, "grpo.learning_rate=2e-4", "grpo.round_lr_decay=0.5"])
    common = shared_args(str(tmp_path), True, 0, config.model)
    rates = [trl_grpo_args(config.grpo, common, [1.0, 0.2], 1, r).learning_rate for r in (1, 2, 3)]
    assert rates == pytest.approx([2e-4, 1e-4, 5e-5])
    restarted = load_config(None, [*MICRO, "grpo.learning_rate=2e-4"]).grpo
    assert trl_grpo_args(restarted, common, [1.0, 0.2], 1, 3).learning_rate == pytest.approx(2e-4)
    with pytest.raises(ValueError, match="round_lr_decay"):
        load_config(None, [*MICRO, "grpo.round_lr_decay=1.5"])
