"""Training in more than one process (tasks/core/launch.py): a GRPO stage with `distributed.num_processes=2` is trained
by two processes under `accelerate launch` (DDP on the gloo backend, on CPU), and process 0 alone saves it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from grpo_pipeline.configs.schema import ConfigError, load_config
from grpo_pipeline.tasks.core.common import Checkpoint, Ref
from grpo_pipeline.tasks.core.launch import launch_command
from grpo_pipeline.tasks.core.runtime import add_import_paths
from grpo_pipeline.tasks.core.stage import RunContext
from grpo_pipeline.tasks.data import prepare_data
from grpo_pipeline.tasks.grpo import GRPORound, grpo_train
from grpo_pipeline.tasks.model import prepare_base_model
from tests.helpers import ROOT

STEPS = 3
# A reward that also records which process scored which step: each rank scores its own share of the completions.
RANK_REWARD = textwrap.dedent("""\
    import os
    from pathlib import Path

    def by_rank(completions, trainer_state=None, **kwargs):
        if trainer_state is not None:
            log = Path(__file__).with_name(f"scored-by-rank{os.environ.get('RANK', '0')}.txt")
            with open(log, "a") as fh:
                fh.write(f"{trainer_state.global_step} {len(completions)}\\n")
        return [0.0 for _ in completions]
""")


@pytest.mark.integration
def test_grpo_trains_in_two_processes(tmp_path: Path) -> None:
    (tmp_path / "rank_reward.py").write_text(RANK_REWARD)
    add_import_paths(tmp_path)
    cfg = load_config(
        None,
        [
            f"run_dir={tmp_path / 'runs'}",
            "data.num_train=32",
            "data.num_eval=8",
            "model.tiny.hidden_size=32",
            "model.tiny.num_layers=1",
            "model.tiny.num_heads=2",
            "model.tiny.intermediate_size=64",
            f"grpo.steps_per_round={STEPS}",
            "grpo.prompts_per_step=4",
            "grpo.generations_per_prompt=4",
            "grpo.max_completion_tokens=4",
            "grpo.save_every_steps=2",
            "grpo.probe_problems=0",
            "grpo.rewards=[{name: correctness}, {name: 'rank_reward:by_rank', weight: 0.1}]",
            "distributed.num_processes=2",
        ],
    )
    data = prepare_data(cfg.data, cfg.run_dir)
    base = prepare_base_model(cfg.model, cfg.run_dir, cfg.seed)
    policy = grpo_train(
        GRPORound(
            start=base, train=data.train, cfg=cfg.grpo, model_cfg=cfg.model, round_index=1, ctx=RunContext.of(cfg)
        )
    )

    meta = json.loads((Path(policy.path) / "meta.json").read_text())
    assert meta["processes"] == 2 and meta["steps"] == STEPS
    assert policy.run_id  # process 0 logged the round to MLflow
    assert [p.name for p in Path(policy.path).glob("*.safetensors")] == ["model.safetensors"]  # saved once
    assert not list(Path(policy.path).parent.glob(".*saving*"))  # no staging left behind
    for rank in (0, 1):
        scored = (tmp_path / f"scored-by-rank{rank}.txt").read_text().split("\n")[:-1]
        # each process scored its half of every step's 16 completions, for every step
        assert sorted({int(line.split()[0]) for line in scored}) == list(range(STEPS)), (rank, scored)
        assert {int(line.split()[1]) for line in scored} == {8}, (rank, scored)


# Imported by each process (it holds the round's reward): the probe's results depend on the process, and each process
# writes down where it ended and which step it kept. Process 0's probe rises to its best at step 4 and falls, so
# grpo.probe_patience=2 ends the round at step 8 with step 4 kept; process 1's rises to the end (step 12 kept), so
# alone the two would stop at different steps and one would wait for the other in DDP's next all-reduce.
RANK_PROBE = textwrap.dedent("""\
    import json
    import os
    from pathlib import Path

    from grpo_pipeline.tasks.training import probe
    from grpo_pipeline.tasks.training.keep_rule import halves

    RANK = int(os.environ.get("RANK", "0"))
    LEVELS = {0: [1, 2, 3, 2, 1, 1, 1], 1: [0, 1, 2, 3, 4, 4, 4]}  # rows right per half, per probe (steps 0, 2, ..)
    measured = []

    def by_rank(model, tokenizer, rows, reward, max_new_tokens, tools=None):
        right = LEVELS[RANK][len(measured)]
        measured.append(right)
        choose, confirm = halves(len(rows))
        return [1.0 if i in {*choose[:right], *confirm[:right]} else 0.0 for i in range(len(rows))]

    probe.greedy_correct = by_rank
    train_end = probe.HeldOutAccuracyProbe.on_train_end

    def on_train_end(self, args, state, control, **kwargs):
        train_end(self, args, state, control, **kwargs)
        decided = {"ended": state.global_step, "kept": self.kept_step, "notes": self.notes}
        Path(__file__).with_name(f"decided-by-rank{RANK}.json").write_text(json.dumps(decided))

    probe.HeldOutAccuracyProbe.on_train_end = on_train_end

    def zero(completions, **kwargs):
        return [0.0 for _ in completions]
