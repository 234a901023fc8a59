"""The speedup chart of a report: PNG bytes from speedups and their noise bands (matplotlib, Agg).

One panel per baseline; shapes along x; one bar per implementation; the whisker spans the
pessimistic to the optimistic ratio of the two p20..p80 bands (baseline p20 / kernel p80 up to
baseline p80 / kernel p20), so a whisker that crosses 1.0 is a speedup within noise.
Uses matplotlib's object API (no pyplot state): safe in any process, no display needed.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

BAR_COLORS = ("#1f6feb", "#bf8700", "#8250df", "#1a7f37", "#cf222e", "#57606a")  # per implementation, in order


@dataclass(frozen=True)
class SpeedupPoint:
    implementation: str
    shape: str
    baseline: str
    speedup: float  # baseline p50 / implementation p50
    low: float  # baseline p20 / implementation p80
    high: float  # baseline p80 / implementation p20

    @classmethod
    def from_timings(cls, implementation: str, shape: str, baseline: str, kernel: dict[str, float],
                     base: dict[str, float]) -> SpeedupPoint:  # fmt: skip
        """From two {p20_us, p50_us, p80_us} dicts."""
        return cls(implementation, shape, baseline, base["p50_us"] / kernel["p50_us"],
                   base["p20_us"] / kernel["p80_us"], base["p80_us"] / kernel["p20_us"])  # fmt: skip


def speedup_chart(points: Sequence[SpeedupPoint], title: str) -> bytes:
    """A PNG (bytes) of `points`; raises ValueError when there is nothing to draw."""
    if not points:
        raise ValueError("a speedup chart needs at least one point")
    baselines = list(dict.fromkeys(p.baseline for p in points))
    shapes = list(dict.fromkeys(p.shape for p in points))
    impls = list(dict.fromkeys(p.implementation for p in points))
    by_key = {(p.baseline, p.shape, p.implementation): p for p in points}
    fig = Figure(figsize=(max(5.0, 1.1 * len(shapes) * max(1, len(impls)) ** 0.5 + 2.5), 2.6 * len(baselines)),
                 dpi=100, layout="constrained")  # fmt: skip
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(baselines), 1, squeeze=False)[:, 0]
    width = 0.8 / len(impls)
    for ax, baseline in zip(axes, baselines, strict=True):
        for j, impl in enumerate(impls):
            xs, ys, lo, hi = [], [], [], []
            for i, shape in enumerate(shapes):
                p = by_key.get((baseline, shape, impl))
                if p is None:
                    continue
                xs.append(i - 0.4 + width * (j + 0.5))
                ys.append(p.speedup)
                lo.append(max(0.0, p.speedup - p.low))
                hi.append(max(0.0, p.high - p.speedup))
            if xs:
                ax.bar(xs, ys, width * 0.92, yerr=[lo, hi], capsize=3, color=BAR_COLORS[j % len(BAR_COLORS)],
                       label=impl, ecolor="#24292f")  # fmt: skip
        ax.axhline(1.0, color="#cf222e", linewidth=1, linestyle="--")
        ax.set_xticks(range(len(shapes)), shapes, fontsize=8)
        ax.set_ylabel(f"speedup vs\n{baseline}", fontsize=9)
        ax.set_ylim(bottom=0)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_title(title, fontsize=10)
    axes[0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()
