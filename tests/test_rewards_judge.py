"""LLM-as-judge against a small OpenAI-compatible fake server on loopback."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from grpo_pipeline.rewards import build_reward
from grpo_pipeline.rewards.judge import parse_score


class FakeJudge(BaseHTTPRequestHandler):
    """Grades 'good' responses 8/10 and others 2/10; 'flaky' fails once with 503; 'slow' sleeps; 'babble' has no
    score."""

    calls: ClassVar[list[dict]] = []
    seen_flaky = False
    lock = threading.Lock()

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            FakeJudge.calls.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        user = body["messages"][-1]["content"]
        if "flaky" in user:
            with self.lock:
                first, FakeJudge.seen_flaky = not FakeJudge.seen_flaky, True
            if first:
                self.send_response(503)
                self.end_headers()
                return
        if "slow" in user:
            time.sleep(1.5)
        reply = "Looks fine. SCORE: 8" if ("good" in user or "flaky" in user) else "Wrong. SCORE: 2"
        if "babble" in user:
            reply = "I cannot decide."
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": reply}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server() -> Iterator[str]:
    FakeJudge.calls, FakeJudge.seen_flaky = [], False
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeJudge)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.integration
def test_judge_scores_through_the_endpoint(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUDGE_KEY", "sk-test")
    fn = build_reward(
        "judge",
        {
            "base_url": server,
            "model": "grader",
            "rubric": "Grade 0-{max_score}.",
            "api_key_env": "JUDGE_KEY",
            "concurrency": 4,
        },
    )
    completions = ["a good answer", [{"role": "assistant", "content": "a bad answer"}], "babble"]
    scores = fn(
        prompts=["Q1", [{"role": "user", "content": "Q2"}], "Q3"],
        completions=completions,
        answer=["ref1", "ref2", "ref3"],
    )
    assert scores == [0.8, 0.2, None]
    first = FakeJudge.calls[0]
    assert first["path"] == "/v1/chat/completions" and first["auth"] == "Bearer sk-test"
    assert first["body"]["model"] == "grader"
    assert first["body"]["messages"][0]["content"] == "Grade 0-10.0."
    assert any("Reference answer:\nref2" in c["body"]["messages"][1]["content"] for c in FakeJudge.calls)


@pytest.mark.integration
def test_judge_retries_then_times_out_to_none(server: str) -> None:
    fn = build_reward("judge", {"base_url": server, "model": "m", "retries": 1, "timeout_s": 0.5, "api_key_env": None})
    assert fn(prompts=["q", "q"], completions=["flaky", "slow"]) == [0.8, None]
    sent = [c["body"]["messages"][1]["content"] for c in FakeJudge.calls]
    assert sum("flaky" in c for c in sent) == 2  # one retry after the 503
    # the slow reply (1.5 s) never arrived within timeout_s: both attempts were cut off, so the score is None
    assert sum("slow" in c for c in sent) == 2


def test_judge_unreachable_is_none() -> None:
    fn = build_reward("judge", {"base_url": "http://127.0.0.1:9/v1", "model": "m", "retries": 0, "timeout_s": 1})
    assert fn(prompts=["q"], completions=["good"]) == [None]


def test_parse_score() -> None:
    assert parse_score("reasoning... SCORE: 7\n", 10) == 0.7
    assert parse_score("SCORE: 3 then SCORE=9", 10) == 0.9
    assert parse_score("score: 11", 10) is None
    assert parse_score("no verdict", 10) is None
