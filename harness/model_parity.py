"""Whole-model parity: the optimized model against the reference over prefill chunks and greedy decode.

    ref = greedy_run(reference, chunks, steps=32)                       # free-running greedy decode
    opt = greedy_run(optimized, chunks, steps=32, use_graph=True, forced=ref.tokens)
    verdict = compare(ref, opt, strict=True)                             # numbers, then a verdict

A run prefills the prompt in chunks (the second chunk finds the first in the cache, its sliding
window ring part full, and wraps it), then decodes greedily. The optimized run is fed the
reference's tokens (teacher forcing), so every one of the 32 steps compares logits of the same
inputs; its own argmax at each step is recorded, and the greedy sequences are identical exactly
when the two argmaxes agree at every step.

What may differ, and the tolerances. Every promoted op keeps the reference's rounding points; what
may differ is the FP32 reduction order (1-ulp BF16 flips on a fraction of an op's elements) and
the accumulation order of BF16 GEMMs and library attention. Those perturbations do not stay small
in a randomly initialized Beam: measured on beam-tiny (tests/test_optimized_model.py), replacing
one op, attention, by an SDPA kernel that differs from it by 0.16% normwise (one ulp on 28% of its
outputs) moves the decode logits by 1-2.5% normwise per step. Hence:
  - LOGIT_REL_TOL = 2^-4 = 6.25%: the median over steps of the normwise logit error, about 3x the
    effect of one perturbed op. A wiring error (a wrong op, weight, packed split, stride, cache
    slot, position) moves every step's logits by O(1).
  - ROUTING_FLIP_TOL = 0.5: any single step. Routing is discontinuous: a perturbation near a
    selection boundary swaps an expert, which moved one step's logits by 22% in the same
    measurement, and is as admissible as the perturbation that caused it.
  - tokens: identical at every step (strict, the CPU test). On the GPU, where several ops differ
    and the vocabulary is 131072 wide (the top-2 gap of a random model's logits is then often
    below the noise), a step may differ only if it is a near tie: the reference's top-2 gap below
    NEAR_TIE x the RMS of its logits, or if it was rerouted: some MoE layer chose other experts
    than the reference did at that step. Both runs record every MoE layer's expert ids at every
    decode step (also inside the CUDA graph: the ids are copied into buffers the replays refill),
    so a rerouting is observed, not assumed. It stays admissible only while it looks like noise at
    a selection boundary: at most MAX_SWAPPED experts swapped in the first MoE layer that differs
    (the later layers then see another input, and may differ more: a consequence, not a cause),
    beyond one expert group traded for another, on at most MAX_REROUTED_FRACTION of the steps. Beam
    routes within its best `topk_groups` groups (a group's score: the sum of its best biased
    scores), so a near tie between two groups' scores trades every expert chosen from one group for
    experts of the other: one boundary, several experts (seen on the H100, beam-slice: 3 experts of
    the first MoE layer at one step, in two different sets of promoted kernels alike). Given the
    model's experts_per_group, the verdict names such trades (step: (group left, group taken))
    and counts only the swaps outside them. A wrong router or routing op reroutes nearly every
    step, and swaps most of the experts, across several groups. Such steps are listed in the
    verdict, never hidden. (Seen on the H200, beam-slice at 100K context: 4-7 of 32 greedy tokens
    differed with top-2 gaps of 0.12-0.28 x RMS on steps whose logits moved by 14-35%, the others
    by 1.2%.)

Shape legend: V vocabulary.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from reference_model.cache import KVCache
from reference_model.config import get_config
from reference_model.model import Beam

LOGIT_REL_TOL = 2.0**-4
ROUTING_FLIP_TOL = 0.5
NEAR_TIE = 0.1  # the largest per-token change of admissible noise: ~4.5 x RMS over 131072 tokens x 2%
MAX_SWAPPED = 2  # experts of one layer's top-k that a rerouting at a selection boundary may swap
MAX_REROUTED_FRACTION = 0.5  # of the decode steps


class RoutingRecorder:
    """Wraps an ops.moe_route: the expert ids of every MoE layer, step by step. Eager calls are
    copied to the host at once; calls under CUDA-graph capture are cloned into tensors of the
    graph's pool, which each replay refills: `take()` then reads those."""

    def __init__(self, route):
        self.route = route
        self._eager: list[torch.Tensor] = []
        self._captured: list[torch.Tensor] = []

    def __call__(self, *args, **kwargs):
        weights, ids = self.route(*args, **kwargs)
        if ids.is_cuda and torch.cuda.is_current_stream_capturing():
            self._captured.append(ids.clone())
        else:
            self._eager.append(ids.detach().cpu())
        return weights, ids

    def clear(self) -> None:
        self._eager.clear()

    def take(self) -> list[torch.Tensor]:
        """The ids [T, k] of each MoE layer in the step just run (eager), or in the last replay."""
        if self._captured:
            return [ids.cpu() for ids in self._captured]
        taken, self._eager = self._eager, []
        return taken


