"""One installed namespace: a wheel of the project holds `grpo_pipeline` and nothing else at the top level."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from grpo_pipeline.tasks.core.stage import SUBPACKAGES
from tests.helpers import ROOT


@pytest.mark.integration
def test_the_wheel_installs_only_the_grpo_pipeline_namespace(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(ROOT), "-w", str(tmp_path)],
        check=True, capture_output=True, cwd=tmp_path,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("grpo_pipeline-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"
    assert {n.split("/")[0] for n in names} == {"grpo_pipeline", dist_info}
    # every design folder is inside the namespace, with its modules and the recipes
    for sub in SUBPACKAGES:
        assert f"grpo_pipeline/{sub}/__init__.py" in names, sub
    assert "grpo_pipeline/configs/tiny-arith.yaml" in names and "grpo_pipeline/tasks/core/stage.py" in names
    # and every subpackage below them, found without a list (setup.py)
    for sub in SUBPACKAGES:
        for init in (ROOT / sub).rglob("__init__.py"):
            assert f"grpo_pipeline/{init.relative_to(ROOT).as_posix()}" in names, init
