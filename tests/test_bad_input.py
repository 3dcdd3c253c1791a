"""Bad input, end to end: each case runs `grpo-pipeline run` as users do and must end with a non-zero exit, one
clear message that names the field, file or row (no traceback), and nothing trained or registered.

Config-level cases fail before Prefect starts (about a second each). Data and model cases run the micro config
against one Prefect server shared by the module, so each pays for its own stages only, not for a server start.
The checks' building blocks have fast unit tests at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from grpo_pipeline.configs.schema import DataConfig
from grpo_pipeline.rewards.registry import RewardError, check_scores
from grpo_pipeline.tasks.core.hub import check_base_path
from grpo_pipeline.tasks.data import split_train_eval
from grpo_pipeline.tasks.preflight import reward_problems, run_dir_problem
from grpo_pipeline.tasks.sources.contract import DataValidationError, validate_frames
from tests.helpers import cli_env, micro_overrides, run_cli

integration = pytest.mark.integration

RECIPE = "configs/tiny-arith.yaml"
BAD_REWARDS = """\
def too_few(prompts, completions, **kwargs):
    return [1.0] * (len(completions) - 1)


def words(prompts, completions, **kwargs):
    return ["good" for _ in completions]
"""


# ----------------------------------------------------------------------------- running a case


def run(tmp: Path, *overrides: str, recipe: str | Path = RECIPE, api: str | None = None) -> tuple[int, str]:
    """`grpo-pipeline run` on the micro config plus `overrides`, in a fresh process; its exit code and output."""
    extra = {"PREFECT_API_URL": api} if api else {}
    args = ["run", "--config", str(recipe), *micro_overrides(tmp / "runs"), *overrides]
    proc = run_cli(args, cli_env(tmp, **extra), timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def assert_rejected(code: int, out: str, tmp: Path, *fragments: str, run_dir: Path | None = None) -> None:
    """A non-zero exit, one error message holding every fragment, no traceback, nothing trained or registered."""
    assert code != 0, out[-3000:]
    assert out.count("error:") == 1, out[-3000:]
    message = out[out.index("error:") :]
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in the error:\n{message[:3000]}"
    assert "Traceback" not in out, out[-5000:]
    assert "Retry 1/" not in out, out[-3000:]  # bad input is not retried
    runs = run_dir or tmp / "runs"
    trained = sorted(p.name for p in runs.glob("*") if p.name == "sft" or p.name.startswith("grpo-round"))
    assert not trained, f"checkpoints were written: {trained}"
    assert registered_versions(runs) == 0


def registered_versions(runs: Path) -> int:
    """Model versions in the run's MLflow store (none when the store was never created)."""
    db = runs / "mlflow.db"
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        return conn.execute("select count(*) from model_versions").fetchone()[0]


# ----------------------------------------------------------------------------- config-level cases


def _malformed_yaml(tmp: Path) -> tuple[list[str], Path, list[str]]:
    recipe = tmp / "broken.yaml"
    recipe.write_text("name: broken\ngrpo: {rounds: 1, rewards: [\n")
    return [], recipe, [str(recipe), "is not valid YAML", "line"]


def _overrides(*overrides: str, expect: list[str]) -> Callable[[Path], tuple[list[str], str, list[str]]]:
    return lambda tmp: (list(overrides), RECIPE, expect)


