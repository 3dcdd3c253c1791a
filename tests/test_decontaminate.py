"""Decontamination: planted overlaps with benchmark prompts are found (and only they), per suite, and the stage
drops, refuses or ignores them by mode."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd
import pytest
from pydantic import ValidationError

from grpo_pipeline.configs.schema import DataConfig, load_config
from grpo_pipeline.tasks.core.chat import build_messages, encode_messages
from grpo_pipeline.tasks.core.common import Ref, fingerprint_path
from grpo_pipeline.tasks.decontaminate import Decontamination, contaminated, decontaminate, suite_index, words
from grpo_pipeline.tasks.sources import DataError

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

# A GSM8K-style benchmark problem (31 words).
BENCH = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?"
)
# Its words 3-15 (13 of them), in another case and with other punctuation, inside an unrelated question.
SPAN_13 = (
    "Write a story. CLIPS -- to 48 of her friends in april and then: she sold HALF! "
    "Then count the ducks at the pond today."
)
# Its words 3-14 (12 of them), the same way, inside an unrelated question: one word short of a 13-gram.
SPAN_12 = (
    "Write a story. CLIPS -- to 48 of her friends in april and then: she sold "
    "dozens of apples to the farmers at the market."
)
UNRELATED = "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?"


def test_words_are_lowercase_without_punctuation():
    assert words("Natalia's  CLIPS, in April!") == ["natalias", "clips", "in", "april"]
    assert words("１２ ﬁsh") == ["12", "fish"]  # full-width digits and ligatures are their plain forms (NFKC)


def test_a_13_word_span_in_another_case_and_punctuation_overlaps():
    assert contaminated([SPAN_13], {"gsm8k": [BENCH]}, 13) == {"gsm8k": [0]}


def test_12_shared_words_do_not_overlap():
    assert contaminated([SPAN_12, UNRELATED], {"gsm8k": [BENCH]}, 13) == {"gsm8k": []}


def test_a_prompt_shorter_than_n_words_overlaps_when_it_is_whole_inside():
    # 12 words each, whole inside BENCH (case and spacing aside; a short text keeps its marks, so not the last)
    first_12 = "natalia sold clips to 48 of her friends in april, and then"
    last_12 = "To 48 of her  friends in April , and then she sold HALF"
    no_comma = "to 48 of her friends in April and then she sold half"
    assert contaminated([first_12, last_12, SPAN_12, no_comma], {"gsm8k": [BENCH]}, 13) == {"gsm8k": [0, 1]}


def test_the_ngram_size_is_configurable():
    assert contaminated([SPAN_12], {"gsm8k": [BENCH]}, 12) == {"gsm8k": [0]}
    assert contaminated([SPAN_13], {"gsm8k": [BENCH]}, 14) == {"gsm8k": []}
    bench = "the quick brown fox jumps over the lazy dog near the river bank today"
    train = ["we saw the quick brown fox jumps", "we saw the quick brown fox jumps over the lazy dog"]
    assert contaminated(train, {"s": [bench]}, 5) == {"s": [0, 1]}
    assert contaminated(train, {"s": [bench]}, 6) == {"s": [1]}


def test_an_exact_short_prompt_overlaps_and_its_marks_count():
    train = ["47+38=", "47-38=", "4+738=", "47 + 38 =", "7+38=", "47+3="]
    # `47 + 38 =` is the same question spaced out; the others differ only in their marks or digits
    assert contaminated(train, {"arith": ["47+38="]}, 13) == {"arith": [0, 3]}


def test_a_short_prompt_inside_a_longer_one_overlaps_both_ways():
    # a short training prompt contained in a benchmark prompt
    assert contaminated(["47+38="], {"s": ["What is 47+38=? Answer with a number."]}, 13) == {"s": [0]}
    # a short benchmark prompt contained in a training prompt, long or short
    long_train = "Please compute the following sum for me and explain each step of the carry: 47+38= thanks"
    assert contaminated([long_train, "Compute 47+38=", "Compute 47+39="], {"s": ["47+38="]}, 13) == {"s": [0, 1]}
    # whole tokens only: `7+38=` is not inside `47+38=`, `13` is not inside `138`
    assert contaminated(["7+38=", "138"], {"s": ["47+38=", "13"]}, 13) == {"s": []}


def test_chat_prompts_compare_their_message_text_not_the_json():
    chat_train = encode_messages(build_messages(f"Solve this: {BENCH}", "You are a careful math tutor."))
    other = encode_messages(build_messages(UNRELATED, "You are a careful math tutor."))
    assert contaminated([other, chat_train], {"gsm8k": [BENCH]}, 13) == {"gsm8k": [1]}
    # a line break every few words: in the stored JSON each is `\n`, which would glue the words around it
    lines = "Natalia sold clips to\n48 of her friends\nin April, and then\nshe sold half as\nmany clips in May."
    chat_lines = encode_messages(build_messages(f'Solve this:\n"{lines}"'))
    assert "\\n" in chat_lines and contaminated([chat_lines], {"gsm8k": [BENCH]}, 13) == {"gsm8k": [0]}
    # a benchmark suite stored as chat too, short prompts included
    chat_bench = [encode_messages(build_messages("47+38=")), encode_messages(build_messages(BENCH))]
    assert contaminated(["47+38=", SPAN_13, UNRELATED], {"chat": chat_bench}, 13) == {"chat": [0, 1]}


def test_a_shared_system_prompt_is_no_overlap():
    system = "You are a helpful assistant who answers every question about arithmetic with one number only."
    train = [encode_messages(build_messages(f"{a}+{a}=", system)) for a in range(10, 20)]
    bench = [encode_messages(build_messages("47+38=", system)), encode_messages(build_messages(UNRELATED, system))]
    assert contaminated(train, {"s": bench}, 13) == {"s": []}


def test_counts_are_per_suite_and_a_row_may_count_for_two():
    other = "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much?"
    train = [UNRELATED, SPAN_13, other, "47+38=", "1+1="]
    suites = {"gsm8k_test": [BENCH, other], "heldout": ["47+38=", BENCH]}
    assert contaminated(train, suites, 13) == {"gsm8k_test": [1, 2], "heldout": [1, 3]}


def test_the_index_holds_ngrams_and_short_prompts_by_suite():
    index = suite_index({"a": [BENCH, "47+38=", "  "], "b": ["47+38="]}, 13)
    assert len(index.ngrams) == len(words(BENCH)) - 13 + 1
    assert all(suites == {"a"} for suites in index.ngrams.values())
    assert index.short == {4: {"47 + 38 =": frozenset({"a", "b"})}}
    assert contaminated(["", "   "], {"a": [BENCH, "47+38="]}, 13) == {"a": []}  # a blank prompt asks nothing
    with pytest.raises(ValueError, match="at least 1"):
        suite_index({"a": [BENCH]}, 0)


@pytest.mark.skipif(not (SHARED_DATA / "gsm8k_test.jsonl").is_file(), reason="../shared/data/gsm8k_test.jsonl absent")
def test_real_gsm8k_questions_are_found_among_arithmetic_rows():
    questions = [json.loads(line)["question"] for line in (SHARED_DATA / "gsm8k_test.jsonl").open()]
    train = [f"{a}+{b}=" for a in range(10, 60) for b in range(10, 30)]
    planted = range(5, len(train), 80)
    for row, question in zip(planted, questions[::100], strict=False):  # as a chat recipe stores its prompts
        train[row] = encode_messages(build_messages(question, "Think step by step."))
    assert contaminated(train, {"gsm8k_test": questions}, 13) == {"gsm8k_test": list(planted)}


# ----------------------------------------------------------------------------- the stage


def write(path: Path, prompts: list[str]) -> Ref:
    pd.DataFrame(
        {"prompt": prompts, "answer": [str(i) for i in range(len(prompts))], "completion": ["c"] * len(prompts)}
    ).to_parquet(path, index=False)
    return Ref(path=str(path), fingerprint=fingerprint_path(path))


TRAIN = [UNRELATED, SPAN_13, "12+7=", "47+38=", SPAN_12, "Weng earns $12 an hour for babysitting."]


@pytest.fixture
def refs(tmp_path: Path) -> tuple[Ref, dict[str, Ref]]:
    train = write(tmp_path / "train.parquet", TRAIN)
    suites = {
        "gsm8k_test": write(tmp_path / "gsm8k.parquet", [BENCH]),
        "heldout": write(tmp_path / "h.parquet", ["47+38=", BENCH]),
    }
    return train, suites


def test_drop_writes_exactly_the_other_rows_in_order(tmp_path, refs, caplog):
    train, suites = refs
    with caplog.at_level(logging.WARNING, logger="grpo_pipeline"):
        result = decontaminate(train, suites, "drop", 13, str(tmp_path / "runs"))
    assert result.dropped == {"gsm8k_test": 1, "heldout": 2} and result.total == 2 and result.rows == (1, 3)
    assert Path(result.train.path).parent.parent == tmp_path / "runs" / "decontam"
    assert result.train.fingerprint == fingerprint_path(result.train.path)
    kept = pd.read_parquet(result.train.path)
    expected = pd.read_parquet(train.path).iloc[[0, 2, 4, 5]].reset_index(drop=True)
    pd.testing.assert_frame_equal(kept, expected)
    assert result.line() == (
        "decontamination: dropped 2 of 6 training rows (1 overlap gsm8k_test, 2 overlap heldout; 13-word n-grams)"
    )
    assert result.tags() == {
        "decontam.dropped": "2",
        "decontam.gsm8k_test": "1",
        "decontam.heldout": "2",
        "decontam.ngram": "13",
        "decontam.mode": "drop",
    }
    assert result.line() in caplog.text and "47+38=" in caplog.text


def test_error_names_the_suites_and_shows_the_rows(tmp_path, refs):
    train, suites = refs
    with pytest.raises(DataError) as err:
        decontaminate(train, suites, "error", 13, str(tmp_path / "runs"))
    message = str(err.value)
    assert "2 of 6 training rows" in message and "1 overlap gsm8k_test, 2 overlap heldout" in message
    assert "train row 1 (gsm8k_test, heldout): 'Write a story. CLIPS -- to 48" in message
    assert "train row 3 (heldout): '47+38='" in message
    assert "data.decontaminate=drop" in message
    assert not (tmp_path / "runs" / "decontam").exists()


def test_error_cuts_long_prompts_and_lists_the_first_five(tmp_path):
    train = write(tmp_path / "t.parquet", [f"{BENCH} Variant {i}. {'More words here. ' * 20}" for i in range(8)])
    suites = {"gsm8k": write(tmp_path / "s.parquet", [BENCH])}
    with pytest.raises(DataError) as err:
        decontaminate(train, suites, "error", 13, str(tmp_path / "runs"))
    message = str(err.value)
    assert "train row 4" in message and "train row 5" not in message and "... and 3 more" in message
    shown = [line for line in message.splitlines() if "train row" in line]
    assert len(shown) == 5 and all(line.endswith("…'") and len(line) < 120 for line in shown)


def test_off_compares_nothing_and_keeps_every_row(tmp_path, refs):
    train, suites = refs
    result = decontaminate(train, suites, "off", 13, str(tmp_path / "runs"))
    assert result.train == train and result.total == 0 and result.dropped == {} and result.num_rows == 6
    assert result.tags()["decontam.mode"] == "off" and "off" in result.line()
    assert not (tmp_path / "runs" / "decontam").exists()


def test_nothing_to_drop_returns_the_input(tmp_path):
    train = write(tmp_path / "t.parquet", [UNRELATED, SPAN_12, "12+7="])
    result = decontaminate(train, {"gsm8k_test": write(tmp_path / "s.parquet", [BENCH])}, "drop", 13, str(tmp_path))
    assert result.train == train and result.dropped == {"gsm8k_test": 0}
    assert result.line() == "decontamination: no training row overlaps gsm8k_test (3 rows; 13-word n-grams)"


def test_dropping_every_row_is_an_error(tmp_path):
    train = write(tmp_path / "t.parquet", ["47+38=", SPAN_13])
    suites = {"heldout": write(tmp_path / "s.parquet", ["47+38=", BENCH])}
    with pytest.raises(DataError, match="every one of the 2 training rows overlaps"):
        decontaminate(train, suites, "drop", 13, str(tmp_path))


def test_the_stage_key_follows_mode_ngram_and_inputs(tmp_path, refs):
    train, suites = refs

    def key(*args) -> str:
        return decontaminate.stage.key(dict(zip(["train", "suites", "mode", "ngram", "run_dir"], args, strict=True)))

    base = key(train, suites, "drop", 13, "runs")
    assert key(train, suites, "drop", 13, "runs") == base
    others = [
        key(train, suites, "drop", 8, "runs"),
        key(train, suites, "error", 13, "runs"),
        key(train, {"heldout": suites["heldout"]}, "drop", 13, "runs"),
        key(train.model_copy(update={"fingerprint": "other"}), suites, "drop", 13, "runs"),
    ]
    assert base not in others and len(set(others)) == len(others)


def test_an_unknown_mode_is_refused(tmp_path, refs):
    with pytest.raises(ValueError, match="use one of drop, error, off"):
        decontaminate(*refs, "maybe", 13, str(tmp_path))


def test_the_config_fields():
    cfg = load_config(None, ["data.decontaminate=error", "data.decontaminate_ngram=8"]).data
    assert (cfg.decontaminate, cfg.decontaminate_ngram) == ("error", 8)
    assert (DataConfig().decontaminate, DataConfig().decontaminate_ngram) == ("drop", 13)
    for bad in ({"decontaminate": "maybe"}, {"decontaminate_ngram": 0}):
        with pytest.raises(ValidationError):
            DataConfig(**bad)
    for name in ("decontaminate", "decontaminate_ngram"):
        assert DataConfig.model_fields[name].description


def test_a_result_round_trips_as_json():
    result = Decontamination(
        train=Ref(path="t", fingerprint="f"), dropped={"a": 1}, rows=(3,), num_rows=9, ngram=13, mode="drop"
    )
    assert Decontamination.model_validate_json(result.model_dump_json()) == result
    assert result.total == 1


INSTRUCTION = "Read the problem below carefully, think step by step, and put the final answer after four hashes.\n"


def test_a_templates_own_words_are_no_overlap(tmp_path):
    """A 16-word instruction in the prompt template wraps every training row and every held-out row: compared as
    they are, all would overlap; what they ask (the template's text taken off) does not, and a real copy still does."""
    template = INSTRUCTION + "{prompt}"
    asked = [f"Tom has {i} apples and buys {i + 3} more; how many now?" for i in range(6)]
    rows = [template.format(prompt=q) for q in [*asked[:4], BENCH]]
    train = write(tmp_path / "train.parquet", rows)
    suites = {
        "heldout": write(tmp_path / "h.parquet", [template.format(prompt=q) for q in asked[4:]]),
        "gsm8k_test": write(tmp_path / "g.parquet", [f"Question: {BENCH}"]),
    }
    templates = {"train": template, "heldout": template, "gsm8k_test": "Question: {prompt}"}
    result = decontaminate(train, suites, "drop", 13, str(tmp_path / "runs"), templates)
    assert result.dropped == {"heldout": 0, "gsm8k_test": 1} and result.rows == (4,)
    with pytest.raises(DataError, match="every one of the 5 training rows"):
        decontaminate(train, suites, "drop", 13, str(tmp_path / "runs3"))  # the template's 16 words, everywhere
