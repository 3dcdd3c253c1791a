"""Per-call time limits on rewards (rewards/registry.py): a stuck call scores None with one warning, training goes
on, and a reward that keeps missing its limit stops the run. Outcomes only: no assertion on how long anything took."""

from __future__ import annotations

import contextvars
import logging
import math
import socket
import threading
from collections.abc import Iterator

import pytest

from grpo_pipeline.configs.schema import RewardSpec, section_hash
from grpo_pipeline.rewards import build_reward, build_rewards, registry
from grpo_pipeline.rewards.registry import RewardError

HERE = "tests.test_reward_timeouts"
RELEASE = threading.Event()  # set at the end of each test, so that stuck calls end instead of sleeping forever
CALLS: list[threading.Thread] = []


@pytest.fixture(autouse=True)
def _release_stuck_calls() -> Iterator[None]:
    RELEASE.clear()
    CALLS.clear()
    yield
    RELEASE.set()


def hangs_on_first_call(prompts, completions, **kwargs) -> list[float | None]:
    CALLS.append(threading.current_thread())
    if len(CALLS) == 1:
        RELEASE.wait()  # "forever": until the test is over
    return [1.0] * len(completions)


def always_hangs(prompts, completions, **kwargs) -> list[float | None]:
    RELEASE.wait()
    return [1.0] * len(completions)


def hangs_every_other_call(prompts, completions, **kwargs) -> list[float | None]:
    CALLS.append(threading.current_thread())
    if len(CALLS) % 2 == 0:
        RELEASE.wait()
    return [1.0] * len(completions)


def fails(prompts, completions, **kwargs) -> list[float | None]:
    raise ZeroDivisionError("a bug in the reward")


async def async_reward(prompts, completions, **kwargs) -> list[float | None]:
    return [0.5] * len(completions)


CALLER = contextvars.ContextVar("caller", default="unset")


def reads_its_surroundings(prompts, completions, **kwargs) -> list[float | None]:
    import torch

    return [float(CALLER.get() == "trainer"), float(torch.is_grad_enabled())]


def registry_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == registry.__name__ and r.levelno >= logging.WARNING]


def test_a_stuck_call_scores_none_with_one_warning_and_the_next_call_scores(caplog) -> None:
    fn = build_reward(f"{HERE}:hangs_on_first_call", timeout_s=0.2)
    assert fn.__name__ == "hangs_on_first_call"  # TRL logs rewards by __name__
    with caplog.at_level(logging.WARNING):
        assert fn(prompts=["p"] * 4, completions=["c"] * 4) == [None] * 4
        assert fn(prompts=["p"] * 3, completions=["c"] * 3) == [1.0] * 3
    warnings = registry_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "hangs_on_first_call" in warnings[0] and "timeout_s=0.2" in warnings[0]
    assert CALLS[0] is not CALLS[1]  # the stuck thread was left behind; the next call got a fresh one
    assert CALLS[0].daemon and CALLS[0].is_alive()


def test_a_reward_that_always_hangs_stops_the_run() -> None:
    fn = build_reward(f"{HERE}:always_hangs", timeout_s=0.1)
    rows = 4
    calls_to_stop = max(registry.TIMEOUT_MIN_CALLS, math.ceil(registry.TIMEOUT_MIN_ROWS / rows))
    for _ in range(calls_to_stop - 1):  # training goes on at first
        assert fn(prompts=["p"] * rows, completions=["c"] * rows) == [None] * rows
    with pytest.raises(RewardError) as caught:
        fn(prompts=["p"] * rows, completions=["c"] * rows)
    message = str(caught.value)
    assert "always_hangs" in message and "timeout_s=0.1" in message
    assert "timeout_s:" in message  # how to change it


def test_stuck_calls_are_bounded_even_when_half_the_calls_answer() -> None:
    fn = build_reward(f"{HERE}:hangs_every_other_call", timeout_s=0.1)
    with pytest.raises(RewardError, match="still running"):
        for _ in range(2 * registry.MAX_STUCK_CALLS + 4):  # half the rows time out: not "more than half"
            fn(prompts=["p"] * 4, completions=["c"] * 4)
    assert len(CALLS) == 2 * (registry.MAX_STUCK_CALLS + 1)


def test_errors_in_the_reward_still_raise() -> None:
    with pytest.raises(ZeroDivisionError, match="a bug in the reward"):
        build_reward(f"{HERE}:fails", timeout_s=5)(prompts=["p"], completions=["c"])


def test_async_rewards_run_to_completion() -> None:
    fn = build_reward(f"{HERE}:async_reward", timeout_s=5)
    assert fn.__name__ == "async_reward"
    assert fn(prompts=["p", "q"], completions=["c", "d"]) == [0.5, 0.5]


