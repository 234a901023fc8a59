"""agent=anthropic: a tool-use conversation with Claude through the Messages API.

    harness run task=fuse_norm agent=anthropic agent.model=claude-opus-4-5 agent.rounds=8

The first user message is the task statement (harness/agents/prompt.py); the model answers with
tool calls (harness/agents/tools.py), the harness answers each with a tool_result (a verdict for a
submission), until the model stops calling tools or a budget is spent (rounds, API calls, tokens,
dollars: harness/agents/budget.py).

Prompt caching: cache_control marks the tool definitions, the system prompt and the task statement
(stable for the whole session), and the newest tool results (so each turn pays full price only for
what is new): four breakpoints, the API's maximum.

Retries: the SDK's own retries are off (max_retries=0), so this module's policy is the one that runs
and is logged. Rate limits (429), overload (529), other 5xx, 408 and connection errors are retried
`agent.retries` times with exponential backoff and full jitter (uniform in [0, backoff_s * 2^n],
capped at backoff_max_s); a retry-after header is honoured (the wait is at least what it asks). Every
retry is written to the transcript with its status, wait and reason.
"""

from __future__ import annotations

import copy
import email.utils
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.agents import prompt as prompt_module
from harness.agents.budget import PRICES, Usage, price_of
from harness.agents.loop import AgentError, Session
from harness.agents.prompt import AgentPrompt
from harness.agents.tools import ToolBox
from harness.environment import REPO_ROOT
from harness.records import now_utc
from tasks.task import Task

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504, 529})
EPHEMERAL = {"type": "ephemeral"}


@dataclass(frozen=True)
class Prepared:
    model: str
    priced: bool
    api_key: str  # never written anywhere
    prompt: AgentPrompt


def preflight(task: Task, settings: Any) -> Prepared:
    agent = settings.agent
    if not agent.model:
        raise ValueError(f"agent=anthropic needs agent.model=<model id>; priced models: {sorted(PRICES)}")
    price_of(agent.model)  # ValueError naming the priced models
    key = os.environ.get(agent.api_key_env, "")
    if not key.strip():
        raise ValueError(
            f"agent=anthropic needs an API key in ${agent.api_key_env}, which is not set; nothing was run or "
            f"written (export {agent.api_key_env}=..., or name another variable with agent.api_key_env=<VAR>)"
        )
    try:
        import anthropic  # noqa: F401  (imported lazily: the GPU machine has no anthropic package)
    except ImportError as e:
        raise ValueError(f"agent=anthropic needs the `anthropic` package, which does not import here: {e}") from e
    return Prepared(agent.model, True, key, prompt_module.build(task, settings, agent, "anthropic"))


# ---- retries -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RetryPolicy:
    retries: int
    backoff_s: float
    backoff_max_s: float

    def delay(self, attempt: int, retry_after_s: float | None, rng: random.Random) -> float:
        """The wait before retry `attempt` + 1 (attempt counts from 0)."""
        jittered = rng.uniform(0.0, min(self.backoff_max_s, self.backoff_s * 2**attempt))
        if retry_after_s is None:
            return jittered
        if retry_after_s > self.backoff_max_s:
            raise AgentError(f"the API asked to wait {retry_after_s:g} s (retry-after), longer than "
                             f"agent.backoff_max_s={self.backoff_max_s:g}: stopping instead")  # fmt: skip
        return max(retry_after_s, jittered)


def retry_after_s(headers: Any) -> float | None:
    """Seconds from `retry-after-ms` or `retry-after` (seconds or an HTTP date); None when absent."""
    if headers is None:
        return None
    value = headers.get("retry-after-ms")
    if value is not None:
        try:
            return max(0.0, float(value) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time())