@dataclass(frozen=True)
class GreedyRun:
    """FP32 logits [V] after each prefill chunk and after each decode step; `tokens` the decode inputs
    (the argmax after the last chunk, then one per step), `argmax` the run's own argmax per step."""

    chunk_logits: list[torch.Tensor]
    step_logits: list[torch.Tensor]
    tokens: list[int]
    argmax: list[int]
    step_routes: list[list[torch.Tensor]]  # per decode step, per MoE layer: the expert ids [1, k]


def greedy_run(
    model: Beam,
    chunks: Sequence[Sequence[int]],
    steps: int,
    use_graph: bool = False,
    forced: Sequence[int] | None = None,
) -> GreedyRun:
    """Prefill `chunks` one after another into one sequence, then decode `steps` tokens: greedy, or
    the tokens `forced` (another run's `tokens`); with `use_graph` (CUDA) the decode step is
    captured once and replayed."""
    if forced is not None and len(forced) < steps:
        raise ValueError(f"forced tokens: need {steps}, got {len(forced)}")
    from harness.optimized_model import set_ops

    ops = model.ops
    recorder = RoutingRecorder(ops.moe_route)
    set_ops(model, dataclasses.replace(ops, moe_route=recorder))
    try:
        return _greedy_run(model, chunks, steps, use_graph, forced, recorder)
    finally:
        set_ops(model, ops)


