"""What of `make gpu-check` (benchmarks/gpu_check.py) can be checked without a GPU: it refuses with its reason and
measures nothing, its plan names every part, each part's pipeline settings are a valid config, the model it builds
loads as a Qwen2 with a tokenizer that covers every id, and its summary line names the parts that failed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from types import ModuleType

import pytest

from grpo_pipeline.configs.schema import EvalConfig, load_config
from tests.helpers import ROOT

SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_without_cuda_it_refuses_names_what_it_would_measure_and_exits_non_zero(gpu_check) -> None:
    if gpu_check.cuda_devices():
        pytest.skip("this machine has CUDA: the refusal is for machines without it")
    proc = subprocess.run([sys.executable, str(SCRIPT)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("gpu-check: refused: no CUDA device") and "nothing was measured" in last
    assert all(f"  {p.name} " in proc.stdout for p in gpu_check.PARTS)
    assert "s/step" not in last and "tok/s" not in last  # no figure, not even a made-up one
    preflight = subprocess.run([sys.executable, str(SCRIPT), "--preflight"], cwd=ROOT, capture_output=True, timeout=120)
    assert preflight.returncode == 2  # what `make gpu-check` asks before installing the gpu extra


def test_the_plan_lists_every_part_with_what_it_measures(gpu_check) -> None:
    cmd = [sys.executable, str(SCRIPT), "--plan"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    for name in ("vllm_grpo", "eval", "bf16", "qlora", "ddp"):
        assert name in proc.stdout
    assert {p.name for p in gpu_check.PARTS} == set(gpu_check.RUNNERS)


@pytest.mark.parametrize("name", ["vllm_grpo", "bf16", "qlora", "ddp"])
def test_each_training_part_is_a_valid_pipeline_config(gpu_check, tmp_path, name: str) -> None:
    part = gpu_check.BY_NAME[name]
    cfg = load_config(None, [*gpu_check.base_overrides(tmp_path / "model", tmp_path, 4), *part.overrides])
    assert cfg.grpo.steps_per_round == 4 and cfg.sft.enabled is False
    assert cfg.grpo.rewards[0].name == "gpu_check:digit_share"
    if name == "vllm_grpo":
        assert cfg.grpo.use_vllm is True
    else:
        assert cfg.grpo.use_vllm is False
    assert (cfg.model.load_in_4bit, cfg.model.lora is not None) == ((True, True) if name == "qlora" else (False, False))
    assert cfg.distributed.num_processes == (2 if name == "ddp" else 1)


def test_the_evaluation_part_asks_for_vllm(gpu_check) -> None:
    cfg = EvalConfig(**gpu_check.EVAL_SETTINGS, max_unscored_fraction=1.0)
    assert cfg.backend == "vllm" and cfg.n_samples == 8


def test_the_model_it_builds_loads_as_qwen2_and_every_id_decodes(gpu_check, tmp_path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_throughput import SMALL_QWEN2, build_qwen2

    model_dir = build_qwen2(tmp_path / "model", SMALL_QWEN2, seed=0, dtype="bfloat16")
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert model.config.model_type == "qwen2"
    assert model.config.hidden_size // model.config.num_attention_heads == 64  # a head size vLLM supports
    assert len(tokenizer) == SMALL_QWEN2["vocab_size"]
    assert tokenizer.decode(tokenizer("12+34=46")["input_ids"]) == "12+34=46"
    assert gpu_check.digit_share([], ["a1", "xx"]) == [0.5, 0.0]


def test_the_summary_names_failed_parts_and_a_skip_is_not_a_failure(gpu_check) -> None:
    ddp = gpu_check.BY_NAME["ddp"]
    assert gpu_check.skip_reason(ddp, 1) == "1 gpu" and gpu_check.skip_reason(ddp, 2) is None
    assert gpu_check.skip_reason(gpu_check.BY_NAME["eval"], 1) is None
    results = {"vllm_grpo": "0.41 s/step", "qlora": "failed(exit 1)", "ddp": "skipped(1 gpu)"}
    assert gpu_check.summary_line(results, ["qlora"]) == (
        "gpu-check: FAILED(qlora) vllm_grpo=0.41 s/step qlora=failed(exit 1) ddp=skipped(1 gpu)"
    )
    assert gpu_check.summary_line({"ddp": "skipped(1 gpu)"}, []).startswith("gpu-check: ok ")


def test_a_part_that_ran_but_not_as_asked_fails(gpu_check) -> None:
    """The checks read what the pipeline writes of a policy: its rollout engine in words (rollout_engine), the
    precision it trained in, its processes."""
    from grpo_pipeline.tasks.training.vllm_rollouts import rollout_engine

    assert gpu_check.vllm_rollouts({"rollouts": rollout_engine(True, "colocate")}) is None
    assert "not colocated vLLM" in gpu_check.vllm_rollouts({"rollouts": rollout_engine(False, "colocate")})
    assert gpu_check.vllm_rollouts({"rollouts": rollout_engine(True, "server")}) is not None
    mixed = {"weights": "float32", "optimizer_state": "float32", "autocast": "bf16"}
    assert gpu_check.master_weights({"precision": mixed}) is None
    assert gpu_check.master_weights({"precision": {**mixed, "weights": "bfloat16"}}) is not None
    assert gpu_check.master_weights({"precision": {**mixed, "autocast": "none"}}) is not None
    assert gpu_check.two_processes({"processes": 2}) is None and gpu_check.two_processes({"processes": 1})
    assert gpu_check.some_steps({"steps": 4}) is None and gpu_check.some_steps({"steps": 0})
    assert set(gpu_check.CHECKS) == {p.name for p in gpu_check.PARTS} - {"eval"}


def test_a_training_figure_is_the_median_step_after_the_first(gpu_check) -> None:
    # the first step carries CUDA's start-up (11.5 s against 0.23 s on an H200); averaging it in misstates the rate
    assert gpu_check.step_figure([12.3, 2.1, 1.9, 2.0], 4.95) == "2.00 s/step (first 12.3 s)"
    assert gpu_check.step_figure([12.3, 2.5], 7.4) == "2.50 s/step (first 12.3 s)"
    # with fewer than two step times only the average is known, and the figure says it is one
    assert gpu_check.step_figure([3.0], 3.2) == "3.20 s/step (average, first step included)"
    assert gpu_check.step_figure([], 4.95) == "4.95 s/step (average, first step included)"
