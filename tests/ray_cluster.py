"""A two-node Ray cluster on this machine, and the micro GRPO rounds tests/test_ray.py checks on it.

Run by tests/test_ray.py as `python tests/ray_cluster.py <folder>` inside network and PID namespaces of the test's own
(`unshare --net --pid --fork --mount-proc`; loopback only, so Ray's addresses reach nothing outside, and every
process of the cluster ends with the namespace). It starts a head and a second node as separate `ray start`
processes (a temp dir and one CPU each, so the two workers of a round land one on each node), runs:
  1. the round with distributed.backend=accelerate (2 processes, torchrun on this machine): the reference;
  2. the same round as a Ray Train job on the cluster;
  3. a longer round, killing the second node once a checkpoint is mirrored in MLflow, then the same round again on
     a restarted second node;
and writes what it measured to `<folder>/result.json`. The cluster is stopped however the rounds end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any

PORT = 6390
# The head declares a node dead after a few missed health checks a second apart (Ray's defaults take up to a minute).
HEALTH_CHECKS = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}
# Rewards with spread (so the rounds move the weights) that also note the Ray node of each rank and slow each step
# down a little (so the second node can be killed between a mirrored checkpoint and the round's end).
REWARDS = textwrap.dedent("""\
    import os
    import time
    from pathlib import Path

    def digits(completions, **kwargs):
        try:
            import ray

            node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "no-ray"
        except ImportError:
            node = "no-ray"
        Path(__file__).with_name(f"node-of-rank{os.environ.get('RANK', '0')}.txt").write_text(node)
        time.sleep(float(os.environ.get("GRPO_PIPELINE_TEST_STEP_DELAY", "0")))
        return [float(sum(ch.isdigit() for ch in str(c))) for c in completions]
