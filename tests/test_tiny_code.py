"""The code RL recipe (configs/tiny-code.yaml): its synthetic functions task, and a micro run through the CLI in
which GRPO calls the sandbox from TRL's loop and a hostile completion scores 0 and harms nothing."""

from __future__ import annotations

import pandas as pd
import pytest

from grpo_pipeline.configs.schema import ConfigError, load_config
from grpo_pipeline.rewards import build_reward
from grpo_pipeline.tasks.data import prepare_data
from grpo_pipeline.tasks.sources.synthetic import FAMILIES, function_family, synthetic_functions
from grpo_pipeline.tasks.training.tiny_model import build_tokenizer
from grpo_pipeline.tasks.validate import validate_data
from tests.helpers import ROOT

RECIPE = ROOT / "configs" / "tiny-code.yaml"


def recipe(*overrides: str):
    return load_config(RECIPE, ["data.num_train=600", "data.num_eval=100", *overrides])


def code_scores(rows: pd.DataFrame, completions: list[str]) -> list[float | None]:
    """The recipe's correctness reward on `rows`, as GRPO and evaluation call it."""
    reward = build_reward("code_tests", {"mode": "pass"})
    return reward(
        prompts=list(rows["prompt"]),
        completions=completions,
        test=list(rows["test"]),
        entry_point=list(rows["entry_point"]),
    )


def test_functions_task_is_deterministic_distinct_and_in_the_vocabulary():
    cfg = recipe().data.synthetic
    a, b, c = (synthetic_functions(cfg, 300, seed) for seed in (3, 3, 4))
    pd.testing.assert_frame_equal(a, b)
    assert not a["prompt"].equals(c["prompt"])
    assert a["prompt"].is_unique
    assert set(a["family"]) == set(cfg.families)
    assert (a["answer"].map(function_family) == a["family"]).all()
    vocab = build_tokenizer().get_vocab()
    assert {ch for text in [*a["prompt"], *a["answer"]] for ch in text} <= set(vocab)  # no <unk> anywhere
    first = a.iloc[0]
    assert first["prompt"].startswith("#f(0)=") and first["prompt"].endswith("\ndef f(x):return ")
    assert first["test"].startswith("def check(candidate):\n") and first["test"].count("assert") == cfg.num_tests


@pytest.mark.integration
def test_hidden_tests_accept_the_reference_and_reject_lookalikes(code_sandbox: None):
    """In the sandbox: the reference body passes every row's tests; the swapped subtraction, the constant alone
    and an off-by-one constant fail, so a pass means the program is right, not close."""
    rows = synthetic_functions(recipe().data.synthetic, 60, seed=1)
    assert code_scores(rows, list(rows["answer"])) == [1.0] * len(rows)
    k = rows["answer"].str.extract(r"(\d+)")[0]
    swapped = [FAMILIES["x-k" if f == "k-x" else "k-x"][0].format(k=n) for f, n in zip(rows["family"], k, strict=True)]
    assert code_scores(rows, swapped) == [0.0] * len(rows)
    assert code_scores(rows, list(k)) == [0.0] * len(rows)  # max(x,k) too: some hidden input exceeds k
    off_by_one = [a.replace(n, str(int(n) + 1)) for a, n in zip(rows["answer"], k, strict=True)]
    assert code_scores(rows, off_by_one) == [0.0] * len(rows)


@pytest.mark.integration
def test_imperfect_teacher_swaps_k_minus_x_in_sft_targets_only(tmp_path, code_sandbox: None):
    cfg = recipe("data.num_train=2000").data
    refs = prepare_data(cfg, str(tmp_path / "a"))
    train, held_out = pd.read_parquet(refs.train.path), pd.read_parquet(refs.eval.path)
    k_minus_x = train["family"] == "k-x"
    slipped = train["completion"] != train["answer"]
    assert not slipped[~k_minus_x].any()  # other families (x-k too) keep the right target
    assert 0.4 < slipped[k_minus_x].mean() < 0.6  # about half of the k-x targets are swapped
    assert (train.loc[slipped, "completion"].map(function_family) == "x-k").all()
    assert (held_out["completion"] == held_out["answer"]).all()  # evaluation rows are untouched
    assert not set(train["prompt"]) & set(held_out["prompt"])
    validate_data(refs, cfg)  # the data contract holds for the built-in rows
    wrong = train[slipped].head(20)
    assert code_scores(wrong, list(wrong["completion"])) == [0.0] * len(wrong)  # the tests catch the teacher


