import json

import datasets
import pandas as pd
import pytest

from grpo_pipeline.configs.schema import DataConfig, load_config
from grpo_pipeline.tasks.data import prepare_data, split_train_eval
from grpo_pipeline.tasks.sources import DataError
from grpo_pipeline.tasks.sources.contract import DataValidationError, validate_frames
from grpo_pipeline.tasks.sources.synthetic import carry_free_sum, needs_carry, synthetic_arithmetic
from grpo_pipeline.tasks.validate import validate_data


def synthetic_cfg(**kw) -> DataConfig:
    return load_config(None, [f"data.{k}={v}" for k, v in {"num_train": 300, "num_eval": 50, **kw}.items()]).data


def assert_sums_are_right(df: pd.DataFrame) -> None:
    for prompt, answer in zip(df["prompt"], df["answer"], strict=True):
        x, y = prompt.rstrip("=").split("+")
        assert int(x) + int(y) == int(answer)


def test_synthetic_task_is_deterministic_and_correct():
    cfg = synthetic_cfg()
    a = synthetic_arithmetic(cfg.synthetic, 100, seed=3)
    b = synthetic_arithmetic(cfg.synthetic, 100, seed=3)
    c = synthetic_arithmetic(cfg.synthetic, 100, seed=4)
    pd.testing.assert_frame_equal(a, b)
    assert not a.equals(c)
    assert a["prompt"].is_unique
    assert_sums_are_right(a)


def test_synthetic_refuses_more_problems_than_exist():
    cfg = synthetic_cfg(**{"synthetic.max_digits": 1})
    with pytest.raises(DataError, match="distinct problems"):
        synthetic_arithmetic(cfg.synthetic, 90, seed=0)


def test_prepare_writes_disjoint_deterministic_splits(tmp_path):
    cfg = synthetic_cfg()
    refs = prepare_data(cfg, str(tmp_path / "a"))
    again = prepare_data(cfg, str(tmp_path / "b"))
    assert refs.train.fingerprint == again.train.fingerprint and refs.eval.fingerprint == again.eval.fingerprint
    train, held_out = pd.read_parquet(refs.train.path), pd.read_parquet(refs.eval.path)
    assert len(train) == 300 and len(held_out) == 50
    assert not set(train["prompt"]) & set(held_out["prompt"])
    validate_data(refs, cfg)  # the contract holds for built-in data


def test_imperfect_teacher_forgets_carries_in_sft_targets_only(tmp_path):
    cfg = synthetic_cfg(**{"synthetic.min_digits": 2, "synthetic.teacher_carry_slip": 0.5, "num_train": 2000})
    refs = prepare_data(cfg, str(tmp_path / "a"))
    train, held_out = pd.read_parquet(refs.train.path), pd.read_parquet(refs.eval.path)
    carry = train["prompt"].map(needs_carry)
    slipped = train["completion"] != train["answer"]
    assert not slipped[~carry].any()  # problems without a carry keep the right target
    assert 0.4 < slipped[carry].mean() < 0.6  # about half of those with one lose it
    assert (train.loc[slipped, "completion"].astype(int) == train.loc[slipped, "answer"].astype(int) - 10).all()
    assert (held_out["completion"] == held_out["answer"]).all()  # evaluation rows are untouched
    assert_sums_are_right(train)  # and so are the answers rewards check
    again = prepare_data(cfg, str(tmp_path / "b"))
    assert again.train.fingerprint == refs.train.fingerprint
    perfect = prepare_data(synthetic_cfg(**{"synthetic.min_digits": 2, "num_train": 2000}), str(tmp_path / "c"))
    assert (pd.read_parquet(perfect.train.path)["completion"] == train["answer"]).all()
    validate_data(refs, cfg)


def test_a_teacher_that_forgets_every_carry_adds_column_by_column(tmp_path):
    """`teacher_slip_carries: all`: a slipped target is the carry-free column sum (75+48 -> 13), on problems that
    need any carry (into the tens or the hundreds) and on no other; the answers stay right."""
    assert [carry_free_sum(a, b) for a, b in [(75, 48), (51, 50), (47, 38), (41, 38), (72, 41)]] == [13, 1, 75, 79, 13]
    over = {"synthetic.min_digits": 2, "synthetic.teacher_carry_slip": 0.5, "num_train": 2000}
    cfg = synthetic_cfg(**over, **{"synthetic.teacher_slip_carries": "all"})
    train = pd.read_parquet(prepare_data(cfg, str(tmp_path / "a")).train.path)
    sums = train["prompt"].str.extract(r"(\d+)\+(\d+)=").astype(int)
    free = [str(carry_free_sum(a, b)) for a, b in zip(sums[0], sums[1], strict=True)]
    carries = pd.Series(free, index=train.index) != train["answer"]
    slipped = train["completion"] != train["answer"]
    assert not slipped[~carries].any() and 0.4 < slipped[carries].mean() < 0.6
    assert (train.loc[slipped, "completion"] == pd.Series(free, index=train.index)[slipped]).all()
    assert ((train["answer"].astype(int) >= 100) & slipped).any()  # the hundreds' carry is forgotten too
    assert_sums_are_right(train)
    units = pd.read_parquet(prepare_data(synthetic_cfg(**over), str(tmp_path / "b")).train.path)
    assert (units["completion"] != train["completion"]).any()  # 'units' (the default) is another teacher
    with pytest.raises(ValueError, match="teacher_slip_carries"):
        synthetic_cfg(**{"synthetic.teacher_slip_carries": "some"})


