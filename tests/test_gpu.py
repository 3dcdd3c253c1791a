"""GRPO with vLLM on a CUDA GPU, both ways TRL offers, through the pipeline's own GRPO stage (tasks/grpo.py):

  - colocate: vLLM in the training process, sharing its GPU (the recipes' default);
  - server: a `trl vllm-serve` process on a second GPU, which gets the new weights after every step (NCCL).

The model is a small randomly initialised Qwen2 built locally with a byte-level tokenizer (the builder of
benchmarks/gpu_throughput.py), so nothing is downloaded. Each run trains a few steps in a fresh process (vLLM and
torch.distributed keep state per process) and reports back: the steps logged, TRL's vLLM-only metric
`sampling/sampling_logp_difference/mean` (present only when vLLM generated the rollouts; small only when vLLM
samples from the weights being trained), and which weights changed.

Skipped without CUDA or vllm (`pip install -e ".[gpu]"`); the server test also needs two GPUs.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
STEPS = 3


def _cuda_devices() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


GPUS = _cuda_devices()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS == 0, reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason='needs vllm (pip install -e ".[gpu]")'),
]


def digit_share(prompts: list, completions: list, **_: Any) -> list[float]:
    """The share of digits in each completion: a reward that a random model's completions spread over, so groups
    have a non-zero advantage and the weights move (the task's own rewards are all 0 for a random model)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(len(t), 1) for t in texts]


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory) -> Path:
    spec = importlib.util.spec_from_file_location("gpu_throughput", ROOT / "benchmarks" / "gpu_throughput.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    shape = builder.SMALL_QWEN2  # head_dim 64: a size every vLLM attention backend supports
    return builder.build_qwen2(tmp_path_factory.mktemp("qwen2") / "model", shape, seed=0, dtype="bfloat16")


# A few bf16 GRPO steps with vLLM rollouts and a reward that sees every digit (train_and_report's run)
GRPO_ON_GPU = [
    "model.dtype=bfloat16",
    "sft.enabled=false",
    "data.num_train=64",
    "data.num_eval=8",
    f"grpo.steps_per_round={STEPS}",
    "grpo.prompts_per_step=4",
    "grpo.generations_per_prompt=4",
    "grpo.max_completion_tokens=8",
    "grpo.learning_rate=1e-3",
    "grpo.log_every_steps=1",
    "grpo.probe_problems=0",
    "grpo.save_every_steps=0",
    "grpo.use_vllm=true",
    "grpo.rewards=[{name: 'tests.test_gpu:digit_share'}]",
]


def train_and_report(model_dir: str, run_dir: str, overrides: list[str], report: str) -> None:
    """A few GRPO steps of the pipeline's stage on `model_dir`; writes what the test checks to `report` (JSON).
    Runs in a child process (see the module docstring)."""
    import mlflow
    import torch
    from safetensors.torch import load_file

    from grpo_pipeline.configs.schema import load_config
    from grpo_pipeline.tasks.core.runtime import setup
    from grpo_pipeline.tasks.core.stage import RunContext
    from grpo_pipeline.tasks.data import prepare_data
    from grpo_pipeline.tasks.grpo import GRPORound, grpo_train
    from grpo_pipeline.tasks.model import prepare_base_model

    cfg = load_config(None, [f"run_dir={run_dir}", f"model.base={model_dir}", *GRPO_ON_GPU, *overrides])
    setup(cfg)
    data = prepare_data(cfg.data, cfg.run_dir)
    base = prepare_base_model(cfg.model, cfg.run_dir, cfg.seed)
    policy = grpo_train(
        GRPORound(
            start=base, train=data.train, cfg=cfg.grpo, model_cfg=cfg.model, round_index=1, ctx=RunContext.of(cfg)
        )
    )
    client = mlflow.MlflowClient()

    def history(key: str) -> list[float]:
        return [m.value for m in sorted(client.get_metric_history(policy.run_id, key), key=lambda m: m.step)]

    before = load_file(str(Path(model_dir) / "model.safetensors"))
    after = load_file(str(Path(policy.path) / "model.safetensors"))
    unchanged = sorted(k for k, v in before.items() if torch.equal(v, after[k]))
    Path(report).write_text(
        json.dumps(
            {
                "rewards": history("reward"),
                "logp_difference": history("sampling/sampling_logp_difference/mean"),
                "tensors": len(before),
                "unchanged": unchanged,
            }
        )
    )


def run_child(model_dir: Path, tmp_path: Path, overrides: list[str], timeout: int = 900) -> dict[str, Any]:
    report = tmp_path / "report.json"
    code = "import sys, json; from tests.test_gpu import train_and_report; train_and_report(*json.loads(sys.argv[1]))"
    args = json.dumps([str(model_dir), str(tmp_path / "runs"), overrides, str(report)])
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    result = subprocess.run(
        [sys.executable, "-c", code, args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-8000:]
    return json.loads(report.read_text())


def check_report(report: dict[str, Any]) -> None:
    assert len(report["rewards"]) == STEPS, report
    # Logged only when vLLM generated the rollouts; the trainer's own log-probabilities of vLLM's samples agree
    # with vLLM's only while vLLM holds the weights being trained (bf16 kernels differ by a few hundredths).
    diffs = report["logp_difference"]
    assert len(diffs) == STEPS, "no vLLM sampling metrics: the rollouts were not generated by vLLM"
    assert all(math.isfinite(d) and d < 0.5 for d in diffs), diffs
    # The weights were trained: a full fine-tune moves nearly every tensor (k_proj's bias may stay: adding the same
    # vector to every key leaves the attention softmax unchanged, so its gradient is zero).
    unchanged = [k for k in report["unchanged"] if not k.endswith("k_proj.bias")]
    assert not unchanged, f"{len(unchanged)} of {report['tensors']} tensors did not change: {unchanged}"


def test_grpo_with_vllm_colocated(tiny_qwen2, tmp_path):
    report = run_child(tiny_qwen2, tmp_path, ["grpo.vllm_mode=colocate", "grpo.vllm_gpu_memory_utilization=0.2"])
    check_report(report)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(server: subprocess.Popen, url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"trl vllm-serve exited with code {server.returncode} before answering on {url}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(2)
    raise TimeoutError(f"trl vllm-serve did not answer on {url} within {timeout:.0f} s")


@pytest.mark.skipif(GPUS < 2, reason="server mode puts vLLM on a second GPU (NCCL cannot pair two ranks on one)")
def test_grpo_with_a_vllm_server_on_another_gpu(tiny_qwen2, tmp_path):
    port = _free_port()
    log = (tmp_path / "vllm-serve.log").open("w")
    # The command of docs/gpu.md ("vLLM rollouts"), on the second GPU; the training process uses the first.
    command = [sys.executable, "-m", "trl.cli.main", "vllm-serve", "--model", str(tiny_qwen2)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--gpu_memory_utilization", "0.3", "--max_model_len", "256"]
    server = subprocess.Popen(
        command,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "1"},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        try:
            _wait_healthy(server, f"http://127.0.0.1:{port}/health", timeout=600)
        except (RuntimeError, TimeoutError) as e:
            log.flush()
            pytest.fail(f"{e}; its log ends:\n{(tmp_path / 'vllm-serve.log').read_text()[-4000:]}")
        report = run_child(
            tiny_qwen2,
            tmp_path,
            ["grpo.vllm_mode=server", "grpo.vllm_server_host=127.0.0.1", f"grpo.vllm_server_port={port}"],
        )
        check_report(report)
    finally:  # the server and the engine processes it started, which share its session
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()
