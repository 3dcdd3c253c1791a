"""A user's own modules win from any working directory: run from the project's checkout, as the README runs it, a
`rewards.py` (or `tasks.py`, ...) beside the recipe is the one a dotted reward path imports, and the checkout's design
folders (configs/, flows/, tasks/, rewards/) never import under their bare names; they are `grpo_pipeline.*` only.

Each case is a real CLI process started in the repository root, as the console script and as `python -m`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, cli_env

LAUNCHERS = {
    "console-script": [str(Path(sys.executable).parent / "grpo-pipeline")],
    "python-m": [sys.executable, "-m", "grpo_pipeline.cli"],
}
USER_REWARD = """\
def my_reward(prompts, completions, **kwargs):
    return [1.0 if "yes" in str(c) else 0.25 for c in completions]
"""
# Records where each bare name would import from in the CLI's process, then scores like any reward.
PROBE = """\
import importlib.util
import json
import os

found = {}
for name in ("configs", "flows", "tasks", "rewards", "agents"):
    spec = importlib.util.find_spec(name)
    found[name] = spec.origin if spec else None
with open(os.environ["IMPORT_PROBE_OUT"], "w") as fh:
    json.dump(found, fh)


def reward(prompts, completions, **kwargs):
    return [0.0 for _ in completions]
"""


def score(tmp: Path, launcher: str, reward: str, **env: str) -> subprocess.CompletedProcess:
    """`grpo-pipeline rewards score` of a recipe in `tmp` whose one reward is `reward`, run from the repo root."""
    recipe = tmp / "recipe.yaml"
    recipe.write_text(f'name: user-modules\ngrpo:\n  rewards:\n    - name: "{reward}"\n')
    rows = tmp / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "2+2=", "completion": "yes"}) + "\n")
    out = tmp / "scored.jsonl"
    args = ["rewards", "score", "--config", str(recipe), "--input", str(rows), "--output", str(out)]
    return subprocess.run(
        [*LAUNCHERS[launcher], *args],
        cwd=ROOT,
        env=cli_env(tmp, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("module", ["rewards", "tasks"])
def test_a_user_module_beside_the_recipe_wins_from_the_repo_root(tmp_path, launcher, module):
    (tmp_path / f"{module}.py").write_text(USER_REWARD)
    proc = score(tmp_path, launcher, f"{module}:my_reward")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    scored = json.loads((tmp_path / "scored.jsonl").read_text())
    assert scored["my_reward"] == 1.0


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_the_design_folders_do_not_import_by_bare_name_in_the_cli(tmp_path, launcher):
    (tmp_path / "import_probe.py").write_text(PROBE)
    found = tmp_path / "found.json"
    proc = score(tmp_path, launcher, "import_probe:reward", IMPORT_PROBE_OUT=str(found))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(found.read_text()) == dict.fromkeys(("configs", "flows", "tasks", "rewards", "agents"))


def test_a_dotted_path_into_a_design_folder_is_refused_without_importing_it(monkeypatch):
    from grpo_pipeline.rewards.registry import RewardError, build_reward

    monkeypatch.syspath_prepend(str(ROOT))  # a process started in the checkout, before the CLI sorts sys.path
    monkeypatch.delitem(sys.modules, "rewards", raising=False)
    with pytest.raises(RewardError, match=r"'rewards' resolves to the project's own folder .*grpo_pipeline\.\*"):
        build_reward("rewards:my_reward")
    assert "rewards" not in sys.modules