def test_the_units_drill_is_sfts_alone(tmp_path):
    """The drill adds the 100 one-digit additions at the task's width to SFT's rows only: GRPO's prompts (train),
    the eval items and the probe never hold one, and its targets are right and written as real answers are."""
    cfg = synthetic_cfg(**{"synthetic.min_digits": 2, "synthetic.units_drill": 3, "num_probe": 20})
    refs = prepare_data(cfg, str(tmp_path / "a"))
    train, sft = pd.read_parquet(refs.train.path), pd.read_parquet(refs.sft.path)
    drill = sft.iloc[len(train) :]
    pd.testing.assert_frame_equal(sft.iloc[: len(train)], train)  # SFT sees every training row, as before
    assert len(drill) == 300 and drill["prompt"].nunique() == 100 and drill["prompt"].str.match(r"^0\d\+0\d=$").all()
    assert_sums_are_right(drill)
    assert (drill["completion"] == drill["answer"]).all() and drill["answer"].str.match(r"^(0|[1-9]\d*)$").all()
    held = {*pd.read_parquet(refs.eval.path)["prompt"], *pd.read_parquet(refs.probe.path)["prompt"], *train["prompt"]}
    assert not held & set(drill["prompt"])
    assert refs.sft_train == refs.sft
    plain = prepare_data(synthetic_cfg(**{"synthetic.min_digits": 2, "num_probe": 20}), str(tmp_path / "b"))
    assert plain.sft is None and plain.sft_train == plain.train and plain.train.fingerprint == refs.train.fingerprint
    with pytest.raises(ValueError, match="units_drill"):
        synthetic_cfg(**{"synthetic.kind": "functions", "synthetic.units_drill": 1})


def test_needs_carry():
    assert needs_carry("47+38=") and needs_carry("Q: 5+5=") and not needs_carry("41+38=")
    assert needs_carry("47-38=") is None


def test_split_keeps_duplicate_prompts_on_one_side():
    df = pd.DataFrame({"prompt": ["a", "a", "b", "c", "c", "d"], "answer": list("123456")})
    for seed in range(10):
        train, held_out, _ = split_train_eval(df, 10, 2, seed)
        assert not set(train["prompt"]) & set(held_out["prompt"])
        assert len(train) + len(held_out) == len(df)


def test_the_probe_split_is_disjoint_from_training_and_eval_and_leaves_eval_as_it_was():
    df = pd.DataFrame({"prompt": [f"p{i % 40}" for i in range(48)], "answer": range(48)})  # 8 prompts twice
    for seed in range(5):
        train, held_out, probe = split_train_eval(df, 30, 6, seed, num_probe=5)
        assert len(train) == 30 and len(held_out) >= 6 and len(probe) >= 5
        sides = [set(frame["prompt"]) for frame in (train, held_out, probe)]
        assert not (sides[0] & sides[1] or sides[0] & sides[2] or sides[1] & sides[2])
        without, eval_without, none = split_train_eval(df, 30, 6, seed)
        assert eval_without.equals(held_out) and without.equals(train) and none.empty  # the probe is extra rows


def test_prepared_data_has_a_probe_split_that_validation_reads(tmp_path):
    refs = prepare_data(synthetic_cfg(num_train=50, num_eval=10, num_probe=8), str(tmp_path))
    train, held_out, probe = (pd.read_parquet(r.require()) for r in (refs.train, refs.eval, refs.probe))
    assert (len(train), len(held_out), len(probe)) == (50, 10, 8)
    assert not set(probe["prompt"]) & (set(train["prompt"]) | set(held_out["prompt"]))
    without = prepare_data(synthetic_cfg(num_train=50, num_eval=10, num_probe=0), str(tmp_path / "b"))
    assert without.probe is None
    # the probe's problems are drawn after the others: the same seed trains and evaluates on the same rows
    assert (without.train.fingerprint, without.eval.fingerprint) == (refs.train.fingerprint, refs.eval.fingerprint)
    leaked = pd.concat([probe.head(2), held_out.head(1)], ignore_index=True)  # an eval item in the probe
    with pytest.raises(DataValidationError, match=r"probe row 2: .*no_probe_prompt_in_train_or_eval"):
        validate_frames(train, held_out, synthetic_cfg(), leaked)
    validate_frames(train, held_out, synthetic_cfg(), probe)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "csv"])
