"""Shared fixtures. Prefect and MLflow state always goes to temporary directories, never the project's."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from grpo_pipeline.runtime import setup

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

# The process defaults every way in applies, before anything imports prefect; Prefect's state goes to a temporary
# directory, never the project's .prefect (tests that run the CLI give each subprocess its own).
if "PREFECT_HOME" not in os.environ:
    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="grpo-tests-prefect-")
    atexit.register(shutil.rmtree, os.environ["PREFECT_HOME"], True)
setup()


@pytest.fixture(scope="session")
def code_sandbox() -> None:
    """Skip where the code sandbox refuses to run programs (root without bubblewrap or an unprivileged uid)."""
    from grpo_pipeline.rewards.sandbox import Sandbox, SandboxUnavailable

    try:
        Sandbox().close()
    except SandboxUnavailable as e:
        pytest.skip(f"the code sandbox cannot run programs here: {e}")


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data directory {SHARED_DATA} is absent")
    return SHARED_DATA
