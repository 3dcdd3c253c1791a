"""Every registered reward: built from the registry, on plain strings and chat messages, with real-looking inputs."""

from __future__ import annotations

import math
import textwrap

import pytest

from grpo_pipeline.rewards import REGISTRY, build_reward, build_rewards
from grpo_pipeline.rewards.format import tag_count_score
from grpo_pipeline.rewards.length import repetition_score
from grpo_pipeline.rewards.registry import RewardError

GOOD_XML = "<reasoning>\n2 + 2 is 4.\n</reasoning>\n<answer>\n4\n</answer>\n"
SOFT_XML = "Sure. <reasoning>2 + 2 is 4.</reasoning> <answer>4</answer>"


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def test_every_registered_reward_builds() -> None:
    needs_params = {"judge": {"base_url": "http://127.0.0.1:9", "model": "m"}}
    expected = {
        "correctness",
        "format",
        "format_strict",
        "format_soft",
        "tag_count",
        "length",
        "cosine_length",
        "repetition_penalty",
        "overlong",
        "code_tests",
        "judge",
    }
    assert expected <= set(REGISTRY)
    for name in REGISTRY:
        try:
            fn = build_reward(name, needs_params.get(name))
        except RewardError as e:  # only where the code sandbox refuses to run programs (root without bwrap)
            assert name == "code_tests" and "apt-get install bubblewrap" in str(e), e
            continue
        assert callable(fn) and fn.__name__ == name


def test_dotted_path_user_reward() -> None:
    fn = build_reward("tests.test_rewards:user_reward")
    assert fn(prompts=["p"], completions=["abc"]) == [3.0]
    factory = build_reward("tests.test_rewards:user_factory", {"bonus": 2.0})
    assert factory(prompts=["p", "q"], completions=["a", chat("xy")]) == [3.0, 4.0]
    with pytest.raises(RewardError, match="no attribute"):
        build_reward("tests.test_rewards:missing")
    with pytest.raises(RewardError, match="neither registered"):
        build_reward("no_such_reward")


def user_reward(prompts, completions, **kwargs):
    return [float(len(c)) for c in completions]


def user_factory(bonus: float):
    def reward(prompts, completions, **kwargs):
        from grpo_pipeline.rewards import completion_text

        return [len(completion_text(c)) + bonus for c in completions]

    return reward


def test_build_rewards_keeps_weights() -> None:
    fns, weights = build_rewards([{"name": "correctness", "weight": 1.0}, {"name": "format_soft", "weight": 0.2}])
    assert [f.__name__ for f in fns] == ["correctness", "format_soft"] and weights == [1.0, 0.2]


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("46", "46", 1.0),  # the tiny arithmetic recipe
        ("47", "46", 0.0),
        ("", "46", 0.0),
        ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "Natalia sold 48/2 = 24 clips.\n#### 72", 1.0),
        ("So the total is $\\boxed{1,000}$ dollars.", "It costs 1000.\n#### 1,000", 1.0),
        ("The answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("The answer is \\boxed{3}", "\\boxed{4}", 0.0),
        (GOOD_XML, "4", 1.0),
        ("<reasoning>5 is wrong</reasoning><answer>5</answer>", "4", 0.0),
    ],
)
def test_correctness(completion: str, answer: str, expected: float) -> None:
    fn = build_reward("correctness")
    assert fn(prompts=["q"], completions=[completion], answer=[answer]) == [expected]
    assert fn(prompts=["q"], completions=[chat(completion)], answer=[answer]) == [expected]


def test_correctness_without_answers_is_not_applicable() -> None:
    assert build_reward("correctness")(prompts=["q"], completions=["4"]) == [None]


