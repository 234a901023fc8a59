"""What an agent session may spend, and what it spent: rounds, API turns, tokens and dollars.

Cost is computed from each response's `usage` (input, output, cache write and cache read tokens)
with the price table below, the one place prices live. A session stops before the next API call
once any limit is reached; the call in flight can overshoot a limit by at most one response.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: float
    output: float
    cache_write: float  # 5-minute cache writes: the TTL of `cache_control: {"type": "ephemeral"}`
    cache_read: float  # cache hits and refreshes


# Source: https://platform.claude.com/docs/en/about-claude/pricing, table "Model pricing" (USD per MTok:
# base input, 5m cache writes, cache hits and refreshes, output), read 2026-11-30. Models the SDK
# knows but whose price that table did not show us are left out on purpose: an unpriced model is
# refused (price_of) rather than charged at a guess. Keys are model id prefixes:
# "claude-haiku-4-5-20251001" is priced as "claude-haiku-4-5". Requests stay in the standard context
# window, so long-context (> 200K input tokens) rates do not apply.
PRICES: dict[str, Price] = {
    "claude-opus-5": Price(5.00, 25.00, 6.25, 0.50),
    "claude-opus-4-8": Price(5.00, 25.00, 6.25, 0.50),
    "claude-opus-4-7": Price(5.00, 25.00, 6.25, 0.50),
    "claude-opus-4-6": Price(5.00, 25.00, 6.25, 0.50),
    "claude-opus-4-5": Price(5.00, 25.00, 6.25, 0.50),
    "claude-opus-4-1": Price(15.00, 75.00, 18.75, 1.50),
    "claude-opus-4": Price(15.00, 75.00, 18.75, 1.50),
    "claude-sonnet-4-6": Price(3.00, 15.00, 3.75, 0.30),
    "claude-sonnet-4-5": Price(3.00, 15.00, 3.75, 0.30),
    "claude-sonnet-4": Price(3.00, 15.00, 3.75, 0.30),
    "claude-haiku-4-5": Price(1.00, 5.00, 1.25, 0.10),
    "claude-3-5-haiku": Price(0.80, 4.00, 1.00, 0.08),
}


def price_of(model: str) -> Price:
    """The price of `model`: the longest key of PRICES that the model id starts with."""
    matches = [key for key in PRICES if model == key or model.startswith(key + "-")]
    if not matches:
        raise ValueError(
            f"no price for model {model!r} (needed for the money budget); known: {sorted(PRICES)}; "
            "add it to PRICES in harness/agents/budget.py, with its source"
        )
    return PRICES[max(matches, key=len)]


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_write_tokens: int = 0
    cache_read_tokens: int = 0

    @classmethod
    def from_api(cls, usage: Any) -> Usage:
        """From the SDK's `response.usage` (an object or a dict); absent cache fields count 0."""

        def get(name: str) -> int:
            value = usage.get(name) if isinstance(usage, dict) else getattr(usage, name, None)
            return int(value or 0)

        return cls(get("input_tokens"), get("output_tokens"), get("cache_creation_input_tokens"),
                   get("cache_read_input_tokens"))  # fmt: skip

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens + self.cache_write_tokens + self.cache_read_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(*(a + b for a, b in zip(asdict(self).values(), asdict(other).values(), strict=True)))

    def cost_usd(self, price: Price) -> float:
        fresh = self.input_tokens * price.input + self.output_tokens * price.output
        cached = self.cache_write_tokens * price.cache_write + self.cache_read_tokens * price.cache_read
        return (fresh + cached) / 1e6

    def to_dict(self) -> dict[str, int]:
        return {**asdict(self), "total": self.total}


@dataclass
class Budget:
    """The limits of one session and what it has used so far (not thread-safe: one conversation)."""

    rounds: int
    turns: int
    tokens: int
    usd: float
    price: Price | None = None  # None: no API calls (command and replay agents)
    rounds_used: int = 0
    turns_used: int = 0
    used: Usage = field(default_factory=Usage)
    spent_usd: float = 0.0

    def charge(self, usage: Usage) -> float:
        """Record one API response; returns its cost."""
        if self.price is None:
            raise ValueError("this budget has no price table entry: it cannot charge API usage")
        cost = usage.cost_usd(self.price)
        self.turns_used += 1
        self.used = self.used + usage
        self.spent_usd += cost
        return cost

    @property
    def rounds_left(self) -> int:
        return max(0, self.rounds - self.rounds_used)

    def exhausted(self) -> str | None:
        """Why the session must stop now (None: it may make another call)."""
        if self.rounds_used >= self.rounds:
            return f"round budget spent ({self.rounds_used} of {self.rounds} rounds)"
        if self.turns_used >= self.turns:
            return f"turn budget spent ({self.turns_used} of {self.turns} API calls)"
        if self.used.total >= self.tokens:
            return f"token budget spent ({self.used.total:,} of {self.tokens:,} tokens)"
        if self.spent_usd >= self.usd:
            return f"money budget spent (${self.spent_usd:.4f} of ${self.usd:.2f})"
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "limits": {"rounds": self.rounds, "turns": self.turns, "tokens": self.tokens, "usd": self.usd},
            "price_usd_per_mtok": asdict(self.price) if self.price else None,
            "rounds_used": self.rounds_used, "turns_used": self.turns_used, "usage": self.used.to_dict(),
            "spent_usd": round(self.spent_usd, 6),
        }  # fmt: skip
