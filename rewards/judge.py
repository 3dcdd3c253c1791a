"""LLM-as-judge: a model behind an OpenAI-compatible chat endpoint grades each completion against a rubric.

Works with any server that implements `POST {base_url}/chat/completions` (OpenAI, vLLM, SGLang, llama.cpp, TGI's
Messages API). The judge is asked to end its reply with `SCORE: <number>` on a 0..max_score scale; the reward is
that number divided by max_score. Unparseable replies, HTTP errors after the retries and timeouts are logged and
scored None (not applicable), never 0. The API key is read from the environment variable named by `api_key_env`,
never from the config.
"""

from __future__ import annotations

import logging
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from grpo_pipeline.rewards.code import prompt_text
from grpo_pipeline.rewards.registry import RewardFn, call_deadline, register
from grpo_pipeline.tasks.core.chat import completion_text

logger = logging.getLogger(__name__)

DEFAULT_RUBRIC = (
    "You grade answers. Judge whether the response answers the question correctly, completely and clearly. "
    "Explain briefly, then end with a final line `SCORE: <integer from 0 to {max_score}>`."
)
_SCORE = re.compile(r"SCORE\s*[:=]\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)


def parse_score(reply: str, max_score: float) -> float | None:
    """The last `SCORE: x` in a judge reply, scaled to [0, 1]; None when absent or out of range."""
    found = _SCORE.findall(reply)
    if not found:
        return None
    value = float(found[-1])
    if not 0 <= value <= max_score:
        return None
    return value / max_score


def _chat(
    client: httpx.Client,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    retries: int,
    timeout_s: float,
    deadline: float | None = None,
) -> str | None:
    """The reply text of one chat request, retried with backoff on connection errors, timeouts, 429 and 5xx; None
    (logged) when it still fails.

    `timeout_s` is httpx's, per phase (connect, each read, ...): a server that trickles bytes is not cut off by it.
    `deadline` (the registry's `call_deadline()`) bounds the whole: no attempt starts after it, each waits at most
    until it, and a failure past it is logged at debug level only (the registry has warned once for the call)."""
    for attempt in range(retries + 1):
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            logger.debug("judge request not sent: the reward call is past its time limit")
            return None
        try:
            timeout = timeout_s if remaining is None else min(timeout_s, remaining)
            r = client.post(url, json=body, headers=headers, timeout=timeout)
            if r.status_code == 429 or r.status_code >= 500:
                raise httpx.HTTPStatusError(f"HTTP {r.status_code}", request=r.request, response=r)
            r.raise_for_status()
            return r.json()["choices"][0]["message"]["content"] or ""
        except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as e:
            retryable = (
                not isinstance(e, httpx.HTTPStatusError)
                or e.response.status_code in (429,)
                or e.response.status_code >= 500
            )
            late = deadline is not None and time.monotonic() >= deadline
            if attempt < retries and retryable and not late:
                time.sleep(min(0.2 * 2**attempt, 2.0))
                continue
            logger.log(
                logging.DEBUG if late else logging.WARNING,
                "judge request failed after %d attempt(s): %s; scoring None",
                attempt + 1,
                e,
            )
            return None
    return None


@register("judge")
def judge_reward(
    base_url: str,
    model: str,
    rubric: str = DEFAULT_RUBRIC,
    max_score: float = 10.0,
    timeout_s: float = 30.0,
    retries: int = 2,
    concurrency: int = 8,
    api_key_env: str | None = "OPENAI_API_KEY",
    temperature: float = 0.0,
    max_tokens: int = 512,
) -> RewardFn:
    """Score each completion with an LLM judge (OpenAI-compatible chat endpoint), in [0, 1].

    `rubric` is the system prompt ({max_score} is filled in); the user message holds the question, the response and,
    when the row has an `answer` column, the reference answer. Up to `concurrency` requests run at once; each is
    retried `retries` times (with backoff) on connection errors, timeouts, 429 and 5xx. `timeout_s` is httpx's
    per-request (per-phase) timeout; the reward entry's own `timeout_s` bounds the whole call: requests are cut to the
    time left, and once it has passed none is sent or retried, so an abandoned call ends soon after it. Worst case of
    one call without that bound: ceil(rows / concurrency) x (retries + 1) x timeout_s plus backoff.
    """
    if concurrency < 1 or retries < 0 or timeout_s <= 0 or max_score <= 0:
        raise ValueError("judge needs concurrency >= 1, retries >= 0, timeout_s > 0 and max_score > 0")
    url = base_url.rstrip("/") + "/chat/completions"
    system = rubric.format(max_score=max_score) if "{max_score}" in rubric else rubric
    headers = {"Content-Type": "application/json"}
    key = os.environ.get(api_key_env) if api_key_env else None
    if key:
        headers["Authorization"] = f"Bearer {key}"

    def ask(client: httpx.Client, question: str, response: str, reference: Any, deadline: float | None) -> float | None:
        user = f"Question:\n{question}\n\nResponse:\n{response}"
        if reference is not None:
            user += f"\n\nReference answer:\n{reference}"
        body = {
            "model": model,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "temperature": temperature,
            "max_tokens": max_tokens,
        }
        reply = _chat(client, url, body, headers, retries, timeout_s, deadline)
        if reply is None:
            return None
        score = parse_score(reply, max_score)
        if score is None:
            logger.warning("judge reply has no valid 'SCORE: x' (0..%s): %r; scoring None", max_score, reply[-200:])
        return score

    def judge(prompts, completions, answer=None, **kwargs) -> list[float | None]:
        references = list(answer) if answer is not None else [None] * len(completions)
        deadline = call_deadline()  # read here: the pool's threads do not see this thread's context
        with httpx.Client(timeout=timeout_s) as client, ThreadPoolExecutor(max_workers=concurrency) as pool:
            return list(
                pool.map(
                    lambda args: ask(client, prompt_text(args[0]), completion_text(args[1]), args[2], deadline),
                    zip(prompts, completions, references, strict=True),
                )
            )

    return judge
