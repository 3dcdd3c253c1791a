"""A valid config reads back as itself from its own dumps: the full JSON that a remote GRPO round is sent
(flows/grpo_train.py) and the `config.yaml` logged with every run (`PipelineConfig.to_yaml`). Validity is a function
of the values alone, never of which fields were written: every shipped recipe, every rehearsal of one, and random
valid configs are checked, the whole config and each section on its own (a remote round validates its section alone).
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any, Literal

import annotated_types
import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from grpo_pipeline.configs.schema import GRPOStageConfig, PipelineConfig, load_config
from tests.test_rehearse import RECIPES, rehearsed

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "configs").glob("*.yaml"))


def assert_round_trips(cfg: PipelineConfig) -> None:
    """`cfg` validates again, equal, from its JSON dump and from its YAML; so does each of its sections alone."""
    assert PipelineConfig.model_validate(cfg.model_dump(mode="json")) == cfg
    assert PipelineConfig.model_validate(yaml.safe_load(cfg.to_yaml())) == cfg
    for name in PipelineConfig.model_fields:
        section = getattr(cfg, name)
        if isinstance(section, BaseModel):
            assert type(section).model_validate(section.model_dump(mode="json")) == section, name


@pytest.mark.parametrize("recipe", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_recipe_reads_back_from_its_dumps(recipe):
    assert_round_trips(load_config(recipe))


@pytest.fixture(scope="module")
def rehearsals(tmp_path_factory) -> dict[str, PipelineConfig]:
    from tests.conftest import SHARED_DATA

    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data directory {SHARED_DATA} is absent")
    tmp = tmp_path_factory.mktemp("rehearsals")
    return {recipe.stem: rehearsed(recipe, SHARED_DATA, tmp / recipe.stem)[1] for recipe in RECIPES}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_every_rehearsal_reads_back_from_its_dumps(recipe, rehearsals):
    assert_round_trips(rehearsals[recipe.stem])


@pytest.mark.parametrize(
    "fields",
    [
        {"use_vllm": False},
        {"use_vllm": False, "num_iterations": 2, "off_policy_mask_threshold": 0.5},
        {"use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": "http://gpu-1:8000"},
        {"vllm_importance_sampling_mode": "token_mask", "vllm_importance_sampling_clip_min": 0.5},
        {"loss_type": "vespo"},
        {"loss_type": "vespo", "use_vllm": False},
        {"loss_type": "vespo", "vllm_importance_sampling_correction": False},
    ],
    ids=repr,
)
def test_the_grpo_section_a_remote_round_is_sent_reads_back(fields):
    cfg = GRPOStageConfig(**fields)
    assert GRPOStageConfig.model_validate(cfg.model_dump(mode="json")) == cfg
    assert GRPOStageConfig.model_validate_json(cfg.model_dump_json()) == cfg


def test_a_vllm_correction_without_vllm_is_still_refused():
    with pytest.raises(ValidationError, match="vllm_importance_sampling_mode correct vLLM rollouts but use_vllm is"):
        GRPOStageConfig(use_vllm=False, vllm_importance_sampling_mode="token_mask")
    with pytest.raises(ValidationError, match="needs a per-token correction"):
        GRPOStageConfig(loss_type="vespo", vllm_importance_sampling_mode="sequence_mask")


def test_vespo_alone_takes_a_per_token_correction_where_vllm_may_generate():
    assert GRPOStageConfig(loss_type="vespo").vllm_importance_sampling_mode == "token_truncate"
    assert GRPOStageConfig(loss_type="vespo", use_vllm="false").vllm_importance_sampling_mode == "sequence_mask"
    assert load_config(None, ["grpo.loss_type=vespo"]).grpo.vllm_importance_sampling_mode == "token_truncate"


# ----------------------------------------------------------------------------- random valid configs


def _bounds(info: FieldInfo) -> tuple[float | None, float | None, bool, bool]:
    """(low, high, low is excluded, high is excluded) from the field's ge/gt/le/lt."""
    low = high = None
    low_open = high_open = False
    for m in info.metadata:
        if isinstance(m, annotated_types.Ge):
            low = m.ge
        elif isinstance(m, annotated_types.Gt):
            low, low_open = m.gt, True
        elif isinstance(m, annotated_types.Le):
            high = m.le
        elif isinstance(m, annotated_types.Lt):
            high, high_open = m.lt, True
    return low, high, low_open, high_open


