"""The Ray tier (`make test-ray`): SFT and GRPO as Ray Train jobs (`distributed.backend: ray`).

The tests that start a Ray cluster do so inside network and PID namespaces of their own (`unshare --net --pid --fork
--mount-proc`, then `ip link set lo up`): Ray hands its workers the machine's interface address, and there only
loopback exists, so nothing the cluster opens can be reached from outside or reach out; and every process the
cluster starts ends with the namespace, whatever happens to the test. `make test` leaves this file out (the Makefile's
`--ignore`), as it does the PostgreSQL tier.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.helpers import ROOT, cli_env, finished, micro_overrides

pytest.importorskip("ray.train.torch", reason="Ray Train is not installed: pip install -e '.[ray]' (make test-ray)")

pytestmark = [pytest.mark.ray, pytest.mark.integration]

# Both paths run the same arithmetic: two processes with the same seed, the same shard of every step each, one thread
# each (torchrun's OMP_NUM_THREADS=1, Ray's one-CPU workers get the same), and an all-reduce of two gradients (a
# sum of two numbers, exact whatever the order). Measured: identical weights (max difference 0.0). The bound leaves
# room only for a float32 rounding or two: a real divergence (another shard, another seed, a lost step) moves some
# weight by about the learning rate (1e-3) at its first Adam step.
WEIGHT_TOLERANCE = 1e-6


def in_namespace(args: list[str]) -> list[str]:
    """`args` run inside fresh network and PID namespaces with loopback up."""
    return ["unshare", "--net", "--pid", "--fork", "--mount-proc", "bash", "-c", 'ip link set lo up && exec "$@"',
            "bash", *args]  # fmt: skip


@pytest.fixture(scope="module")
def namespaces() -> None:
    """Skip (with the reason) where the test cannot make namespaces of its own: not root, or no unshare."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("the Ray tests run the cluster in a namespace of their own and need unshare and ip (util-linux)")
    probe = subprocess.run(in_namespace(["true"]), capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create network and PID namespaces here (needs root): {probe.stderr.strip()[:200]}")


def ray_env(tmp: Path) -> dict[str, str]:
    """The environment of a run with a local Ray cluster: no usage report, one thread per worker, and an
    authentication token of the test's own (Ray 2.60 otherwise writes one to ~/.ray)."""
    return cli_env(
        tmp, RAY_USAGE_STATS_ENABLED="0", OMP_NUM_THREADS="1", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=uuid.uuid4().hex
    )


def test_a_round_split_across_two_nodes_matches_accelerate_and_resumes_after_a_node_dies(
    namespaces: None, tmp_path: Path
) -> None:
    """tests/ray_cluster.py: a head and a second node (`ray start`, one CPU each), one worker of the round on each."""
    done = subprocess.run(
        in_namespace([sys.executable, str(ROOT / "tests" / "ray_cluster.py"), str(tmp_path)]),
        cwd=ROOT,
        env=ray_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=1500,
    )
    result_file = tmp_path / "result.json"
    assert result_file.is_file(), f"the cluster scenario wrote no result:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    result = json.loads(result_file.read_text())
    assert done.returncode == 0 and "error" not in result, (result, done.stderr[-3000:])

    compare = result["compare"]
    assert compare["processes"] == [2, 2]
    assert len(set(compare["nodes_of_ranks"])) == 2, compare  # rank 0 and rank 1 on different nodes
    assert compare["moved_from_base"] > 1e-4, compare  # the round trained: a match is not two untouched copies
    assert compare["max_weight_difference"] <= WEIGHT_TOLERANCE, compare
    assert compare["uri"].startswith("runs:/")  # the result came back through MLflow's artifact store

    resume = result["resume"]
    assert "error" in resume["first_attempt"], resume  # killing the second node failed the first attempt
    assert 2 <= resume["killed_after_mirrored_step"] <= resume["resumed_from_step"] < 8, resume
    assert resume["steps"] == 8, resume


def test_the_tiny_recipe_runs_end_to_end_on_a_local_ray_cluster(namespaces: None, tmp_path: Path) -> None:
    """`grpo-pipeline run` with distributed.backend=ray and no address: SFT and GRPO each as a Ray Train job of two
    workers on a local cluster the run starts, and each model's evaluation suites as Ray tasks sent at once."""
    summary = tmp_path / "summary.json"
    args = ["run", "--config", "configs/tiny-arith.yaml", "--summary-json", str(summary),
            *micro_overrides(tmp_path / "runs"), "distributed.backend=ray", "distributed.num_workers=2"]  # fmt: skip
    done = subprocess.run(
        in_namespace([sys.executable, "-m", "grpo_pipeline.cli", *args]),
        cwd=ROOT,
        env=ray_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    finished(done, summary)
    for stage in ("sft", "grpo-round1"):
        metas = [json.loads(p.read_text()) for p in (tmp_path / "runs" / stage).glob("*/meta.json")]
        assert [m["processes"] for m in metas] == [2], (stage, metas)  # trained by the job's two workers
    # every evaluation ran as a Ray task, and a model's two suites (held-out, one_digit) at the same time
    for model in ("sft", "r1"):
        windows = []
        for label in (model, f"{model}-one_digit"):
            (folder,) = (tmp_path / "runs" / f"eval-{label}").iterdir()
            placement = json.loads((folder / "placement.json").read_text())
            assert (folder / "items.jsonl").is_file(), sorted(folder.iterdir())  # handed back by the task
            windows.append((placement["started"], placement["finished"]))
        (a0, a1), (b0, b1) = windows
        assert a0 < b1 and b0 < a1, (model, windows)  # the two windows overlap
    scores = json.loads(summary.read_text())["scores"]
    assert {s["model"] for s in scores} >= {"sft", "grpo round 1"}, scores


def test_a_gpu_among_the_resources_makes_the_workers_train_on_it() -> None:
    from grpo_pipeline.tasks.core.ray_launch import scaling_config
    from grpo_pipeline.tasks.core.stage import RunContext

    resources = {"GPU": 1.0, "CPU": 8.0}
    ctx = RunContext(run_dir="runs", experiment="e", recipe="r", seed=0, backend="ray", num_processes=4,
                     resources_per_worker=resources)  # fmt: skip
    gpu, cpu = scaling_config(ctx), scaling_config(ctx.model_copy(update={"resources_per_worker": {"CPU": 2.0}}))
    assert (gpu.num_workers, gpu.use_gpu, gpu.resources_per_worker) == (4, True, resources)
    assert (cpu.use_gpu, cpu.resources_per_worker) == (False, {"CPU": 2.0})
