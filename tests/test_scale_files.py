"""The files docs/scale.md sets real clusters up with: the KubeRay RayCluster manifest has the fields and values the
page relies on, the Ray image installs the Ray the manifest names, the Slurm script is valid bash whose pipeline
overrides are config fields, and the `gpu` pool's job template takes a round with no GPU of its own (its driver)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import textwrap
from typing import Any

import pytest
import yaml
from prefect.utilities.schema_tools import validate

from grpo_pipeline.configs.distributed import DistributedConfig
from tests.helpers import ROOT

MANIFEST = ROOT / "deployments" / "kuberay" / "raycluster.yaml"
RAY_DOCKERFILE = ROOT / "deployments" / "kuberay" / "Dockerfile"
SBATCH = ROOT / "deployments" / "slurm" / "ray-cluster.sbatch"
DOC = ROOT / "docs" / "scale.md"
TEMPLATE = ROOT / "deployments" / "k8s" / "gpu-base-job-template.json"


@pytest.fixture(scope="module")
def cluster() -> dict[str, Any]:
    [document] = list(yaml.safe_load_all(MANIFEST.read_text()))
    return document


def containers(group: dict[str, Any]) -> list[dict[str, Any]]:
    return group["template"]["spec"]["containers"]


def test_it_is_a_raycluster_whose_head_service_is_the_one_the_docs_name(cluster) -> None:
    assert (cluster["apiVersion"], cluster["kind"]) == ("ray.io/v1", "RayCluster")
    service = f"{cluster['metadata']['name']}-head-svc"  # KubeRay's name for the head's Service
    doc = DOC.read_text()
    assert f"{service}.grpo.svc.cluster.local:6379" in doc and f"`{service}`" in doc
    # the driver's pod joins the cluster without offering Ray anything, then drives it from its own node
    assert f"ray start --address={service}.grpo.svc.cluster.local:6379 --num-cpus=0 --num-gpus=0" in doc
    assert '"distributed.ray_address=auto"' in doc and "gpu_count: 0" in doc
    ports = {p["name"]: p["containerPort"] for p in containers(cluster["spec"]["headGroupSpec"])[0]["ports"]}
    assert ports == {"gcs": 6379, "dashboard": 8265, "client": 10001}


def test_the_head_trains_nothing_and_each_worker_offers_ray_the_gpus_kubernetes_gives_it(cluster) -> None:
    head = cluster["spec"]["headGroupSpec"]["rayStartParams"]
    assert (head["num-cpus"], head["num-gpus"]) == ("0", "0")
    [workers] = cluster["spec"]["workerGroupSpecs"]
    assert workers["minReplicas"] <= workers["replicas"] <= workers["maxReplicas"] and workers["replicas"] == 2
    [container] = containers(workers)
    limits, requests = container["resources"]["limits"], container["resources"]["requests"]
    # rayStartParams are strings (KubeRay passes them to `ray start`); Ray's GPUs must be the pod's GPUs
    assert workers["rayStartParams"]["num-gpus"] == limits["nvidia.com/gpu"] == requests["nvidia.com/gpu"] == "1"
    assert workers["rayStartParams"]["num-cpus"] == limits["cpu"]
    assert {"name": "MLFLOW_TRACKING_URI", "value": "http://mlflow:5000"} in container["env"]
    assert "resources_per_worker={GPU: 1, CPU: 8}" in DOC.read_text()  # what one worker pod offers


def test_every_pod_runs_the_ray_image_with_the_manifests_ray_version(cluster) -> None:
    images = {c["image"] for group in (cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"])
              for c in containers(group)}  # fmt: skip
    assert images == {"grpo-pipeline:ray"}
    dockerfile = RAY_DOCKERFILE.read_text()
    assert "-t grpo-pipeline:ray" in dockerfile
    assert re.search(r"^ARG RAY_VERSION=(\S+)$", dockerfile, re.M).group(1) == cluster["spec"]["rayVersion"]
    assert '"ray[train]==${RAY_VERSION}"' in dockerfile


def test_the_sbatch_script_is_valid_bash_and_its_overrides_are_config_fields() -> None:
    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    check = subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    script = SBATCH.read_text()
    fields = set(re.findall(r"distributed\.(\w+)=", script))
    assert fields == {"backend", "num_workers", "resources_per_worker", "ray_address"}
    if "backend" not in DistributedConfig.model_fields:
        pytest.skip("distributed.backend is not in this checkout's config schema yet")
    assert fields <= set(DistributedConfig.model_fields)


def test_the_gpu_pools_job_can_drive_a_ray_round_without_a_gpu() -> None:
    template = json.loads(TEMPLATE.read_text())
    schema = template["variables"]
    [block] = [b for b in re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S) if "job_variables:" in b]
    variables = yaml.safe_load(textwrap.dedent(block))["job_variables"]  # the page's job variables, as written
    validate(variables, schema, raise_on_error=True)
    assert variables["gpu_count"] == 0 and variables["command"].endswith("&& exec prefect flow-run execute'")
    assert shlex.split(variables["command"])[:2] == ["bash", "-c"]  # the pod's args, as the worker splits them
    with pytest.raises(Exception, match=r"gpu_count|minimum|-1"):
        validate({"gpu_count": -1}, schema, raise_on_error=True)