def _values(annotation: Any, info: FieldInfo) -> st.SearchStrategy[Any] | None:
    """Values of one field's type within its bounds; None for types left at their defaults (free text, lists)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [s for a in args if (s := _values(a, info)) is not None]
        return st.one_of(options) if options else None
    if annotation is type(None):
        return st.none()
    if origin is Literal:
        return st.sampled_from(args)
    if annotation is bool:
        return st.booleans()
    low, high, low_open, high_open = _bounds(info)
    if annotation is int:
        lo = (low if low is not None else -3) + (1 if low_open else 0)
        hi = (high if high is not None else lo + 40) - (1 if high_open else 0)
        return st.integers(lo, min(hi, lo + 40))
    if annotation is float:
        lo = low if low is not None else -2.0
        hi = high if high is not None else lo + 10.0
        return st.floats(lo, hi, exclude_min=low_open, exclude_max=high_open, allow_nan=False, width=32)
    return None


def _leaves(model: type[BaseModel], prefix: str = "") -> dict[str, st.SearchStrategy[Any]]:
    """Every scalar field under `model`, by dotted path, with its values; nested sections recursively."""
    leaves: dict[str, st.SearchStrategy[Any]] = {}
    for name, info in model.model_fields.items():
        annotation = info.annotation
        nested = [a for a in (annotation, *typing.get_args(annotation)) if isinstance(a, type)]
        section = next((a for a in nested if issubclass(a, BaseModel)), None)
        if section is not None:
            if name != "rehearsal":  # set by `rehearse`, never by hand
                leaves |= _leaves(section, f"{prefix}{name}.")
            continue
        values = _values(annotation, info)
        if values is not None:
            leaves[prefix + name] = values
    return leaves


LEAVES = _leaves(PipelineConfig)
# No deadline (a validation may wait on a busy machine); no example database left in the working tree; most drawn
# combinations are valid, and the invalid ones are drawn again.
RANDOM: dict[str, Any] = {
    "deadline": None,
    "database": None,
    "suppress_health_check": [HealthCheck.filter_too_much, HealthCheck.too_slow],
}


@st.composite
def valid_configs(draw: st.DrawFn, **fixed: dict[str, Any]) -> PipelineConfig:
    """A config with a handful of fields changed from the defaults (and the `fixed` sections' fields set as given);
    invalid combinations are drawn again."""
    paths = draw(st.lists(st.sampled_from(sorted(LEAVES)), min_size=1, max_size=6, unique=True))
    raw: dict[str, Any] = {name: dict(fields) for name, fields in fixed.items()}
    for path in paths:
        *parents, leaf = path.split(".")
        node = raw
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = draw(LEAVES[path])
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError:
        assume(False)
        raise


@settings(max_examples=300, **RANDOM)
@given(valid_configs())
def test_random_valid_configs_read_back_from_their_dumps(cfg):
    assert_round_trips(cfg)


@settings(max_examples=200, **RANDOM)
@given(valid_configs(model={"base": "Qwen/Qwen2.5-0.5B-Instruct"}, grpo={"use_vllm": "auto"}))
def test_random_valid_recipes_rehearse_and_their_rehearsals_read_back(cfg):
    """`grpo-pipeline rehearse` takes every valid recipe (what it cannot run here it replaces, and says so); the
    stand-in model is not built here, the config is what is checked."""
    import grpo_pipeline.rehearse as rehearse

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rehearse, "_stand_in", lambda cfg: (Path("/stand-in/qwen2"), "Qwen2ForCausalLM"))
        rehearsal = rehearse.rehearsal_config(cfg)
    assert rehearsal.rehearsal.recipe == cfg.name
    assert_round_trips(rehearsal)