""")


def ray_bin() -> str:
    return str(Path(sys.executable).with_name("ray"))


def start_node(folder: Path, temp: Path, name: str, head: bool) -> subprocess.Popen:
    """`ray start --block` for one node, its temp dir under `temp`, in a process group of its own (so that killing
    the group kills the node); its log goes to `<folder>/<name>.log`."""
    where = ["--head", f"--port={PORT}"] if head else [f"--address=127.0.0.1:{PORT}"]
    temp = temp / name
    temp.mkdir(parents=True, exist_ok=True)
    cmd = [ray_bin(), "start", *where, f"--temp-dir={temp}", "--num-cpus=1", "--num-gpus=0",
           "--node-ip-address=127.0.0.1", "--disable-usage-stats", "--block"]  # fmt: skip
    if head:
        cmd.append("--include-dashboard=false")
    log = open(folder / f"{name}.log", "a")  # noqa: SIM115 (kept open for the node's life)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **HEALTH_CHECKS}
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)


def wait_for_nodes(nodes: list[subprocess.Popen], alive: int, dead: int = 0, timeout_s: float = 120) -> None:
    """Until the cluster counts `alive` live nodes and at least `dead` dead ones (asked through a short-lived
    connection: a killed node is declared dead after a few missed health checks). Fails at once when a node's
    `ray start` has exited."""
    probe = (
        f"import ray; ray.init(address='127.0.0.1:{PORT}'); n = ray.nodes(); "
        "print(sum(x['Alive'] for x in n), sum(not x['Alive'] for x in n))"
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if exited := [" ".join(map(str, node.args[2:4])) for node in nodes if node.poll() is not None]:
            raise RuntimeError(f"`ray start {exited[0]}` exited (its log is beside result.json)")
        try:
            done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            continue
        counts = done.stdout.split()[-2:] if done.returncode == 0 else []
        if len(counts) == 2 and int(counts[0]) == alive and int(counts[1]) >= dead:
            return
        time.sleep(1)
    raise TimeoutError(f"the Ray cluster did not reach {alive} live and {dead} dead nodes in {timeout_s:.0f} s")


def kill_node(proc: subprocess.Popen) -> None:
    """SIGKILL a node: its `ray start` process group and every process below it (Ray's workers run in groups of
    their own under the raylet)."""
    import psutil

    below: list[psutil.Process] = []
    with contextlib.suppress(psutil.NoSuchProcess):
        below = psutil.Process(proc.pid).children(recursive=True)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for child in below:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    proc.wait()


def micro_config(run_dir: Path, steps: int, extra: list[str]) -> Any:
    from grpo_pipeline.configs.schema import load_config

    return load_config(
        None,
        [
            f"run_dir={run_dir}",
            "data.num_train=32",
            "data.num_eval=8",
            "model.tiny.hidden_size=32",
            "model.tiny.num_layers=1",
            "model.tiny.num_heads=2",
            "model.tiny.intermediate_size=64",
            f"grpo.steps_per_round={steps}",
            "grpo.prompts_per_step=4",
            "grpo.generations_per_prompt=4",
            "grpo.max_completion_tokens=6",
            "grpo.temperature=1.0",
            "grpo.learning_rate=1e-3",
            "grpo.save_every_steps=2",
            "grpo.probe_problems=0",
            "grpo.rewards=[{name: 'cluster_rewards:digits'}]",
            *extra,
        ],
    )


def train_round(cfg: Any) -> Any:
    """One GRPO round of `cfg` from the tiny base model, as the pipeline runs it."""
    from grpo_pipeline.tasks.core.stage import RunContext
    from grpo_pipeline.tasks.data import prepare_data
    from grpo_pipeline.tasks.grpo import GRPORound, grpo_train
    from grpo_pipeline.tasks.model import prepare_base_model

    data = prepare_data(cfg.data, cfg.run_dir)
    base = prepare_base_model(cfg.model, cfg.run_dir, cfg.seed)
    spec = GRPORound(
        start=base, train=data.train, cfg=cfg.grpo, model_cfg=cfg.model, round_index=1, ctx=RunContext.of(cfg)
    )
    return base, grpo_train(spec)


def weights(path: str) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(Path(path) / "model.safetensors"))


def max_difference(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def on_cluster(extra: list[str] = ()) -> list[str]:
    return ["distributed.backend=ray", "distributed.num_workers=2", f"distributed.ray_address=127.0.0.1:{PORT}", *extra]


def meta_of(policy: Any) -> dict[str, Any]:
    return json.loads((Path(policy.path) / "meta.json").read_text())


def same_round_both_ways(folder: Path) -> dict[str, Any]:
    """The round on accelerate's two local processes, then on the cluster's two nodes: how far their weights are."""
    base, reference = train_round(micro_config(folder / "accelerate", 4, ["distributed.num_processes=2"]))
    started = time.monotonic()
    _, on_ray = train_round(micro_config(folder / "ray", 4, on_cluster()))
    return {
        "max_weight_difference": max_difference(weights(reference.path), weights(on_ray.path)),
        "moved_from_base": max_difference(weights(base.path), weights(reference.path)),
        "nodes_of_ranks": [(folder / f"node-of-rank{r}.txt").read_text() for r in (0, 1)],
        "processes": [meta_of(reference)["processes"], meta_of(on_ray)["processes"]],
        "ray_round_s": round(time.monotonic() - started, 1),
        "uri": on_ray.uri,
    }


def mirrored_step(experiment: str, timeout_s: float) -> int:
    """The first checkpoint step a running round has mirrored to MLflow (tasks/training/checkpoint_mirror.py)."""
    import mlflow

    from grpo_pipeline.tasks.training.checkpoint_mirror import RESUME_STEP_TAG

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        exp = mlflow.get_experiment_by_name(experiment)
        runs = mlflow.MlflowClient().search_runs([exp.experiment_id]) if exp else []
        steps = [int(r.data.tags[RESUME_STEP_TAG]) for r in runs if RESUME_STEP_TAG in r.data.tags]
        if steps:
            return max(steps)
        time.sleep(0.2)
    raise TimeoutError(f"no checkpoint was mirrored to MLflow within {timeout_s:.0f} s")


def kill_and_resume(folder: Path, temp: Path, nodes: list[subprocess.Popen], steps: int) -> dict[str, Any]:
    """A round killed (its second node) after its first mirrored checkpoint, then run again on a new second node."""
    from grpo_pipeline.tasks.core.tracking import configure_mlflow

    cfg = micro_config(folder / "resume", steps, on_cluster())
    configure_mlflow(cfg.run_dir, cfg.registry.experiment)
    first: dict[str, str] = {}

    def attempt() -> None:
        try:
            first["result"] = train_round(cfg)[1].model_dump_json()
        except Exception as e:  # the round must fail: its error is the finding
            first["error"] = f"{type(e).__name__}: {str(e)[:300]}"

    os.environ["GRPO_PIPELINE_TEST_STEP_DELAY"] = "1"  # forwarded to the workers (GRPO_PIPELINE_*)
    thread = threading.Thread(target=attempt)
    thread.start()
    killed_after = mirrored_step(cfg.registry.experiment, timeout_s=300)
    kill_node(nodes.pop())
    thread.join(timeout=300)
    os.environ["GRPO_PIPELINE_TEST_STEP_DELAY"] = "0"
    nodes.append(start_node(folder, temp, "node2-again", head=False))
    wait_for_nodes(nodes, alive=2, dead=1)
    started = time.monotonic()
    _, policy = train_round(cfg)
    return {
        "killed_after_mirrored_step": killed_after,
        "first_attempt": first,
        "resumed_from_step": policy.resumed_from_step,
        "steps": meta_of(policy)["steps"],
        "rerun_s": round(time.monotonic() - started, 1),
    }


def main(folder: Path, phases: list[str]) -> None:
    from grpo_pipeline.tasks.core.runtime import add_import_paths, setup

    setup()
    # Ray 2.60 authenticates every connection with a token; one of the test's own, for every node and the driver
    # (inherited), leaves the user's ~/.ray alone.
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=uuid.uuid4().hex)
    (folder / "cluster_rewards.py").write_text(REWARDS)
    add_import_paths(folder)
    result: dict[str, Any] = {}
    nodes: list[subprocess.Popen] = []
    # Ray's temp dirs hold its sockets, whose paths must stay under 108 bytes: short ones, not under `folder`.
    temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    try:
        started = time.monotonic()
        nodes.append(start_node(folder, temp, "head", head=True))
        wait_for_nodes(nodes, alive=1)
        nodes.append(start_node(folder, temp, "node2", head=False))
        wait_for_nodes(nodes, alive=2)
        result["cluster_start_s"] = round(time.monotonic() - started, 1)
        if "compare" in phases:
            result["compare"] = same_round_both_ways(folder)
        if "resume" in phases:
            result["resume"] = kill_and_resume(folder, temp, nodes, steps=8)
    except Exception as e:
        result["error"] = f"{type(e).__name__}: {e}"
        raise
    finally:
        (folder / "result.json").write_text(json.dumps(result, indent=1))
        stop_cluster(nodes)
        shutil.rmtree(temp, ignore_errors=True)


def stop_cluster(nodes: list[subprocess.Popen]) -> None:
    """Disconnect, `ray stop --force` (it sees only this namespace's processes), and kill every node's group."""
    import ray

    ray.shutdown()
    subprocess.run([ray_bin(), "stop", "--force"], capture_output=True, timeout=60)
    for node in nodes:
        kill_node(node)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2].split(",") if len(sys.argv) > 2 else ["compare", "resume"])
