"""Where the benchmarks' runs execute (benchmarks/fanout.py): the `--jobs` thread pool and the `--ray` tasks run the
same command with the same environment changes, and the seed sweep (benchmarks/seeds.py) gets the same rows from
both. The Ray case fans two stand-in runs over a two-node cluster on this machine, in namespaces of its own
(benchmarks/ray_two_nodes.sh), and checks that the two landed on different nodes."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from fanout import ONE_THREAD, Runner
from seeds import run_seeds

# A stand-in for `grpo-pipeline run`: writes what it was asked and the thread settings it got, after a pause long
# enough that two runs given at once overlap (so on a cluster of two one-CPU nodes each goes to its own node).
STAND_IN = """import json, os, sys, time
time.sleep(float(os.environ.get("STAND_IN_SLEEP", "0")))
out = {"args": sys.argv[2:], "omp": os.environ.get("OMP_NUM_THREADS"), "unset": os.environ.get("STAND_IN_UNSET")}
open(sys.argv[1], "w").write(json.dumps(out))
"""


def sweep(runner: Runner, run_dir: Path) -> list[dict]:
    """Two seeds through run_seeds, each a stand-in run started by `runner` (as learning.py starts its runs)."""

    def run_one(seed_dir: Path, overrides: list[str], env: dict[str, str]) -> dict:
        seed_dir.mkdir(parents=True, exist_ok=True)
        changes = {**env, "STAND_IN_UNSET": None, "STAND_IN_SLEEP": os.environ.get("STAND_IN_SLEEP", "0")}
        cmd = [sys.executable, "-c", STAND_IN, str(seed_dir / "out.json"), *overrides]
        ran = runner.launch(cmd, seed_dir, changes)
        return {"node": ran["node"], "out": json.loads((seed_dir / "out.json").read_text())}

    return run_seeds([0, 1], run_dir, ["grpo.rounds=1"], runner, run_one, lambda d, record: record)


def test_the_thread_path_runs_each_seed_with_its_overrides_one_thread_each(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("STAND_IN_UNSET", "set here, unset for the run")
    with Runner(jobs=2) as runner:
        rows = sweep(runner, tmp_path)
    assert [r["seed"] for r in rows] == [0, 1]
    assert [r["out"]["args"] for r in rows] == [[f"seed={s}", f"data.seed={s}", "grpo.rounds=1"] for s in (0, 1)]
    assert {r["out"]["omp"] for r in rows} == {ONE_THREAD["OMP_NUM_THREADS"]}
    assert {r["out"]["unset"] for r in rows} == {None} and {r["node"] for r in rows} == {"local"}


def test_one_job_at_a_time_leaves_the_threads_alone_and_zero_jobs_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with Runner(jobs=1) as runner:
        assert not runner.parallel
        assert {r["out"]["omp"] for r in sweep(runner, tmp_path)} == {None}
    with pytest.raises(ValueError, match="--jobs must be 1 or more"):
        Runner(jobs=0)
    assert Runner(jobs=1, ray_address="127.0.0.1:1").parallel  # Ray runs share the cluster: one thread each
    with pytest.raises(RuntimeError, match="outside `with Runner"):
        Runner(jobs=1, ray_address="127.0.0.1:1").launch([sys.executable, "-c", "0"], tmp_path, {})


def test_a_failed_run_fails_the_sweep(tmp_path) -> None:
    with Runner(jobs=2) as runner, pytest.raises(subprocess.CalledProcessError):
        runner.launch([sys.executable, "-c", "raise SystemExit(3)"], tmp_path, {})


# The driver, run inside benchmarks/ray_two_nodes.sh: the sweep on the thread path, then on the cluster.
DRIVER = """import json, sys
sys.path.insert(0, sys.argv[2])
sys.path.insert(0, sys.argv[3])
from pathlib import Path
from fanout import Runner
from tests.test_fanout import sweep
import os
out = Path(sys.argv[1])
with Runner(jobs=2) as runner:
    threads = sweep(runner, out / "threads")
with Runner(jobs=1, ray_address=os.environ["RAY_ADDRESS"]) as runner:
    on_ray = sweep(runner, out / "ray")
(out / "result.json").write_text(json.dumps({"threads": threads, "ray": on_ray}))
"""


@pytest.mark.ray
@pytest.mark.skipif(os.geteuid() != 0, reason="the two-node cluster runs in namespaces of its own: needs root")
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux) for the cluster's namespaces")
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason='needs Ray: pip install "ray[train]==2.60.0"')
def test_ray_tasks_on_two_nodes_give_the_rows_the_threads_give(tmp_path) -> None:
    script = ROOT / "benchmarks" / "ray_two_nodes.sh"
    env = {**os.environ, "RAY_BIN": str(Path(sys.executable).with_name("ray")), "STAND_IN_SLEEP": "3"}
    env.pop("STAND_IN_UNSET", None)
    cmd = [str(script), sys.executable, "-c", DRIVER, str(tmp_path), str(ROOT / "benchmarks"), str(ROOT)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    threads, on_ray = result["threads"], result["ray"]

    def without_node(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "node"} for r in rows]

    assert without_node(on_ray) == without_node(threads)
    assert len({r["node"] for r in on_ray}) == 2 and "local" not in {r["node"] for r in on_ray}
    assert "2 node(s), 2 CPU(s)" in proc.stdout
