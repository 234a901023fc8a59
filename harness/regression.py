"""Is a new timing slower than before? Pure functions of Timings, for `harness nightly` and `harness review`.

Against history (nightly: a promoted kernel re-timed on the same GPU model, new driver or libraries):

    center    = median of the historical p50s
    spread    = max(between-run spread: 1.4826 x the median absolute deviation of those p50s,
                    within-run spread: the median historical half band (p80 - p20) / 2)
    threshold = center + max(k x spread, min_pct % of center)
    regression  when the new p50 > threshold
    faster      when the new p50 < center - max(k x spread, min_pct % of center)
    steady      otherwise; no_history when fewer than `min_history` earlier measurements exist

The MAD is the between-run noise that survives a median (one bad night does not move it); the
half band is the noise inside one measurement, which a history of near-identical p50s would
otherwise hide (MAD 0 would make any 0.1% wobble a regression). The min_pct floor keeps a
regression a change worth a human's attention even when both spreads are tiny.

Within one run (review: a changed promoted kernel against the version it replaces, timed on the
same machine minutes apart): a regression needs the two p20..p80 bands apart (new p20 above the
old p80) AND the p50 slower by more than min_pct, the same two tests promotion uses for speedups.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from harness.records import Timing

MAD_TO_SIGMA = 1.4826  # a normal distribution's sigma / MAD
VERDICTS = ("regression", "faster", "steady", "no_history")


@dataclass(frozen=True)
class Thresholds:
    k: float = 3.0  # spreads a p50 may move before it counts
    min_pct: float = 5.0  # ... and never less than this percentage of the historical median
    min_history: int = 3  # earlier measurements needed before anything is judged
    window: int = 20  # the most recent measurements kept as history

    def __post_init__(self) -> None:
        problems = []
        if self.k < 0 or self.min_pct < 0:
            problems.append(f"k and min_pct must be >= 0; got k={self.k}, min_pct={self.min_pct}")
        if self.min_history < 1 or self.window < self.min_history:
            problems.append(f"need 1 <= min_history <= window; got min_history={self.min_history}, "
                            f"window={self.window}")  # fmt: skip
        if problems:
            raise ValueError("invalid regression thresholds: " + "; ".join(problems))


@dataclass(frozen=True)
class Comparison:
    """A new p50 against its history, with every figure that decided it."""

    verdict: str  # one of VERDICTS
    new_p50_us: float
    n_history: int
    center_us: float | None = None
    between_us: float | None = None
    within_us: float | None = None
    margin_us: float | None = None  # max(k x spread, min_pct % of center)
    threshold_us: float | None = None  # center + margin: slower than this is a regression
    change_pct: float | None = None  # (new - center) / center x 100
    reason: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}; got {self.verdict!r}")

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def compare_to_history(new: Timing, history: Sequence[Timing], thresholds: Thresholds = Thresholds()) -> Comparison:
    """`new` against the most recent `thresholds.window` timings of `history` (oldest first)."""
    recent = list(history)[-thresholds.window :]
    if len(recent) < thresholds.min_history:
        why = f"{len(recent)} earlier measurement(s); {thresholds.min_history} needed to judge"
        return Comparison("no_history", new.p50_us, len(recent), reason=why)
    p50s = [t.p50_us for t in recent]
    center = statistics.median(p50s)
    between = MAD_TO_SIGMA * statistics.median(abs(p - center) for p in p50s)
    within = statistics.median((t.p80_us - t.p20_us) / 2 for t in recent)
    margin = max(thresholds.k * max(between, within), thresholds.min_pct / 100 * center)
    change = (new.p50_us - center) / center * 100
    figures = dict(new_p50_us=new.p50_us, n_history=len(recent), center_us=center, between_us=between,
                   within_us=within, margin_us=margin, threshold_us=center + margin, change_pct=change)  # fmt: skip
    which = "between-run" if between >= within else "within-run"
    basis = (f"median {center:.2f} us of {len(recent)}, margin {margin:.2f} us = max({thresholds.k:g} x "
             f"{which} spread {max(between, within):.2f} us, {thresholds.min_pct:g}%)")  # fmt: skip
    if new.p50_us > center + margin:
        return Comparison("regression", **figures, reason=f"p50 {new.p50_us:.2f} us is {change:+.1f}% vs {basis}")
    if new.p50_us < center - margin:
        return Comparison("faster", **figures, reason=f"p50 {new.p50_us:.2f} us is {change:+.1f}% vs {basis}")
    return Comparison("steady", **figures, reason=f"p50 {new.p50_us:.2f} us within {basis}")


def compare_same_run(new: Timing, old: Timing, min_pct: float = Thresholds.min_pct) -> Comparison:
    """`new` against `old` timed in the same run: a regression needs disjoint bands AND > min_pct."""
    change = (new.p50_us - old.p50_us) / old.p50_us * 100
    figures = dict(new_p50_us=new.p50_us, n_history=1, center_us=old.p50_us, within_us=(old.p80_us - old.p20_us) / 2,
                   margin_us=min_pct / 100 * old.p50_us, threshold_us=old.p50_us * (1 + min_pct / 100),
                   change_pct=change)  # fmt: skip
    bands = f"p50 {new.p50_us:.2f} us ({new.p20_us:.2f}-{new.p80_us:.2f}) vs {old.p50_us:.2f} us " \
            f"({old.p20_us:.2f}-{old.p80_us:.2f}), {change:+.1f}%"  # fmt: skip
    if new.p20_us > old.p80_us and change > min_pct:
        return Comparison("regression", **figures, reason=f"slower beyond noise: {bands}")
    if new.p80_us < old.p20_us and change < -min_pct:
        return Comparison("faster", **figures, reason=f"faster beyond noise: {bands}")
    return Comparison("steady", **figures, reason=f"within noise or {min_pct:g}%: {bands}")