def _greedy_run(model: Beam, chunks: Sequence[Sequence[int]], steps: int, use_graph: bool,
                forced: Sequence[int] | None, recorder: RoutingRecorder) -> GreedyRun:  # fmt: skip
    n_prompt = sum(len(c) for c in chunks)
    cache = KVCache(model.cfg, 1, n_prompt + steps + 1, model.device)
    chunk_logits = [model.prefill(cache, [list(c)])[0].float().cpu() for c in chunks]
    first = int(chunk_logits[-1].argmax()) if forced is None else int(forced[0])
    tokens_B = torch.tensor([first], device=model.device)
    tokens, argmax, step_logits = [first], [], []
    replay = None
    if use_graph:
        from harness.model_cmd import capture_decode_graph

        replay = capture_decode_graph(model, cache, tokens_B)
    recorder.clear()  # the prefill's and the warm-up's routing
    step_routes = []
    for i in range(steps):
        if replay is None:
            logits_V = model.decode(cache, tokens_B)[0]
        else:
            replay[0].replay()
            logits_V = replay[1][0]
        step_logits.append(logits_V.float().cpu())
        step_routes.append(recorder.take())
        argmax.append(int(step_logits[-1].argmax()))
        if i + 1 < steps:
            tokens.append(argmax[-1] if forced is None else int(forced[i + 1]))
            tokens_B.fill_(tokens[-1])
    return GreedyRun(chunk_logits, step_logits, tokens, argmax, step_routes)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in FP64."""
    return float((got.double() - want.double()).norm() / want.double().norm())


@dataclass(frozen=True)
class TokenMismatch:
    step: int
    reference: int
    optimized: int
    reference_gap_rel: float  # the reference's top-2 gap / the RMS of its logits
    near_tie: bool
    rerouted: bool  # some MoE layer chose other experts than the reference at this step


@dataclass(frozen=True)
class ParityVerdict:
    chunk_errors: list[float]
    step_errors: list[float]
    mismatches: list[TokenMismatch]
    strict: bool
    reroutings: dict[int, dict[int, int]]  # step -> {MoE layer (0-based among MoE layers): experts swapped}
    # step -> experts swapped in its first rerouted layer outside a traded group (all of them where none was)
    untraded: dict[int, int] = dataclasses.field(default_factory=dict)
    group_trades: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)  # step -> (left, taken)

    @property
    def median_error(self) -> float:
        return statistics.median(self.step_errors + self.chunk_errors)

    @property
    def max_error(self) -> float:
        return max(self.chunk_errors + self.step_errors)

    @property
    def problems(self) -> list[str]:
        out = []
        if not self.median_error <= LOGIT_REL_TOL:
            out.append(f"median logit error {self.median_error:.3g} > {LOGIT_REL_TOL:.3g}")
        if not self.max_error <= ROUTING_FLIP_TOL:
            out.append(f"max logit error {self.max_error:.3g} > {ROUTING_FLIP_TOL}")
        n_steps = len(self.step_errors)
        if len(self.reroutings) > MAX_REROUTED_FRACTION * n_steps:
            out.append(f"rerouted at {len(self.reroutings)} of {n_steps} steps (at most "
                       f"{MAX_REROUTED_FRACTION:g} of them): not noise at a selection boundary")  # fmt: skip
        wide = {step: layers for step, layers in self.reroutings.items()
                if self.untraded.get(step, layers[min(layers)]) > MAX_SWAPPED}  # fmt: skip
        if wide:
            out.append(f"more than {MAX_SWAPPED} experts swapped in the first rerouted layer at steps {wide}"
                       + (" (outside any one group traded for another)" if self.untraded else ""))  # fmt: skip
        for m in self.mismatches:
            if self.strict or not (m.near_tie or m.rerouted):
                out.append(f"step {m.step}: greedy token {m.optimized}, reference {m.reference} "
                           f"(reference top-2 gap {m.reference_gap_rel:.3g} x RMS)")  # fmt: skip
        return out

    @property
    def passed(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        ties = [m.step for m in self.mismatches if m.near_tie]
        rerouted = [m.step for m in self.mismatches if m.rerouted]
        return (
            f"logits normwise error: median {self.median_error:.3g} (<= {LOGIT_REL_TOL:.3g}), max {self.max_error:.3g} "
            f"(<= {ROUTING_FLIP_TOL}); chunks {[f'{e:.2g}' for e in self.chunk_errors]}; steps "
            f"{[f'{e:.2g}' for e in self.step_errors]}; rerouted steps (step: {{MoE layer: experts swapped}}) "
            f"{self.reroutings}; "
            + (
                f"one group traded in the first rerouted layer (step: (left, taken)) {self.group_trades}; "
                if self.group_trades
                else ""
            )
            + f"greedy tokens differ at {len(self.mismatches)} of {len(self.step_errors)} steps "
            f"({len(ties)} near ties: {ties}; {len(rerouted)} rerouted: {rerouted}); "
            + ("PASSED" if self.passed else "FAILED: " + "; ".join(self.problems))
        )


def compare(
    reference: GreedyRun, optimized: GreedyRun, strict: bool = True, experts_per_group: int | None = None
) -> ParityVerdict:
    """Per-chunk and per-step logit errors of `optimized` (fed the reference's tokens) against
    `reference`, and the steps where their greedy choices differ. With `experts_per_group` (the
    model's), a rerouting that trades one expert group for another counts only its swaps outside
    the two groups (module docstring)."""
    if optimized.tokens != reference.tokens:
        raise ValueError("the optimized run must be fed the reference's tokens (greedy_run(..., forced=ref.tokens))")
    reroutings, untraded, trades = {}, {}, {}
    for step, (want, got) in enumerate(zip(reference.step_routes, optimized.step_routes, strict=True)):
        if len(want) != len(got):
            raise ValueError(f"step {step}: {len(got)} MoE layers routed in the optimized run, {len(want)} in the "
                             "reference")  # fmt: skip
        swapped = {layer: _swapped(w, g) for layer, (w, g) in enumerate(zip(want, got, strict=True))}
        if any(swapped.values()):
            reroutings[step] = {layer: n for layer, n in swapped.items() if n}
            first = min(reroutings[step])
            if experts_per_group is not None:
                untraded[step], trade = _beyond_a_group_trade(want[first], got[first], experts_per_group)
                if trade is not None:
                    trades[step] = trade
    mismatches = []
    for step, (want, got) in enumerate(zip(reference.argmax, optimized.argmax, strict=True)):
        if want != got:
            logits = reference.step_logits[step].double()
            top2 = logits.topk(2).values
            gap_rel = float((top2[0] - top2[1]) / logits.pow(2).mean().sqrt())
            mismatches.append(TokenMismatch(step, want, got, gap_rel, gap_rel < NEAR_TIE, step in reroutings))
    return ParityVerdict(
        chunk_errors=[
            relative_error(o, r) for o, r in zip(optimized.chunk_logits, reference.chunk_logits, strict=True)
        ],
        step_errors=[relative_error(o, r) for o, r in zip(optimized.step_logits, reference.step_logits, strict=True)],
        mismatches=mismatches,
        strict=strict,
        reroutings=reroutings,
        untraded=untraded,
        group_trades=trades,
    )


def _swapped(want_Tk: torch.Tensor, got_Tk: torch.Tensor) -> int:
    """The most experts any token of a layer chose that the reference did not (0: same selection)."""
    return max(len(set(w.tolist()) - set(g.tolist())) for w, g in zip(want_Tk, got_Tk, strict=True))


def _beyond_a_group_trade(
    want_Tk: torch.Tensor, got_Tk: torch.Tensor, per_group: int
) -> tuple[int, tuple[int, int] | None]:
    """(experts swapped outside a traded group, the trade (group left, group taken) or None), for the
    token of the layer with the most such swaps (then the most swaps). A trade: the reference chose from
    exactly one group the optimized run chose none of, and the optimized run from exactly one group the
    reference chose none of; the experts lost from the first and gained from the second are its own."""
    tokens = []
    for w, g in zip(want_Tk.tolist(), got_Tk.tolist(), strict=True):
        lost, gained = set(w) - set(g), set(g) - set(w)
        left = {e // per_group for e in w} - {e // per_group for e in g}
        taken = {e // per_group for e in g} - {e // per_group for e in w}
        if len(left) == 1 and len(taken) == 1:
            outside = max(len([e for e in lost if e // per_group not in left]),
                          len([e for e in gained if e // per_group not in taken]))  # fmt: skip
            tokens.append((outside, len(lost), (min(left), min(taken))))
        else:
            tokens.append((len(lost), len(lost), None))
    outside, _, trade = max(tokens, key=lambda t: t[:2])
    return outside, trade


def optimized_cpu_run(
    preset: str, mapping: Mapping[str, str], chunks: Sequence[Sequence[int]], steps: int, seed: int, forced: list[int]
) -> GreedyRun:
    """A teacher-forced run of the optimized model built from an explicit task -> candidate mapping,
    on the CPU through the Triton interpreter. Safe as the entry of a fresh (spawned) process: it
    sets TRITON_INTERPRET before any candidate is imported, and uses one thread (runs go in parallel)."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    torch.set_num_threads(1)
    from harness import optimized_model

    cfg = get_config(preset)
    built = optimized_model.build_ops(optimized_model.explicit_choices(mapping), cfg, "cpu")
    return greedy_run(optimized_model.optimized_model(cfg, built, "cpu", seed), chunks, steps, forced=forced)
