from pathlib import Path

import pytest

from grpo_pipeline.configs.schema import ConfigError, PipelineConfig, apply_overrides, load_config

ROOT = Path(__file__).resolve().parents[1]


def test_default_recipe_loads():
    cfg = load_config(ROOT / "configs" / "tiny-arith.yaml")
    assert cfg.name == "tiny-arith"
    assert cfg.model.base == "tiny"
    assert [r.name for r in cfg.grpo.rewards] == ["correctness", "format"]


def test_every_bundled_recipe_validates():
    recipes = sorted((ROOT / "configs").glob("*.yaml"))
    assert recipes
    for path in recipes:
        assert isinstance(load_config(path), PipelineConfig), path


def test_overrides_are_typed_and_nested():
    cfg = load_config(
        ROOT / "configs" / "tiny-arith.yaml",
        ["grpo.learning_rate=5e-5", "sft.enabled=false", "eval.k=[1, 2]", "data.synthetic.max_digits=3"],
    )
    assert cfg.grpo.learning_rate == pytest.approx(5e-5)
    assert cfg.sft.enabled is False
    assert cfg.eval.k == [1, 2]
    assert cfg.data.synthetic.max_digits == 3


def test_overrides_do_not_mutate_input():
    raw = {"grpo": {"beta": 0.0}}
    out = apply_overrides(raw, ["grpo.beta=0.1"])
    assert raw["grpo"]["beta"] == 0.0 and out["grpo"]["beta"] == 0.1


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("grpo.learning_rate=-1", "grpo.learning_rate"),
        ("grpo.generations_per_prompt=1", "grpo.generations_per_prompt"),
        ("grpo.loss_type=ppo", "grpo.loss_type"),
        ("grpo.learnin_rate=1e-4", "unknown field"),
        ("eval.k=[1, 16]", "exceed eval.n_samples"),
        ("data.source=file", "set data.path"),
        ("model.tiny.num_heads=3", "divisible by num_heads"),
        ("data.synthetic.min_digits=3", "lower min_digits"),
        ("data.synthetic.operations=['*']", "add '+' to operations"),
        ("data.synthetic.teacher_carry_slip=1.5", "data.synthetic.teacher_carry_slip"),
    ],
)
def test_bad_values_name_the_field_and_fix(override, fragment):
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "configs" / "tiny-arith.yaml", [override])
    assert fragment in str(err.value)


def test_malformed_override_and_missing_file():
    with pytest.raises(ConfigError, match=r"key\.sub=value"):
        load_config(None, ["grpo.beta"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("configs/nope.yaml")


def test_fingerprint_tracks_content():
    a = load_config(None)
    b = load_config(None, ["grpo.beta=0.04"])
    assert a.fingerprint() == load_config(None).fingerprint()
    assert a.fingerprint() != b.fingerprint()
