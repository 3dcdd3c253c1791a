"""The deployment files, checked without docker or a cluster: deployments/Dockerfile is parsed instruction by
instruction, deployments/k8s/gpu-base-job-template.json is validated as Prefect's server validates a work pool's base
job template and rendered with its defaults as a worker renders it. Neither is built nor run here.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import uuid
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import pytest
from prefect.server.schemas.actions import validate_base_job_template
from prefect.utilities.schema_tools import is_valid_schema, validate
from prefect.utilities.templating import apply_values, find_placeholders

from grpo_pipeline.tasks.core.runtime import DEFAULTS

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "deployments" / "Dockerfile"
TEMPLATE = ROOT / "deployments" / "k8s" / "gpu-base-job-template.json"


# ------------------------------------------------------------------------------------------------ Dockerfile
def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; continued lines are joined, and comment and blank lines dropped, also
    inside a continued instruction, as Docker's parser does."""
    instructions: list[tuple[str, str]] = []
    current = ""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        keyword, _, arguments = (current + line).partition(" ")
        assert keyword.isalpha(), f"Dockerfile line {number}: {keyword!r} is not an instruction"
        instructions.append((keyword.upper(), " ".join(arguments.split())))
        current = ""
    assert not current, "Dockerfile ends inside a continued instruction"
    return instructions


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return dockerfile_instructions(DOCKERFILE.read_text())


def arguments(instructions: list[tuple[str, str]], keyword: str) -> list[str]:
    return [args for kw, args in instructions if kw == keyword]


def build_args(instructions: list[tuple[str, str]]) -> dict[str, str]:
    """ARG name=default (an ARG without a default maps to '')."""
    return {name: default for name, _, default in (arg.partition("=") for arg in arguments(instructions, "ARG"))}


def env_values(instructions: list[tuple[str, str]]) -> dict[str, str]:
    """Every `ENV KEY=value ...` pair (the legacy `ENV KEY value` form is not used here)."""
    pairs = [token.split("=", 1) for args in arguments(instructions, "ENV") for token in shlex.split(args)]
    assert all(len(pair) == 2 for pair in pairs), f"ENV without '=': {pairs}"
    return dict(pairs)


def shell_commands(instructions: list[tuple[str, str]]) -> list[list[str]]:
    """Each `&&`-separated command of every RUN, as tokens."""
    return [shlex.split(part) for args in arguments(instructions, "RUN") for part in args.split("&&")]


def test_dockerfile_parser_joins_continuations_and_drops_comments():
    text = 'FROM a\n# note\nRUN one \\\n    # inside\n    && two\nCMD ["x"]\n'
    assert dockerfile_instructions(text) == [("FROM", "a"), ("RUN", "one && two"), ("CMD", '["x"]')]


def test_base_image_is_python_311_slim(dockerfile):
    assert dockerfile[0] == ("FROM", "python:3.11-slim")
    assert len(arguments(dockerfile, "FROM")) == 1


def test_torch_pin_matches_makefile_and_defaults_to_the_cpu_index(dockerfile):
    makefile = (ROOT / "Makefile").read_text()
    pinned = re.search(r"^TORCH_VERSION\s*\?=\s*(\S+)", makefile, re.MULTILINE)
    assert pinned, "Makefile has no TORCH_VERSION"
    args = build_args(dockerfile)
    assert args["TORCH_VERSION"] == pinned.group(1)
    assert args["TORCH_INDEX"] == "cpu"
    torch_installs = [cmd for cmd in shell_commands(dockerfile) if cmd[:2] == ["pip", "install"] and "torch" in cmd[2]]
    assert torch_installs == [
        ["pip", "install", "torch==${TORCH_VERSION}", "--index-url", "https://download.pytorch.org/whl/${TORCH_INDEX}"]
    ]


def test_installs_bubblewrap(dockerfile):
    apt = [cmd for cmd in shell_commands(dockerfile) if cmd[:2] == ["apt-get", "install"]]
    assert any("bubblewrap" in cmd for cmd in apt), apt