def test_local_files_with_column_mapping(tmp_path, fmt):
    rows = pd.DataFrame(
        {"question": [f"What is {i} plus {i}?" for i in range(40)], "solution": [f"So #### {2 * i}" for i in range(40)]}
    )
    path = tmp_path / f"data.{fmt}"
    {
        "jsonl": lambda: rows.to_json(path, orient="records", lines=True),
        "parquet": lambda: rows.to_parquet(path),
        "csv": lambda: rows.to_csv(path, index=False),
    }[fmt]()
    cfg = load_config(
        None,
        [
            "data.source=file",
            f"data.path={path}",
            "data.prompt_column=question",
            "data.answer_column=solution",
            "data.completion_column=solution",
            "data.answer_pattern='#### (.+)$'",
            "data.num_eval=10",
            'data.prompt_template="Q: {prompt}\\nA:"',
        ],
    ).data
    refs = prepare_data(cfg, str(tmp_path / "run"))
    validate_data(refs, cfg)
    train = pd.read_parquet(refs.train.path)
    assert len(train) == 30
    row = train.iloc[0]
    n = int(row["prompt"].split()[3])
    assert row["prompt"] == f"Q: What is {n} plus {n}?\nA:"
    assert row["answer"] == str(2 * n)
    assert row["completion"].endswith(f"#### {2 * n}")


def test_hf_dataset_from_local_directory(tmp_path):
    ds = datasets.Dataset.from_dict(
        {"prompt": [f"{i}+1=" for i in range(30)], "answer": [str(i + 1) for i in range(30)]}
    )
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "ds"))
    cfg = load_config(None, ["data.source=hf", f"data.hf_name={tmp_path / 'ds'}", "data.num_eval=5"]).data
    refs = prepare_data(cfg, str(tmp_path / "run"))
    assert len(pd.read_parquet(refs.train.path)) == 25
    bad_split = load_config(None, ["data.source=hf", f"data.hf_name={tmp_path / 'ds'}", "data.hf_split=test"]).data
    with pytest.raises(DataError, match="not 'test'"):
        prepare_data(bad_split, str(tmp_path / "run2"))


def test_missing_columns_and_files_are_named(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"q": "1+1=", "a": "2"}) + "\n")
    cfg = load_config(None, ["data.source=file", f"data.path={path}"]).data
    with pytest.raises(DataError, match=r"no column\(s\) \['prompt', 'answer'\]; available: \['q', 'a'\]"):
        prepare_data(cfg, str(tmp_path / "run"))
    cfg = load_config(None, ["data.source=file", f"data.path={tmp_path / 'nope.jsonl'}"]).data
    with pytest.raises(DataError, match="does not exist"):
        prepare_data(cfg, str(tmp_path / "run"))


# ----------------------------------------------------------------------------- the pandera contract


def good_frames():
    train = pd.DataFrame({"prompt": ["1+1=", "2+2=", "3+3="], "answer": ["2", "4", "6"], "completion": ["2", "4", "6"]})
    held_out = pd.DataFrame({"prompt": ["4+4=", "5+5="], "answer": ["8", "10"], "completion": ["8", "10"]})
    return train, held_out


@pytest.mark.parametrize(
    ("mutate", "check", "where"),
    [
        (
            lambda t, e: t.__setitem__("prompt", ["1+1=", "1+1=", "3+3="]),
            "no_duplicate_prompts_within_split",
            "train row 1",
        ),
        (lambda t, e: e.__setitem__("prompt", ["1+1=", "5+5="]), "no_prompt_in_both_train_and_eval", "eval row 0"),
        (lambda t, e: t.__setitem__("prompt", ["1+1=", "   ", "3+3="]), "prompt_not_blank", "train row 1"),
        (lambda t, e: t.__setitem__("prompt", ["1+1=", "", "3+3="]), "str_length", "train row 1"),
        (lambda t, e: t.__setitem__("prompt", ["1+1=", "x" * 5000, "3+3="]), "str_length", "train row 1"),
        (lambda t, e: e.__setitem__("answer", ["8", None]), "not_nullable", "eval row 1"),
        (lambda t, e: t.__setitem__("answer", ["2", " ", "6"]), "answer_not_blank", "train row 1"),
    ],
)
def test_contract_rejects_each_bad_row_kind(mutate, check, where):
    train, held_out = good_frames()
    validate_frames(train, held_out, DataConfig())
    mutate(train, held_out)
    with pytest.raises(DataValidationError) as err:
        validate_frames(train, held_out, DataConfig())
    assert check in str(err.value) and where in str(err.value)
    assert not err.value.failures.empty


def test_contract_lists_every_bad_row_at_once():
    train, held_out = good_frames()
    train["prompt"] = ["1+1=", "1+1=", " "]
    held_out["answer"] = [None, "10"]
    with pytest.raises(DataValidationError) as err:
        validate_frames(train, held_out, DataConfig())
    msg = str(err.value)
    assert "train row 1" in msg and "train row 2" in msg and "eval row 0" in msg
    assert "in 3 row(s)" in msg