def test_correctness_in_a_thread_and_errors_are_none(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from grpo_pipeline.rewards import math as math_rewards

    out: dict[str, list] = {}
    fn = build_reward("correctness")
    t = threading.Thread(
        target=lambda: out.update(v=fn(prompts=["q"] * 2, completions=["$\\frac{2}{4}$", "x=3"], answer=["0.5", "4"]))
    )
    t.start()
    t.join(timeout=120)
    assert out["v"] == [1.0, 0.0]

    def broken(*args, **kwargs):
        raise RuntimeError("internal math-verify failure")

    monkeypatch.setattr("math_verify.verify", broken)
    assert math_rewards._verify_here([("1/2", "\\boxed{0.5}")], 5) == [None]


def test_format_rewards() -> None:
    completions = [GOOD_XML, SOFT_XML, "4"]
    assert build_reward("format_strict")(prompts=[""] * 3, completions=completions) == [1.0, 0.0, 0.0]
    assert build_reward("format_soft")(prompts=[""] * 3, completions=completions) == [1.0, 1.0, 0.0]
    assert build_reward("format", {"pattern": r"^-?\d+$"})(prompts=[""] * 3, completions=completions) == [0, 0, 1.0]
    think = build_reward("format_strict", {"reasoning_tag": "think"})
    assert think(prompts=[""], completions=[chat(GOOD_XML.replace("reasoning", "think"))]) == [1.0]


def test_tag_count_partial_credit_and_trailing_penalty() -> None:
    assert tag_count_score(GOOD_XML, "reasoning", "answer", 0.001) == 1.0
    assert tag_count_score("<reasoning>only", "reasoning", "answer", 0.001) == 0.25
    assert tag_count_score(GOOD_XML + "x" * 100, "reasoning", "answer", 0.001) == pytest.approx(0.9)
    assert tag_count_score("<answer>1</answer><answer>2</answer>", "reasoning", "answer", 0.001) == 0.0
    assert build_reward("tag_count")(prompts=[""], completions=[chat(GOOD_XML)]) == [1.0]


def test_length_reward_kimi() -> None:
    fn = build_reward("length", {"unit": "chars"})
    completions = ["4", "it is 4", "the answer is 5 after long thought"]
    scores = fn(prompts=["q"] * 3, completions=completions, answer=["4", "4", "4"])
    assert scores[0] == pytest.approx(0.5)  # shortest and correct
    assert 0 < scores[1] < 0.5
    assert scores[2] == pytest.approx(-0.5)  # longest and wrong
    assert fn(prompts=["q", "q"], completions=["5", "5"], answer=["4", "4"]) == [0.0, 0.0]


def test_cosine_length() -> None:
    fn = build_reward("cosine_length", {"max_len": 100, "unit": "chars"})
    short_ok, long_ok, short_bad, long_bad = fn(
        prompts=["q"] * 4, completions=["4", "4" + " " * 99, "5", "5" + " " * 99], answer=["4"] * 4
    )
    assert short_ok == pytest.approx(1.0, abs=1e-3) and long_ok == pytest.approx(0.5)
    assert short_bad == pytest.approx(-1.0, abs=1e-3) and long_bad == pytest.approx(-0.5)
    auto = build_reward("cosine_length", {"max_len": 100})  # tokens when TRL passes completion_ids
    tokens = auto(prompts=["q"], completions=["4"], answer=["4"], completion_ids=[[1] * 50])
    assert tokens[0] == pytest.approx(0.5 + 0.25 * (1 + math.cos(math.pi / 2)))


def test_repetition_penalty() -> None:
    assert repetition_score("a b c d e f", 3, -1.0) == 0.0
    assert repetition_score("the cat " * 50, 3, -1.0) < -0.9
    assert repetition_score("too short", 3, -1.0) == 0.0
    fn = build_reward("repetition_penalty", {"ngram_size": 2, "max_penalty": -0.5})
    assert fn(prompts=[""], completions=[chat("a b a b")]) == [pytest.approx(-0.5 * (1 - 2 / 3))]
    with pytest.raises(RewardError):
        build_reward("repetition_penalty", {"max_penalty": 1.0, "bogus": 1})


def test_overlong_soft_punishment() -> None:
    fn = build_reward("overlong", {"max_len": 10, "cache_len": 4})
    ids = [[0] * n for n in (6, 8, 10, 12)]
    assert fn(prompts=[""] * 4, completions=[""] * 4, completion_ids=ids) == [0.0, -0.5, -1.0, -1.0]
    chars = build_reward("overlong", {"max_len": 10, "cache_len": 4, "unit": "chars"})
    assert chars(prompts=[""], completions=["x" * 7]) == [-0.25]
    with pytest.raises(ValueError):
        build_reward("overlong", {"max_len": 10, "cache_len": 20})


@pytest.mark.integration
def test_code_tests_mbpp_style(code_sandbox: None) -> None:
    fn = build_reward("code_tests", {"timeout_s": 5})
    tests = [
        'assert remove_Occ("hello","l") == "heo"',
        'assert remove_Occ("PHP","P") == "H"',
        'assert remove_Occ("abcabca","a") == "bcabc"',
    ]
    good = textwrap.dedent(
        """
        Here is the function:
        ```python
        def remove_Occ(s, ch):
            first, last = s.find(ch), s.rfind(ch)
            if first < 0:
                return s
            s = s[:first] + s[first + 1 :]
            last = s.rfind(ch)
            return s[:last] + s[last + 1 :] if last >= 0 else s
        ```
        """
    )
    half = "def remove_Occ(s, ch):\n    return s.replace(ch, '')\n"
    scores = fn(prompts=["p"] * 4, completions=[good, half, chat(good), "no code"], test_list=[tests] * 4)
    assert scores == [1.0, 0.0, 1.0, 0.0]
    frac = build_reward("code_tests", {"mode": "fraction"})
    assert frac(prompts=["p"], completions=[half], test_list=[tests]) == [pytest.approx(2 / 3)]
    assert frac(prompts=["p"], completions=[half], answer=["x"]) == [None]  # no tests: not applicable
    iso = build_reward("code_tests", {"mode": "fraction", "timeout_s": 5})
    math_test = ["assert math.isclose(area(2), 12.566, rel_tol=1e-3)"]
    assert iso(prompts=["p"], completions=["import math\ndef area(r): return math.pi*r*r"], test_list=[math_test]) == [
        1.0
    ]
