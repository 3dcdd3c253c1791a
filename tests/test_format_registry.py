"""The one registry of benchmark and code test formats: every format has every part, and detection tries them in the
order the docs give (tasks/scoring/formats.py, rewards/code_formats/, docs/rewards.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

from grpo_pipeline.rewards import REGISTRY, code_formats
from grpo_pipeline.rewards.code_formats import CODE_FORMATS, TEST_FORMAT_COLUMNS, StdoutRule, detect_tests_format
from grpo_pipeline.tasks.scoring import formats
from grpo_pipeline.tasks.scoring.formats import EVAL_FORMATS, FORMATS, correctness_reward_for, detect_format

ROOT = Path(__file__).resolve().parents[1]
# how the docs name each code format
DOC_NAMES = {"apps": "APPS", "codecontests": "CodeContests", "livecodebench": "LiveCodeBench", "open-r1": "open-r1"}


def test_every_eval_format_has_every_part() -> None:
    assert len(set(FORMATS)) == len(FORMATS)
    for fmt in EVAL_FORMATS:
        assert fmt.signatures and all(s and all(isinstance(c, str) for c in s) for s in fmt.signatures), fmt.name
        assert fmt.correctness_reward.name in REGISTRY, fmt.name
        assert correctness_reward_for(fmt.name) == fmt.correctness_reward
        assert callable(fmt.mapper), fmt.name


def test_every_code_format_has_every_part_and_is_an_eval_format() -> None:
    assert len({code.name for code in CODE_FORMATS}) == len(CODE_FORMATS)
    built = {fmt.name: fmt for fmt in EVAL_FORMATS if fmt.code is not None}
    assert list(built) == [code.name for code in CODE_FORMATS]
    for code in CODE_FORMATS:
        assert built[code.name].code is code and built[code.name].signatures == code.signatures
        assert built[code.name].correctness_reward.name == "code_tests"
        assert callable(code.parse), code.name
        assert code.stdout_rule in get_args(StdoutRule) and code.stdout_rule != "lines", code.name
        assert code.test_columns and code.statement_columns and code.id_column, code.name
        assert code.first_solution is None or code.solutions_column, code.name
        assert set(code.test_columns) <= set(TEST_FORMAT_COLUMNS)


def test_each_format_is_detected_from_each_of_its_signatures() -> None:
    # no earlier format's columns hide a later one's
    for fmt in EVAL_FORMATS:
        for signature in fmt.signatures:
            assert detect_format(signature) == fmt.name, (fmt.name, sorted(signature))
    for code in CODE_FORMATS:
        for column in code.test_columns:
            found = detect_tests_format({column: "[]"})
            assert found is code, (code.name, column)


def test_eval_detection_order_is_the_documented_one() -> None:
    doc = " ".join((formats.__doc__ or "").split())
    listed = re.search(r"Detection tries the formats in this order, first match wins: ([^.]+)\.", doc)
    assert listed, "tasks/scoring/formats.py's docstring no longer states the detection order"
    assert tuple(name.strip() for name in listed.group(1).split(",")) == FORMATS


def test_code_detection_order_is_the_documented_one() -> None:
    def order(text: str) -> list[str]:
        first = {name: text.find(label) for name, label in DOC_NAMES.items()}
        assert all(at >= 0 for at in first.values()), first
        return sorted(first, key=first.__getitem__)

    registered = [code.name for code in CODE_FORMATS]
    package = code_formats.__doc__ or ""
    listed = package[package.index("The formats, by the columns they are published with") :]
    assert order(listed) == registered
    docs = (ROOT / "docs" / "rewards.md").read_text()
    table = docs[docs.index("## Code test formats") : docs.index("### How stdout is compared")]
    rows = "\n".join(line.split("|")[1] for line in table.splitlines() if line.startswith("| "))
    assert order(rows) == registered
