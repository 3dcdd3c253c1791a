"""A user's own code, run as users run it: the installed `grpo-pipeline` command, no PYTHONPATH, and a module
named `rewards.py` (the name of our own folder, which must not shadow it or be shadowed by it)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import mlflow
import pytest
import yaml

from tests.helpers import ROOT, cli_env, micro_overrides

pytestmark = pytest.mark.integration

CLI = str(Path(sys.executable).with_name("grpo-pipeline"))
USER_REWARD = textwrap.dedent("""\
    def my_reward(prompts, completions, answer, **kwargs):
        return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]
""")


def grpo_cli(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The console script, from `cwd`: Python puts only the script's own directory on sys.path."""
    env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    return subprocess.run([CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_rewards_py_in_the_working_directory_scores(tmp_path: Path) -> None:
    (tmp_path / "rewards.py").write_text(USER_REWARD)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps({"completion": c, "answer": "5"}) for c in ["5", "6", " 5"]) + "\n")
    scored = tmp_path / "scored.jsonl"
    proc = grpo_cli(
        ["rewards", "score", "-i", str(rows), "-r", "rewards:my_reward", "-o", str(scored)], tmp_path, cli_env(tmp_path)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [json.loads(line)["my_reward"] for line in scored.read_text().splitlines()] == [1.0, 0.0, 1.0]


@pytest.mark.slow
def test_reward_module_beside_the_recipe_trains_and_its_edits_rerun_grpo(tmp_path: Path, prefect_api: str) -> None:
    recipe_dir, work = tmp_path / "recipe", tmp_path / "elsewhere"
    recipe_dir.mkdir()
    work.mkdir()
    recipe = yaml.safe_load((ROOT / "configs/tiny-arith.yaml").read_text())
    recipe["grpo"]["rewards"] = [{"name": "rewards:my_reward"}, {"name": "format", "weight": 0.2}]
    (recipe_dir / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    (recipe_dir / "rewards.py").write_text(USER_REWARD)
    env = cli_env(tmp_path, PREFECT_API_URL=prefect_api)

    def run(name: str) -> dict[str, bool]:
        summary = tmp_path / f"{name}.json"
        args = [
            "run",
            "-c",
            str(recipe_dir / "recipe.yaml"),
            "--summary-json",
            str(summary),
            *micro_overrides(tmp_path / "runs"),
            "registry.model_name=user-reward",
        ]
        proc = grpo_cli(args, work, env)
        assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        result = json.loads(summary.read_text())
        return {s["stage"]: s["cached"] for s in result["stages"]}, result

    cold, result = run("cold")
    assert not any(cold.values()), cold
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    grpo_run = mlflow.MlflowClient().get_run(result["registrations"][0]["run_id"])
    assert "rewards/my_reward/mean" in grpo_run.data.metrics  # the user's reward, not ours, trained the policy

    (recipe_dir / "rewards.py").write_text(USER_REWARD.replace("1.0 if", "2.0 if"))
    edited, _ = run("edited")
    # the evaluations report the mean of each training reward, so the SFT baseline is rescored too
    rerun = [s for s, cached in edited.items() if not cached]
    assert rerun == ["evaluate-sft", "grpo-round1", "evaluate-r1", "evaluate-r1-one_digit", "register-r1"]
