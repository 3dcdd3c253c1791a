"""Which failed GRPO rounds the pipeline retries when the round ran on another work pool (`retry_remote_round`)."""

from __future__ import annotations

import pytest

from grpo_pipeline.flows.grpo_train import RoundFailed
from grpo_pipeline.flows.stages import retry_remote_round


class FailedState:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def result(self) -> None:
        raise self.error


@pytest.mark.parametrize(
    ("state_name", "message", "retried"),
    [
        ("Crashed", "the worker's process exited", True),
        ("Failed", "Flow run encountered an exception: RuntimeError: CUDA error: unspecified launch failure", True),
        ("Failed", "Flow run encountered an exception: TrainingHealthError: the loss is nan at step 12", False),
        ("Failed", "Flow run encountered an exception: DataError: data.path does not exist", False),
        ("Cancelled", "cancelled from the UI", False),
    ],
)
def test_a_remote_round_is_retried_unless_cancelled_or_failed_on_bad_input(state_name, message, retried):
    state = FailedState(RoundFailed(1, "gpu", state_name, message))
    assert retry_remote_round(None, None, state) is retried


def test_a_remote_round_that_could_not_be_sent_is_retried_like_any_stage():
    assert retry_remote_round(None, None, FailedState(ConnectionError("the API is restarting"))) is True
    assert retry_remote_round(None, None, FailedState(ValueError("bad parameters"))) is False