CONFIG_CASES = {
    "malformed YAML": _malformed_yaml,
    "unknown key": _overrides("grpo.learning_rat=1e-4", expect=["grpo.learning_rat", "unknown field"]),
    "wrong type": _overrides("grpo.steps_per_round=many", expect=["grpo.steps_per_round", "integer", "'many'"]),
    "unknown reward name": _overrides(
        "grpo.rewards=[{name: correctness}, {name: corectness}]",
        expect=["grpo.rewards[1]", "'corectness'", "did you mean 'correctness'"],
    ),
    "dotted reward path that does not import": _overrides(
        "grpo.rewards=[{name: 'no_such_module:score'}]",
        expect=["grpo.rewards[0]", "cannot import module 'no_such_module'", "beside the recipe"],
    ),
    "model path that does not exist": lambda tmp: (
        [f"model.base={tmp / 'no-such-model'}"],
        RECIPE,
        ["model.base", str(tmp / "no-such-model"), "does not exist"],
    ),
    "eval batch smaller than one group": _overrides(
        "eval.batch_size=2", expect=["eval.batch_size (2)", "eval.n_samples (4)"]
    ),
    "GRPO batch larger than the training split": _overrides(
        "grpo.prompts_per_step=300", expect=["data.num_train (200)", "grpo.prompts_per_step (300)"]
    ),
    "run dir under a file": lambda tmp: (
        [f"run_dir={tmp / 'a-file' / 'runs'}"],
        RECIPE,
        ["run_dir", str(tmp / "a-file" / "runs"), "not writable", "Not a directory"],
    ),
}