@pytest.mark.integration
def test_code_reward_takes_the_keyword_arguments_trl_passes(code_sandbox: None):
    """TRL's GRPOTrainer passes every dataset column plus `trainer_state`, `log_extra` and `log_metric` (objects, not
    per-row lists) to each reward; code_tests must read only the test columns."""
    rows = synthetic_functions(recipe().data.synthetic, 4, seed=2)
    reward = build_reward("code_tests", {"mode": "pass"})
    scores = reward(
        prompts=list(rows["prompt"]),
        completions=list(rows["answer"]),
        completion_ids=[[0]] * len(rows),
        trainer_state=object(),
        log_extra=lambda *a, **k: None,
        log_metric=lambda *a, **k: None,
        **{c: list(rows[c]) for c in ("answer", "test", "entry_point", "family")},
    )
    assert scores == [1.0] * len(rows)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.synthetic.kind=arithmetic"], "teacher_order_slip only changes kind 'functions'"),
        (["data.synthetic.families=[x+k,x-k,x*k]"], "teacher_order_slip only changes k-x problems"),
        (["data.synthetic.teacher_carry_slip=0.5"], "teacher_carry_slip only changes kind 'arithmetic'"),
    ],
)
def test_slips_that_cannot_apply_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        recipe(*overrides)


HOSTILE_MODULE = '''
"""A reward for the test: before the real code_tests reward runs, the first completions of every batch are replaced
with hostile bodies; their scores are appended to $HOSTILE_LOG and returned to TRL like any other score."""
import json
import os

from grpo_pipeline.rewards import build_reward

CANARY = os.environ["HOSTILE_CANARY"]
HOSTILE = [
    "__import__('os')._exit(0)",  # leaves the process when f is called, before any test can count it
    "x\\n__import__('os')._exit(0)",  # leaves it at import time
    f"x\\nopen({CANARY!r}, 'w').write('escaped')",  # writes outside its directory at import time
    f"open({CANARY!r}, 'w').write('escaped') and x",  # the same when called
    "x\\nimport signal; os = __import__('os'); os.kill(os.getppid(), signal.SIGKILL)",  # kills its parent
]
_inner = []


def hostile_code_tests(prompts, completions, **columns):
    if not _inner:
        _inner.append(build_reward("code_tests", {"mode": "pass"}))
    n = min(len(HOSTILE), len(completions))
    completions = [*HOSTILE[:n], *completions[n:]]
    scores = _inner[0](prompts=prompts, completions=completions, **columns)
    with open(os.environ["HOSTILE_LOG"], "a") as f:
        f.write(json.dumps({"hostile": scores[:n], "rest": scores[n:]}) + "\\n")
    return scores
'''


@pytest.mark.integration
@pytest.mark.slow
def test_micro_code_recipe_through_the_cli_scores_hostile_completions_zero(tmp_path, code_sandbox: None, prefect_api):
    """A micro tiny-code run through the CLI: GRPO calls the sandbox from TRL's loop (the code_tests reward, and a
    wrapper of it that slips hostile bodies into every batch), rewards and the sandbox's time reach MLflow, every
    hostile completion scores 0, nothing is written outside the sandbox, and the run finishes and registers."""
    import json

    import mlflow

    from tests.helpers import cli_env, micro_overrides, run_cli

    (tmp_path / "hostile_probe.py").write_text(HOSTILE_MODULE)
    canary, log = tmp_path / "canary.txt", tmp_path / "hostile.jsonl"
    env = cli_env(
        tmp_path,
        PYTHONPATH=str(tmp_path),
        HOSTILE_LOG=str(log),
        HOSTILE_CANARY=str(canary),
        PREFECT_API_URL=prefect_api,
    )
    summary_path = tmp_path / "summary.json"
    args = [
        "run",
        "--config",
        str(RECIPE),
        *micro_overrides(tmp_path / "runs"),
        "grpo.prompts_per_step=4",  # 4 prompts x 4 completions: room for every hostile body and some real ones
        "grpo.generations_per_prompt=4",
        "grpo.steps_per_round=3",
        "grpo.rewards=[{name: code_tests, weight: 1.0}, {name: 'hostile_probe:hostile_code_tests', weight: 0.5}]",
        "registry.model_name=tiny-code-micro",
        "--summary-json",
        str(summary_path),
    ]
    result = run_cli(args, env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not canary.exists(), "a hostile completion wrote outside the sandbox"

    calls = [json.loads(line) for line in log.read_text().splitlines()]
    steps = [c for c in calls if len(c["hostile"]) + len(c["rest"]) == 16]  # a GRPO batch: 4 prompts x 4
    assert len(steps) == 3, calls  # every GRPO step went through the wrapper (the input check and evaluation too)
    assert all(s == 0.0 for call in calls for s in call["hostile"]), calls
    assert all(s in (0.0, 1.0) for call in calls for s in call["rest"])  # real completions still get verdicts

    summary = json.loads(summary_path.read_text())
    assert [r["version"] for r in summary["registrations"]], summary  # the round was evaluated and registered
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    run_id = summary["registrations"][0]["run_id"]
    metrics = client.get_run(run_id).data.metrics
    for key in ("rewards/code_tests/mean", "rewards/hostile_code_tests/mean"):
        history = client.get_metric_history(run_id, key)
        assert len(history) == 3, (key, sorted(metrics))  # one per step (log_every_steps=1)
    assert all(m.value < 1.0 for m in client.get_metric_history(run_id, "rewards/hostile_code_tests/mean"))
    sandbox_s = client.get_metric_history(run_id, "profiling/Time taken: GRPOTrainer.code_tests")
    assert len(sandbox_s) == 3 and all(m.value > 0 for m in sandbox_s)  # what benchmarks/learning.py sums