def test_trl_sees_each_reward_by_its_name_and_as_sync() -> None:
    from trl.trainer.utils import get_callable_name, is_async_callable

    for name, stable in [(f"{HERE}:async_reward", "async_reward"), ("correctness", "correctness")]:
        fn = build_reward(name)
        # TRL logs rewards/<name>/mean and would await an async one: the wrapper awaits it itself
        assert get_callable_name(fn) == stable and not is_async_callable(fn)


def test_the_call_thread_keeps_the_callers_context_and_grad_mode() -> None:
    import torch

    fn = build_reward(f"{HERE}:reads_its_surroundings", timeout_s=5)
    token = CALLER.set("trainer")
    try:
        with torch.no_grad():  # TRL scores completions in a no-grad context; a reward model must stay in it
            assert fn(prompts=["p", "q"], completions=["c", "d"]) == [1.0, 0.0]
        assert fn(prompts=["p", "q"], completions=["c", "d"]) == [1.0, 1.0]
    finally:
        CALLER.reset(token)


def test_from_a_worker_thread_like_prefects() -> None:
    fn = build_reward(f"{HERE}:hangs_on_first_call", timeout_s=0.2)
    out: list = []
    worker = threading.Thread(target=lambda: out.extend([fn(prompts=["p"], completions=["c"]) for _ in range(2)]))
    worker.start()
    worker.join()
    assert out == [[None], [1.0]]


def logs_to_the_prefect_run(prompts, completions, **kwargs) -> list[float | None]:
    from prefect.logging import get_run_logger

    get_run_logger().info("scored in the task's run")  # raises outside a run context
    return hangs_on_first_call(prompts, completions)


@pytest.mark.integration
def test_inside_a_prefect_task_run_in_a_worker_thread() -> None:
    from prefect import flow, task

    fn = build_reward(f"{HERE}:logs_to_the_prefect_run", timeout_s=0.5)

    @task
    def score_twice() -> list:
        return [fn(prompts=["p"], completions=["c"]) for _ in range(2)]

    @flow
    def scoring() -> list:
        return score_twice.submit().result()  # submitted tasks run in the task runner's threads

    assert scoring() == [[None], [1.0]]


def test_no_limit_runs_in_the_callers_thread() -> None:
    fn = build_reward(f"{HERE}:hangs_every_other_call", timeout_s=None)
    RELEASE.set()
    assert fn(prompts=["p"], completions=["c"]) == [1.0]
    assert len(CALLS) == 1 and CALLS[0] is threading.current_thread()


def test_the_limit_comes_from_the_reward_entry() -> None:
    spec = RewardSpec(name=f"{HERE}:hangs_on_first_call", timeout_s=0.2)
    (fn,), weights = build_rewards([spec])
    assert fn(prompts=["p"], completions=["c"]) == [None] and weights == [1.0]
    assert RewardSpec(name="correctness").timeout_s == registry.DEFAULT_TIMEOUT_S
    # how long to wait is not what a stage computes: stage keys do not change with it
    assert section_hash(RewardSpec(name="x", timeout_s=1)) == section_hash(RewardSpec(name="x"))
    with pytest.raises(ValueError, match="timeout_s"):
        RewardSpec(name="x", timeout_s=0)
    with pytest.raises(RewardError, match="timeout_s"):
        build_reward("correctness", timeout_s=0)


@pytest.fixture
def silent_server() -> Iterator[str]:
    """An HTTP endpoint on loopback that accepts connections, reads the requests and never answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed at teardown
                return
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    listener.close()
    for conn in held:
        conn.close()


def judge_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.endswith("judge") and r.levelno >= logging.WARNING]


@pytest.mark.integration
def test_a_judge_that_never_answers_is_cut_off_by_the_call_limit(silent_server: str, caplog) -> None:
    # the judge's own HTTP timeout (30 s, 2 retries) is far above the call's limit: the call limit decides
    params = {"base_url": silent_server, "model": "m", "timeout_s": 30, "retries": 2, "api_key_env": None}
    fn = build_reward("judge", params, timeout_s=0.3)
    with caplog.at_level(logging.WARNING):
        assert fn(prompts=["q"] * 3, completions=["a"] * 3) == [None] * 3
    # one warning for the call, whichever side noticed first; never one per row
    assert len(registry_warnings(caplog)) + len(judge_warnings(caplog)) <= 1
    assert all("judge" in w for w in registry_warnings(caplog))


@pytest.mark.integration
def test_the_judges_own_timeout_still_applies_under_a_longer_call_limit(silent_server: str, caplog) -> None:
    params = {"base_url": silent_server, "model": "m", "timeout_s": 0.2, "retries": 0, "api_key_env": None}
    fn = build_reward("judge", params, timeout_s=60)
    with caplog.at_level(logging.WARNING):
        assert fn(prompts=["q"], completions=["a"]) == [None]
    assert registry_warnings(caplog) == []  # the call returned in time: the judge's own timeout scored it
    assert len(judge_warnings(caplog)) == 1
