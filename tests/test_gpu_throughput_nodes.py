"""benchmarks/gpu_throughput.py's figures per GPU and per node: which Ray nodes it measures, the table and its last
line, and (marker ray) that `--ray` sends one task to each GPU node of a two-node cluster on this machine, whose
nodes declare a GPU to Ray (a label: the measurement itself is replaced, there being no GPU here), and says so
plainly where no node offers one."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers import ROOT

SCRIPT = ROOT / "benchmarks" / "gpu_throughput.py"
TWO_NODES = ROOT / "benchmarks" / "ray_two_nodes.sh"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_live_nodes_that_offer_a_gpu_are_measured(bench) -> None:
    nodes = [
        {"NodeID": "a", "Alive": True, "Resources": {"CPU": 8.0, "GPU": 2.0}},
        {"NodeID": "b", "Alive": True, "Resources": {"CPU": 8.0}},
        {"NodeID": "c", "Alive": False, "Resources": {"CPU": 8.0, "GPU": 1.0}},
    ]
    assert [n["NodeID"] for n in bench.gpu_nodes(nodes)] == ["a"]


def test_the_table_has_a_row_per_node_and_a_last_line_over_them(bench) -> None:
    rows = [
        {"where": "node-1", "gpus": "NVIDIA H100", "hf": 1000.0, "vllm": 9000.0},
        {"where": "node-2", "gpus": "NVIDIA H100", "hf": 800.0, "vllm": 7000.0},
    ]
    lines = bench.rows_table(rows).splitlines()
    assert len(lines) == 4 and lines[1].startswith("node-1") and lines[2].split()[-2:] == ["800", "7000"]
    assert lines[-1] == "nodes=2 hf_tokens_per_s=800..1000 vllm_tokens_per_s=7000..9000"


# Inside the cluster's namespaces: the per-node dispatch with the measurement replaced by the node's id.
DRIVER = """import json, os, sys
import ray
sys.path.insert(0, sys.argv[2])
import gpu_throughput

def stand_in(argv):
    return {"where": ray.get_runtime_context().get_node_id(), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "hf": float(len(argv)), "vllm": 0.0}

gpu_throughput.node_rollouts = stand_in
rows = gpu_throughput.per_node(os.environ["RAY_ADDRESS"], ["--completion-tokens", "16"])
open(sys.argv[1], "w").write(json.dumps(rows))
"""


def needs_cluster(test: Callable[..., None]) -> Callable[..., None]:
    """The marks of a test that starts the two-node cluster (benchmarks/ray_two_nodes.sh)."""
    for mark in (
        pytest.mark.ray,
        pytest.mark.skipif(os.geteuid() != 0, reason="the two-node cluster runs in namespaces of its own: needs root"),
        pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)"),
        pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason='needs Ray: pip install "ray[train]"'),
    ):
        test = mark(test)
    return test


def two_nodes(cmd: list[str], node_args: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_BIN": str(Path(sys.executable).with_name("ray")), "RAY_NODE_ARGS": node_args}
    return subprocess.run([str(TWO_NODES), *cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@needs_cluster
def test_ray_sends_one_pinned_task_to_each_gpu_node(tmp_path) -> None:
    out = tmp_path / "rows.json"
    proc = two_nodes([sys.executable, "-c", DRIVER, str(out), str(ROOT / "benchmarks")], node_args="--num-gpus 1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert len(rows) == 2 and len({r["where"] for r in rows}) == 2  # one row per node, each from its own node
    assert {r["gpus"] for r in rows} == {"0"}  # Ray gave each task the one GPU its node declares
    assert {r["hf"] for r in rows} == {2.0}  # the benchmark's own arguments reached each node


@needs_cluster
def test_ray_without_gpu_nodes_says_nothing_was_measured() -> None:
    proc = two_nodes(["sh", "-c", f'{sys.executable} {SCRIPT} --ray "$RAY_ADDRESS"'])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "no node of the Ray cluster at 127.0.0.1:" in proc.stdout and "nothing was measured" in proc.stdout