""")


@pytest.mark.integration
@pytest.mark.slow
def test_two_processes_whose_probes_disagree_stop_and_keep_alike(tmp_path: Path) -> None:
    (tmp_path / "rank_probe.py").write_text(RANK_PROBE)
    add_import_paths(tmp_path)
    cfg = load_config(
        None,
        [
            f"run_dir={tmp_path / 'runs'}",
            "data.num_train=32",
            "data.num_eval=8",
            "data.num_probe=8",
            "model.tiny.hidden_size=32",
            "model.tiny.num_layers=1",
            "model.tiny.num_heads=2",
            "model.tiny.intermediate_size=64",
            "grpo.steps_per_round=12",
            "grpo.prompts_per_step=4",
            "grpo.generations_per_prompt=4",
            "grpo.max_completion_tokens=4",
            "grpo.save_every_steps=2",  # each process puts its part of the start into every checkpoint
            "grpo.probe_problems=8",
            "grpo.probe_every_steps=2",
            "grpo.keep=best_probe",
            "grpo.keep_over_start=true",
            "grpo.probe_patience=2",
            "grpo.rewards=[{name: 'rank_probe:zero'}]",
            "distributed.num_processes=2",
        ],
    )
    data = prepare_data(cfg.data, cfg.run_dir)
    base = prepare_base_model(cfg.model, cfg.run_dir, cfg.seed)
    spec = GRPORound(
        start=base,
        train=data.train,
        cfg=cfg.grpo,
        model_cfg=cfg.model,
        round_index=1,
        ctx=RunContext.of(cfg),
        held_out=data.probe,
    )
    policy = grpo_train(spec)

    decided = [json.loads((tmp_path / f"decided-by-rank{rank}.json").read_text()) for rank in (0, 1)]
    assert decided[0] == decided[1]  # the same end, the same kept step, the same notes
    assert (decided[0]["ended"], decided[0]["kept"]) == (8, 4)  # process 0's figures decided
    assert json.loads((Path(policy.path) / "meta.json").read_text())["steps"] == 8
    assert policy.notes == tuple(decided[0]["notes"])


def test_a_launched_process_rebuilds_the_config_as_it_was_written(tmp_path: Path) -> None:
    """The job file carries the fields the user set, not every default: with use_vllm false, a launched process
    rebuilt from a full dump would see the vLLM correction options as given and refuse the config (found by
    rehearsing the multi-GPU recipe)."""
    import inspect
    import typing

    from pydantic import TypeAdapter

    from grpo_pipeline.tasks.core.jobs import job_params

    cfg = load_config(None, ["grpo.use_vllm=false", "grpo.learning_rate=3e-4"])
    start, train = Checkpoint(path="sft", fingerprint="sft"), Ref(path="train", fingerprint="train")
    spec = GRPORound(start=start, train=train, cfg=cfg.grpo, model_cfg=cfg.model, round_index=2, ctx=RunContext.of(cfg))
    params = json.loads(json.dumps(job_params({"spec": spec})))
    hints = typing.get_type_hints(inspect.unwrap(grpo_train))
    rebuilt = {name: TypeAdapter(hints[name]).validate_python(value) for name, value in params.items()}["spec"]
    assert rebuilt == spec and rebuilt.cfg.model_fields_set == cfg.grpo.model_fields_set


def test_batches_must_split_across_processes() -> None:
    with pytest.raises(ConfigError, match=r"distributed\.num_processes"):
        load_config(None, ["distributed.num_processes=3", "grpo.prompts_per_step=8", "grpo.generations_per_prompt=8"])
    with pytest.raises(ConfigError, match=r"sft\.batch_size"):
        load_config(None, ["distributed.num_processes=2", "sft.batch_size=15"])


@pytest.mark.parametrize(
    ("name", "kind"), [("ddp", "MULTI_GPU"), ("fsdp2", "FSDP"), ("zero2", "DEEPSPEED"), ("zero3", "DEEPSPEED")]
)
def test_bundled_accelerate_configs_load(name: str, kind: str, tmp_path: Path) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    path = ROOT / "configs" / "accelerate" / f"{name}.yaml"
    assert load_config_from_file(str(path)).distributed_type.name == kind
    ctx = RunContext(run_dir="runs", experiment="e", recipe="r", seed=0, num_processes=4, accelerate_config=str(path))
    cmd, _ = launch_command(ctx, tmp_path / "job.json")
    assert cmd[1:3] == ["-m", "accelerate.commands.launch"] and cmd[cmd.index("--config_file") + 1] == str(path)
    assert cmd[cmd.index("--num_processes") + 1] == "4"


def test_an_accelerate_config_that_does_not_exist_is_named(tmp_path: Path) -> None:
    ctx = RunContext(run_dir="runs", experiment="e", recipe="r", seed=0, num_processes=2, accelerate_config="nope.yaml")
    with pytest.raises(ConfigError, match=r"distributed\.accelerate_config"):
        launch_command(ctx, tmp_path / "job.json")


def test_zero3_with_best_probe_is_refused_when_the_config_loads():
    """Under ZeRO-3 the probe's parameter copy of the kept step would be empty (the parameters are partitioned), so
    the step it chose could never be restored: the combination is refused before anything runs, saying what to
    change; ZeRO-2 and keep=last stay allowed."""
    zero3 = f"distributed.accelerate_config={ROOT / 'configs/accelerate/zero3.yaml'}"
    best = ["data.num_probe=16", "grpo.probe_problems=16", "grpo.keep=best_probe"]
    with pytest.raises(ConfigError, match="ZeRO stage 3") as e:
        load_config(None, [*best, zero3])
    assert "grpo.keep=last" in str(e.value) and "zero2.yaml" in str(e.value)
    load_config(None, [*best, f"distributed.accelerate_config={ROOT / 'configs/accelerate/zero2.yaml'}"])
    load_config(None, ["grpo.keep=last", zero3])