def create_with_retries(client: Any, request: dict[str, Any], policy: RetryPolicy, rng: random.Random,
                        sleep: Callable[[float], None], log: list[dict[str, Any]],
                        echo: Callable[[str], None]) -> Any:  # fmt: skip
    import anthropic

    for attempt in range(policy.retries + 1):
        try:
            return client.messages.create(**request)
        except anthropic.APIStatusError as e:
            status, headers, message = e.status_code, e.response.headers, str(e)
            if status not in RETRYABLE_STATUS:
                raise AgentError(f"the Messages API refused the request ({status}): {message[:500]}") from e
        except anthropic.APIConnectionError as e:  # timeouts included
            status, headers, message = None, None, f"{type(e).__name__}: {e}"
        what = f"HTTP {status}" if status is not None else "connection error"
        if attempt == policy.retries:
            raise AgentError(f"the Messages API failed {policy.retries + 1} times; last: {what}: {message[:500]}")
        after = retry_after_s(headers)
        wait = policy.delay(attempt, after, rng)
        log.append({"attempt": attempt + 1, "status": status, "error": message[:300], "retry_after_s": after,
                    "delay_s": round(wait, 3), "at_utc": now_utc()})  # fmt: skip
        echo(f"[agent] {what} ({message[:100]}); retry {attempt + 1} of {policy.retries} in {wait:.1f} s")
        sleep(wait)
    raise AssertionError("unreachable")


# ---- the conversation --------------------------------------------------------------------------------
def build_request(prompt: AgentPrompt, messages: list[dict[str, Any]], model: str, max_tokens: int) -> dict[str, Any]:
    """The API request, with cache_control on the stable part and on the newest turn."""
    tools = [dict(t) for t in prompt.tools]
    tools[-1]["cache_control"] = EPHEMERAL
    sent = copy.deepcopy(messages)
    sent[0]["content"][0]["cache_control"] = EPHEMERAL  # the task statement
    if len(sent) > 1 and sent[-1]["role"] == "user":
        sent[-1]["content"][-1]["cache_control"] = EPHEMERAL  # everything up to the newest tool results
    return {"model": model, "max_tokens": max_tokens, "tools": tools, "messages": sent,
            "system": [{"type": "text", "text": prompt.system, "cache_control": EPHEMERAL}]}  # fmt: skip


def run(session: Session, prepared: Prepared, sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None, repo_root=REPO_ROOT, **_: Any) -> str:  # fmt: skip
    """The conversation; returns why it stopped (AgentError when the API gives up)."""
    import anthropic

    agent = session.agent
    client = anthropic.Anthropic(api_key=prepared.api_key, base_url=agent.base_url, max_retries=0,
                                 timeout=agent.request_timeout_s)  # fmt: skip
    policy = RetryPolicy(agent.retries, agent.backoff_s, agent.backoff_max_s)
    rng = rng or random.Random()
    toolbox = ToolBox(session, repo_root)
    record = session.record
    record["prompt"] = prepared.prompt.to_dict()
    messages: list[dict[str, Any]] = record["messages"]  # the conversation, without cache markers
    messages.append({"role": "user", "content": [{"type": "text", "text": prepared.prompt.statement}]})
    session.save()
    while True:
        stop = session.budget.exhausted()
        if stop is not None:
            return stop
        turn, retries, started = session.budget.turns_used + 1, [], time.monotonic()
        request = build_request(prepared.prompt, messages, agent.model, agent.max_tokens)
        try:
            response = create_with_retries(client, request, policy, rng, sleep, retries, session.echo)
        except AgentError as e:
            record["api_calls"].append({"turn": turn, "error": str(e), "retries": retries, "at_utc": now_utc()})
            raise
        usage = Usage.from_api(response.usage)
        cost = session.budget.charge(usage)
        content = [block.model_dump(mode="json", exclude_none=True) for block in response.content]
        messages.append({"role": "assistant", "content": content})
        record["api_calls"].append({
            "turn": turn, "id": response.id, "model": response.model, "stop_reason": response.stop_reason,
            "usage": usage.to_dict(), "cost_usd": round(cost, 6), "retries": retries,
            "duration_s": round(time.monotonic() - started, 3), "at_utc": now_utc(),
        })  # fmt: skip
        total = session.budget.spent_usd
        session.echo(f"[agent] turn {turn}: {response.stop_reason}, {usage.total:,} tokens "
                     f"({usage.cache_read_tokens:,} cached), ${cost:.4f}; total ${total:.4f}")  # fmt: skip
        session.save()
        calls = [block for block in content if block.get("type") == "tool_use"]
        if not calls:
            return f"the model ended the conversation (stop_reason {response.stop_reason})"
        messages.append({"role": "user", "content": toolbox.run_all(calls)})
        session.save()
