"""Model-written programs never run as root: the uid every mode runs them under, and the refusal where none works.

As root without bubblewrap, the sandbox can only keep programs away from root by dropping to an unprivileged uid,
which needs an interpreter that other users can run; where there is none it must refuse before running anything,
with one message that says how to fix it (tests below simulate that machine: no bwrap, root, Python under a 0700
directory). The only program these tests offer where a refusal is expected writes a canary file, and they assert it
was never written: a broken refusal shows up as a failure, not as harm.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grpo_pipeline.rewards import build_reward
from grpo_pipeline.rewards import code as code_module
from grpo_pipeline.rewards.code import humaneval_job
from grpo_pipeline.rewards.registry import RewardError
from grpo_pipeline.rewards.sandbox import CodeJob, Mode, Sandbox, SandboxConfig, SandboxUnavailable
from grpo_pipeline.rewards.sandbox import host as sandbox_host
from tests.test_sandbox import make_sandbox

PROMPT = 'def f(x):\n    """Return twice x."""\n'
# Passes only where neither the program (at import and when called) nor the tests' process has uid or euid 0.
NOT_ROOT_PROGRAM = textwrap.dedent(
    """
    import os
    LOADED_AS = os.getresuid()
    def f(x):
        return 2 * x if 0 not in LOADED_AS + os.getresuid() else -1
    """
)
NOT_ROOT_TEST = textwrap.dedent(
    """
    def check(candidate):
        import os
        assert 0 not in os.getresuid(), os.getresuid()
        assert candidate(2) == 4
    """
)
FIXES = ("apt-get install bubblewrap", "run as a normal user", "other users can execute", "isolation='unsafe-root'")


@pytest.mark.integration
@pytest.mark.parametrize("isolation", ["auto", "bwrap", "none"])
def test_programs_never_run_as_root(isolation: str) -> None:
    sandbox = make_sandbox(isolation=isolation, timeout_s=5, workers=1)  # skips where it cannot run
    try:
        job = humaneval_job(PROMPT, NOT_ROOT_PROGRAM, NOT_ROOT_TEST, "f")
        result = sandbox.run([job])[0]
    finally:
        sandbox.close()
    assert result.status == "ok" and result.passed == 2, result


@pytest.fixture
def root_without_bwrap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """Simulate root without bubblewrap; return an interpreter under a 0700 directory (closed to other users)."""
    monkeypatch.setattr(sandbox_host, "bwrap_status", lambda python=None: (False, "bwrap is not installed"))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    (closed / "python3").symlink_to(os.path.realpath(sys.executable))
    return str(closed / "python3")


def canary_job(canary: Path) -> CodeJob:
    program = f"open({str(canary)!r}, 'w').write('ran')\ndef f(x):\n    return 2 * x\n"
    return humaneval_job(PROMPT, program, NOT_ROOT_TEST, "f")


@pytest.mark.parametrize("isolation", ["auto", "none"])
def test_refuses_to_run_programs_as_root(root_without_bwrap: str, tmp_path: Path, isolation: str) -> None:
    canary = tmp_path / "canary.txt"
    with pytest.raises(SandboxUnavailable) as refused:
        Sandbox(SandboxConfig(isolation=isolation, python=root_without_bwrap, workers=1)).run([canary_job(canary)])
    message = str(refused.value)
    assert "refuses to run model-written programs as root" in message and root_without_bwrap in message
    assert all(fix in message for fix in FIXES), message
    assert not canary.exists()


def test_code_reward_reports_the_refusal_once_at_build(root_without_bwrap: str) -> None:
    with pytest.raises(RewardError, match="reward 'code_tests': the code sandbox refuses") as refused:
        build_reward("code_tests", {"python": root_without_bwrap})
    assert all(fix in str(refused.value) for fix in FIXES)


def test_rewards_score_cli_shows_the_refusal_without_a_traceback(
    root_without_bwrap: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from grpo_pipeline.cli import app

    # the default interpreter, whatever its directories: as if other users could not run it
    monkeypatch.setattr(sandbox_host, "unprivileged_uid_status", lambda python: (False, "uid 61000 cannot run it"))
    monkeypatch.setattr(code_module, "default_sandbox", functools.cache(lambda config: Sandbox(config)))
    canary = tmp_path / "canary.txt"
    source = tmp_path / "completions.jsonl"
    row = {"prompt": PROMPT, "completion": canary_job(canary).program, "test": NOT_ROOT_TEST, "entry_point": "f"}
    source.write_text(json.dumps(row) + "\n")
    result = CliRunner().invoke(app, ["rewards", "score", "--rewards", "code_tests", "--input", str(source)])
    output = " ".join(result.output.split())  # rich wraps long lines
    assert result.exit_code == 2, output
    assert output.count("refuses to run model-written programs as root") == 1, output
    assert "Traceback" not in output and not canary.exists()


def test_unsafe_root_opt_out_is_explicit_and_loud(root_without_bwrap: str, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(SandboxUnavailable):
        Sandbox(SandboxConfig(python=root_without_bwrap, workers=1))
    with caplog.at_level(logging.CRITICAL, logger="grpo_pipeline.rewards.sandbox"):
        risky = Sandbox(SandboxConfig(isolation="unsafe-root", python=root_without_bwrap, workers=1))
    assert risky.as_root and not risky.drop_uid and not risky.isolated
    assert any(r.levelno == logging.CRITICAL and "AS ROOT" in r.getMessage() for r in caplog.records)


def test_unknown_isolation_is_rejected() -> None:
    with pytest.raises(ValueError, match="unsafe-root"):
        SandboxConfig(isolation="off")  # type: ignore[arg-type]


@pytest.mark.integration
def test_harness_refuses_a_program_as_root_when_the_host_gives_no_uid(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The second line of defence: a host-side slip (no uid, no opt-out) must not run a program as root."""
    if os.geteuid() != 0:
        pytest.skip("only a harness that runs as root has root to refuse")
    monkeypatch.setattr(sandbox_host, "bwrap_status", lambda python=None: (False, "bwrap is not installed"))
    monkeypatch.setattr(sandbox_host, "unprivileged_uid_status", lambda python: (False, "simulated"))
    sandbox = Sandbox(SandboxConfig(isolation="unsafe-root", timeout_s=5, workers=1))
    sandbox.mode = Mode.RLIMITS  # the slip: neither a uid to drop to nor the opt-out reaches the harness
    canary = tmp_path / "canary.txt"
    try:
        result = sandbox.run([canary_job(canary)])[0]
    finally:
        sandbox.close()
    assert result.infra_error and "refuses to run a program as root" in result.output, result
    assert not canary.exists()