@integration
@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_bad_config_fails_before_prefect_starts(case: str, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    overrides, recipe, expect = CONFIG_CASES[case](tmp_path)
    code, out = run(tmp_path, *overrides, recipe=recipe)
    assert code == 2, out[-3000:]
    assert_rejected(code, out, tmp_path, *expect)
    assert "Prefect server" not in out and "Starting temporary server" not in out, out  # nothing was started


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory nothing can be written to: mode 0500, or, for root (whom modes do not stop), immutable."""
    path = tmp_path / "read-only"
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o500)
        yield path
        path.chmod(0o700)
        return
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
        pytest.skip("running as root where `chattr +i` is not available: no directory is read-only for root")
    try:
        yield path
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


@integration
def test_unwritable_run_dir_fails_before_prefect_starts(tmp_path: Path, read_only_dir: Path) -> None:
    run_dir = read_only_dir / "runs"
    code, out = run(tmp_path, f"run_dir={run_dir}")
    assert code == 2, out[-3000:]
    assert_rejected(code, out, tmp_path, "run_dir", str(run_dir), "not writable", run_dir=run_dir)
    assert "Prefect server" not in out


# ----------------------------------------------------------------------------- data and model cases


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def additions(n: int) -> list[dict]:
    return [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(10, 10 + n)]


def from_file(path: Path, *overrides: str) -> list[str]:
    return ["data.source=file", f"data.path={path}", "data.num_eval=4", *overrides]


def crossing_variant(rows: list[dict]) -> list[dict]:
    """`rows` plus a copy of one prompt with a trailing space that the split puts on the other side from it."""
    for row in rows:
        variant = {**row, "prompt": row["prompt"] + " "}
        candidate = [*rows, variant]
        _, held_out, _ = split_train_eval(pd.DataFrame(candidate), num_train=200, num_eval=4, seed=0)
        sides = {p in set(held_out["prompt"]) for p in (row["prompt"], variant["prompt"])}
        if len(sides) == 2:
            return candidate
    raise AssertionError(f"no prompt of {len(rows)} rows has a variant on the other side of the split")


def _missing_column(tmp: Path) -> tuple[list[str], list[str]]:
    path = write_rows(tmp / "no-answer.jsonl", [{"prompt": r["prompt"]} for r in additions(20)])
    return from_file(path), [str(path), "no column(s) ['answer']", "data.answer_column"]


def _empty_dataset(tmp: Path) -> tuple[list[str], list[str]]:
    path = write_rows(tmp / "empty.jsonl", [])
    return from_file(path), [str(path), "has no rows"]


def _train_eval_overlap(tmp: Path) -> tuple[list[str], list[str]]:
    path = write_rows(tmp / "overlap.jsonl", crossing_variant(additions(20)))
    return from_file(path), ["data validation failed", "no_prompt_in_both_train_and_eval", "eval row"]


def _wrong_number_of_scores(tmp: Path) -> tuple[list[str], list[str]]:
    (tmp / "bad_rewards.py").write_text(BAD_REWARDS)
    rewards = "grpo.rewards=[{name: correctness}, {name: 'bad_rewards:too_few'}]"
    return [f"code_dir={tmp}", rewards], ["grpo.rewards[1]", "bad_rewards:too_few", "returned 3 scores for 4"]


def _non_numeric_scores(tmp: Path) -> tuple[list[str], list[str]]:
    (tmp / "bad_rewards.py").write_text(BAD_REWARDS)
    rewards = "grpo.rewards=[{name: 'bad_rewards:words'}]"
    return [f"code_dir={tmp}", rewards], ["grpo.rewards[0]", "bad_rewards:words", "returned 'good' (str)"]


def _prompts_longer_than_context(tmp: Path) -> tuple[list[str], list[str]]:
    overrides = ["model.tiny.max_positions=16", "data.prompt_template='Please add these numbers: {prompt}'"]
    expect = ["prompt longer than the model's context", "takes 16 tokens", "train row 0", "model.tiny.max_positions"]
    return overrides, expect


def _fewer_rows_than_a_grpo_batch(tmp: Path) -> tuple[list[str], list[str]]:
    path = write_rows(tmp / "few.jsonl", additions(10))
    overrides = from_file(path, "grpo.prompts_per_step=8")
    return overrides, ["training split has 6 row(s)", "grpo.prompts_per_step=8", "whole batches"]


FLOW_CASES = {
    "missing dataset column": _missing_column,
    "empty dataset": _empty_dataset,
    "train/eval overlap": _train_eval_overlap,
    "reward returns the wrong number of scores": _wrong_number_of_scores,
    "reward returns non-numbers": _non_numeric_scores,
    "prompts longer than the model's context": _prompts_longer_than_context,
    "fewer training rows than one GRPO batch": _fewer_rows_than_a_grpo_batch,
}


@pytest.fixture(scope="module")
def flow_runs(
    request: pytest.FixtureRequest, prefect_api: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[Path, list[str], int, str]]:
    """The selected flow cases, run two at a time: a CLI run is mostly single-threaded imports, so two fill the two
    cores of a small machine. Each case keeps its own test (and its own directory)."""
    selected = [
        item.callspec.params["case"]
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_bad_data_or_model_fails_before_training"
    ]

    def one(case: str) -> tuple[str, tuple[Path, list[str], int, str]]:
        tmp = tmp_path_factory.mktemp(re.sub(r"\W+", "-", case))
        overrides, expect = FLOW_CASES[case](tmp)
        return case, (tmp, expect, *run(tmp, *overrides, api=prefect_api))

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, selected))


@integration
@pytest.mark.parametrize("case", list(FLOW_CASES))
def test_bad_data_or_model_fails_before_training(case: str, flow_runs: dict) -> None:
    tmp, expect, code, out = flow_runs[case]
    assert code == 1, out[-3000:]
    assert_rejected(code, out, tmp, *expect)


@integration
@pytest.mark.slow
def test_duplicate_prompts_and_the_fixed_file_is_prepared_again(tmp_path: Path, prefect_api: str) -> None:
    """Duplicate prompts are named by row; the failed validation leaves no result behind, so fixing the file in
    place is enough: the next run prepares it again (and here stops at the next problem, before training)."""
    rows = additions(20)
    good = [dict(r) for r in rows]
    rows[7]["prompt"] = rows[3]["prompt"]
    path = write_rows(tmp_path / "rows.jsonl", rows)
    # a second problem, found only once the data is valid: no room for the rollouts in a 16-token context
    overrides = [*from_file(path), "model.tiny.max_positions=16", "grpo.max_completion_tokens=14"]
    code, out = run(tmp_path, *overrides, api=prefect_api)
    assert code == 1, out[-3000:]
    assert_rejected(code, out, tmp_path, "data validation failed", "no_duplicate_prompts_within_split", "'13+1='")
    write_rows(path, good)
    code, out = run(tmp_path, *overrides, api=prefect_api)
    assert code == 1, out[-3000:]
    assert_rejected(code, out, tmp_path, "leave too little room for grpo.max_completion_tokens=14", "train row 0")
    assert "data validation failed" not in out


# ----------------------------------------------------------------------------- the checks' building blocks


def test_scores_must_be_one_number_or_none_per_completion() -> None:
    check_scores("r", [1.0, None, 0, True, np.float32(0.5), np.array(2.0)], 6)
    for scores, fragment in [
        ([1.0], "returned 1 scores for 2 completions"),
        ([1.0, "1"], "returned '1' (str) for completion 1"),
        ([1.0, [1.0]], "returned [1.0] (list) for completion 1"),
        (1.0, "returned a float, not a list of 2 scores"),
    ]:
        with pytest.raises(RewardError, match=re.escape(fragment)):
            check_scores("r", scores, 2)


def test_a_local_model_path_must_exist(tmp_path: Path) -> None:
    for base in ("tiny", "Qwen/Qwen2.5-0.5B-Instruct", "gpt2", "models:/m@champion"):
        check_base_path(base)  # not local paths: nothing to check here
    for base in (str(tmp_path / "missing"), "./missing-model", "~/models/missing", "a/b/c"):
        with pytest.raises(FileNotFoundError, match="does not exist"):
            check_base_path(base)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"without config\.json"):
        check_base_path(str(tmp_path / "empty"))
    (tmp_path / "empty" / "config.json").write_text("{}")
    check_base_path(str(tmp_path / "empty"))


def test_run_dir_problem(tmp_path: Path) -> None:
    assert run_dir_problem(str(tmp_path / "new" / "runs")) is None
    assert (tmp_path / "new" / "runs").is_dir() and not list((tmp_path / "new" / "runs").iterdir())
    (tmp_path / "file").write_text("")
    problem = run_dir_problem(str(tmp_path / "file" / "runs"))
    assert problem and "not writable" in problem and "run_dir=" in problem


def test_prompts_differing_only_in_whitespace_are_one_question() -> None:
    train = pd.DataFrame({"prompt": ["1+1=", "2+2="], "answer": ["2", "4"], "completion": ["2", "4"]})
    held_out = pd.DataFrame({"prompt": [" 1+1=", "3+3="], "answer": ["2", "6"], "completion": ["2", "6"]})
    with pytest.raises(DataValidationError, match=r"eval row 0: failed 'no_prompt_in_both_train_and_eval'"):
        validate_frames(train, held_out, DataConfig())
    train.loc[1, "prompt"] = "1+1=\n"
    with pytest.raises(DataValidationError, match=r"train row 1: failed 'no_duplicate_prompts_within_split'"):
        validate_frames(train, held_out.assign(prompt=["4+4=", "3+3="]), DataConfig())


def test_reward_smoke_check_names_each_bad_reward() -> None:
    rows = pd.DataFrame({"prompt": ["1+1=", "2+2="], "answer": ["2", "4"], "completion": ["2", "5"]})
    entries = [
        ("grpo.rewards[0]", "correctness", {}),
        ("grpo.rewards[1]", "tests.test_bad_input:raises", {}),
        ("grpo.rewards[2]", "tests.test_bad_input:one_score", {}),
    ]
    problems = reward_problems(rows, entries)
    assert len(problems) == 2, problems
    assert problems[0].startswith("grpo.rewards[1]: reward 'tests.test_bad_input:raises' raised KeyError")
    assert "data.extra_columns" in problems[0] and "the rows have: answer" in problems[0]
    assert problems[1].startswith("grpo.rewards[2]: reward 'tests.test_bad_input:one_score' returned 1 scores for 2")


def raises(prompts, completions, **columns):
    return [float(c == t) for c, t in zip(completions, columns["test"], strict=True)]


def one_score(prompts, completions, **columns):
    return [1.0]
