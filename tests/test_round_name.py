"""A GRPO round has one name (tasks/grpo.py `round_name`): its stage folder, its task run (local and remote), the
flow's stage list and the remote child flow run are all formatted from `GRPORound.name`."""

from __future__ import annotations

import pytest

from grpo_pipeline.flows.stages import grpo_train, grpo_train_remote
from grpo_pipeline.tasks.grpo import GRPORound, round_name


@pytest.mark.parametrize("r", [1, 2, 12])
def test_every_place_a_round_is_named_gives_round_name(r: int) -> None:
    spec = GRPORound.model_construct(round_index=r)  # only the index names a round
    assert spec.name == round_name(r) == f"grpo-round{r}"  # the folder existing runs resume from
    assert grpo_train.fn.stage.folder.format(spec=spec) == spec.name
    assert grpo_train.task_run_name.format(spec=spec) == spec.name
    assert grpo_train_remote.task_run_name.format(spec=spec) == spec.name
