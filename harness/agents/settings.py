"""`agent.*`: what proposes candidates during `harness run`, and within which limits.

One frozen dataclass for every kind; its defaults are the configuration (harness/conf/agent/<kind>.yaml
only picks the kind, and for `anthropic` the model). Checks that need the environment (an API key,
the variables named in `pass_env`, the transcript file) run when the agent starts
(harness/agents/loop.py `preflight`), before anything is written.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from harness.sandbox import cuda_devices_problem

KINDS = ("none", "anthropic", "command", "replay")
# What a command template may refer to (harness/agents/command_agent.py fills them in).
COMMAND_PLACEHOLDERS = ("prompt_file", "workdir", "candidate_path", "task", "round", "repo")


@dataclass(frozen=True)
class AgentSettings:
    kind: str = "none"  # none | anthropic | command | replay
    rounds: int = 8  # submissions at most (a round is one candidate submitted and evaluated)
    workers: int = 0  # evaluations at once; 0: automatic (len(gpus) when given; else 1 on a GPU; CPU: cores // 2)
    # GPUs to spread evaluations over, e.g. [0,1,2,3] (indices or GPU- UUIDs): one evaluation per GPU at a
    # time, its children seeing only that GPU (CUDA_VISIBLE_DEVICES). Empty: every evaluation inherits the
    # parent's GPUs.
    gpus: tuple[str, ...] = ()
    candidates_dir: str | None = None  # where submissions are written; default candidate_kernels/<task>/
    # anthropic: a tool-use conversation through the Messages API
    model: str = ""  # required for anthropic (the yaml names one); its price must be in budget.PRICES
    max_tokens: int = 16000  # per response
    budget_tokens: int = 4_000_000  # input + output + cache write + cache read tokens, all calls together
    budget_usd: float = 30.0  # cost of all calls, from their usage and budget.PRICES
    max_turns: int = 60  # API calls at most
    api_key_env: str = "ANTHROPIC_API_KEY"  # the variable holding the key
    base_url: str | None = None  # default: the SDK's (ANTHROPIC_BASE_URL, else the public API)
    retries: int = 6  # per call, on 429 / 529 / 5xx / connection errors; the SDK's own retries are off
    backoff_s: float = 2.0  # first backoff; doubles per retry (full jitter); retry-after wins when longer
    backoff_max_s: float = 120.0  # the longest wait; a retry-after beyond it stops the session
    request_timeout_s: float = 600.0  # one API request, then a retry
    read_max_chars: int = 30000  # read_file returns at most this much per call
    # command: any coding-agent CLI, once per round
    cmd: str = ""  # e.g. "mycli --prompt {prompt_file} --workdir {workdir} --out {candidate_path}"
    pass_env: tuple[str, ...] = ()  # variables passed to the command beyond the minimal environment
    time_limit_s: float = 1800.0  # per round; the command's process group is killed after it
    # replay: the submissions of a saved transcript, in order, verdicts recomputed
    transcript: str = ""  # results/<task>/agents/<run>.json

    def __post_init__(self) -> None:
        problems = []
        if self.kind not in KINDS:
            problems.append(f"agent kind {self.kind!r} unknown; known: {list(KINDS)}")
        for name in ("rounds", "max_tokens", "budget_tokens", "max_turns", "read_max_chars"):
            if getattr(self, name) < 1:
                problems.append(f"agent.{name} must be >= 1; got {getattr(self, name)}")
        if self.workers < 0 or self.retries < 0:
            problems.append(f"agent.workers and agent.retries must be >= 0; got {self.workers}, {self.retries}")
        for name in ("budget_usd", "backoff_s", "backoff_max_s", "request_timeout_s", "time_limit_s"):
            if not getattr(self, name) > 0:
                problems.append(f"agent.{name} must be > 0; got {getattr(self, name)}")
        bad_gpus = [g for g in self.gpus if cuda_devices_problem(g) or "," in str(g)]
        if bad_gpus or len(set(self.gpus)) != len(self.gpus):
            detail = f" (not one GPU each: {bad_gpus})" if bad_gpus else ""
            problems.append(f"agent.gpus must be distinct GPU indices (e.g. [0,1]) or GPU- UUIDs; got "
                            f"{list(self.gpus)}{detail}")  # fmt: skip
        bad_env = [v for v in self.pass_env if not (isinstance(v, str) and v.isidentifier())]
        if bad_env:
            problems.append(f"agent.pass_env must name environment variables; got {bad_env}")
        if self.cmd:
            unknown = sorted(set(template_fields(self.cmd)) - set(COMMAND_PLACEHOLDERS))
            if unknown:
                known = ["{" + p + "}" for p in COMMAND_PLACEHOLDERS]
                problems.append(f"agent.cmd refers to {unknown}; the placeholders are {known}")
        if problems:
            raise ValueError("invalid agent settings: " + "; ".join(problems))


def template_fields(template: str) -> list[str]:
    """The `{name}` fields of a command template (ValueError for a malformed one)."""
    try:
        return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as e:
        raise ValueError(f"invalid agent settings: agent.cmd {template!r} is not a valid template: {e}") from None