def test_installs_the_project_not_editable_with_torch_kept(dockerfile):
    copies = arguments(dockerfile, "COPY")
    assert ". ." in copies
    project = [
        cmd
        for cmd in shell_commands(dockerfile)
        if cmd[:2] == ["pip", "install"] and any(t == "." or t.startswith((".[", ".$")) for t in cmd)
    ]
    assert len(project) == 1, project
    assert "-e" not in project[0] and "--editable" not in project[0]
    assert "--constraint" in project[0]  # keeps the pinned torch (the gpu extra must not swap it)


def test_runs_as_a_numeric_non_root_user(dockerfile):
    users = arguments(dockerfile, "USER")
    assert users, "no USER: the image would run as root"
    user = users[-1].split(":")[0]
    # Numeric, since Kubernetes' runAsNonRoot (set in the gpu template) cannot verify a user name.
    assert user.isdigit() and int(user) != 0, user
    last_user = max(i for i, (kw, _) in enumerate(dockerfile) if kw == "USER")
    assert not [kw for kw, _ in dockerfile[last_user:] if kw in ("RUN", "COPY", "ADD")], "steps after USER"
    pod = json.loads(TEMPLATE.read_text())["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_default_command_starts_a_cpu_worker_and_nothing_wraps_it(dockerfile):
    (cmd,) = arguments(dockerfile, "CMD")
    assert json.loads(cmd) == ["prefect", "worker", "start", "--pool", "cpu"]
    # Without an ENTRYPOINT a command given to `docker run` or a Kubernetes Job's args replaces the CMD whole.
    assert not arguments(dockerfile, "ENTRYPOINT")
    assert ("WORKDIR", "/app") in dockerfile


def test_env_defaults_agree_with_runtime_setup(dockerfile):
    env = env_values(dockerfile)
    assert env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    assert env["TOKENIZERS_PARALLELISM"] == "false"
    assert Path(env["PREFECT_HOME"]).is_absolute()
    # One source of truth: where the image sets a default that runtime.setup() also sets, they agree.
    assert {k: v for k, v in env.items() if k in DEFAULTS} == {k: DEFAULTS[k] for k in env if k in DEFAULTS}


def test_dockerignore_keeps_local_state_out_of_the_build_context():
    # `docker build -f deployments/Dockerfile .` reads the .dockerignore at the context's root.
    ignored = {line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".venv", "runs", ".prefect", "mlruns", ".git"} <= ignored


# --------------------------------------------------------------------------------- Kubernetes base job template
@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return json.loads(TEMPLATE.read_text())


def variable_defaults(template: dict[str, Any]) -> dict[str, Any]:
    """The variables' defaults, leaving out None, as prefect's BaseJobConfiguration._get_base_config_defaults does
    (a placeholder without a value is then dropped from the rendered configuration)."""
    properties = template["variables"]["properties"]
    return {name: p["default"] for name, p in properties.items() if p.get("default") is not None}


def render(template: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """The job configuration as a worker renders it from the pool's defaults and a deployment's job variables,
    before prefect-kubernetes adds its own values (env, labels, command, generateName)."""
    return apply_values(template["job_configuration"], {**variable_defaults(template), **overrides})


def container(job_configuration: dict[str, Any]) -> dict[str, Any]:
    return job_configuration["job_manifest"]["spec"]["template"]["spec"]["containers"][0]


def test_template_has_the_work_pool_structure(template):
    assert set(template) == {"job_configuration", "variables"}
    assert template["variables"]["type"] == "object" and template["variables"]["properties"]
    manifest = template["job_configuration"]["job_manifest"]
    assert (manifest["apiVersion"], manifest["kind"]) == ("batch/v1", "Job")


def test_template_passes_the_checks_of_prefects_server(template):
    # What `prefect work-pool create --base-job-template` runs through: the template's shape and placeholders
    # (schemas.actions), a valid JSON schema, and defaults that satisfy it (api.validation).
    validate_base_job_template(template)
    is_valid_schema(template["variables"], preprocess=False)
    validate(
        variable_defaults(template),
        template["variables"],
        raise_on_error=True,
        preprocess=True,
        ignore_required=True,
        allow_none_with_default=True,
    )


def test_every_placeholder_is_a_variable_and_every_variable_is_used(template):
    # Prefect fills in no placeholder names of its own: the server rejects any that `variables` does not declare
    # (`command`, `env`, `labels` and `name` are ordinary variables whose values the worker completes after
    # rendering), and a declared variable that no placeholder uses is silently ignored.
    used = {p.name for p in find_placeholders(template["job_configuration"])}
    assert used == set(template["variables"]["properties"])


def test_rendered_job_requests_gpus(template):
    rendered = render(template)
    limits = container(rendered)["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 1
    assert container(render(template, gpu_count=2))["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert "{{" not in json.dumps(rendered), "a placeholder was left unrendered"


def test_rendered_job_with_defaults(template):
    rendered = render(template)
    pod = rendered["job_manifest"]["spec"]["template"]["spec"]
    assert container(rendered)["image"] == "grpo-pipeline:gpu"
    assert "args" not in container(rendered)  # unset: the worker fills in `prefect flow-run execute`
    assert "MLFLOW_TRACKING_URI" in rendered["env"]
    # PREFECT_API_URL comes from the worker's own settings; a default here would override it.
    assert "PREFECT_API_URL" not in rendered["env"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["nodeSelector"] == {}
    assert render(template, node_selector={"gpu": "l4"})["job_manifest"]["spec"]["template"]["spec"][
        "nodeSelector"
    ] == {"gpu": "l4"}
    # Unset optional quantities leave no key behind, not an empty string Kubernetes would reject.
    assert "memory" not in container(rendered)["resources"]["limits"]
    assert container(rendered)["resources"]["requests"] == {}


def test_manifest_keeps_what_the_kubernetes_worker_requires(template):
    # prefect-kubernetes (worker.py, _get_base_job_manifest) rejects a Job template without these exact values.
    manifest = template["job_configuration"]["job_manifest"]
    pod = manifest["spec"]["template"]["spec"]
    assert (pod["parallelism"], pod["completions"], pod["restartPolicy"]) == (1, 1, "Never")
    assert pod["containers"][0]["name"] == "prefect-job"
    assert "labels" in manifest["metadata"]


def test_kubernetes_worker_builds_a_gpu_job_from_the_template(template):
    """The real thing where prefect-kubernetes is installed (it is not a dependency of the project)."""
    worker = pytest.importorskip("prefect_kubernetes.worker")
    from prefect.client.schemas.objects import FlowRun

    async def job_manifest(values: dict[str, Any]) -> dict[str, Any]:
        # No block or Prefect-variable placeholders in the template, so the client is never called.
        configuration = await worker.KubernetesWorkerJobConfiguration.from_template_and_values(
            template, values, client=MagicMock()
        )
        configuration.prepare_for_flow_run(FlowRun(flow_id=uuid.uuid4(), name="happy-panda"))
        return configuration.job_manifest

    pod = asyncio.run(job_manifest({"gpu_count": 2}))["spec"]["template"]["spec"]
    (job_container,) = pod["containers"]
    assert job_container["resources"]["limits"] == {"nvidia.com/gpu": 2}
    assert job_container["args"] == ["prefect", "flow-run", "execute"]
    assert {"name": "MLFLOW_TRACKING_URI", "value": "http://mlflow:5000"} in job_container["env"]


def test_readme_builds_the_image_the_template_runs(template):
    image = template["variables"]["properties"]["image"]["default"]
    readme = (ROOT / "deployments" / "README.md").read_text()
    assert f"--build-arg TORCH_INDEX=cu128 -t {image} ." in readme
    assert f"--base-job-template {TEMPLATE.relative_to(ROOT)}" in readme
