"""What a task declares: the reference op, inputs, shapes, parity policy and the minimum cost.

A task file (`tasks/<name>.py`) builds one `Task`. The harness reads nothing else about a task.
Tasks import `reference_model` only; the harness imports tasks, never the other way round.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch


@dataclass(frozen=True)
class Shape:
    """One problem size. `params` holds every dimension the input generator and cost formula read
    (e.g. {"T": 1, "D": 5120}) plus task-specific switches (e.g. {"variant": "global"})."""

    label: str
    params: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        try:
            return self.params[key]
        except KeyError:
            raise KeyError(f"shape {self.label!r} has no parameter {key!r}; it has {sorted(self.params)}") from None

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, **dict(self.params)}


@dataclass(frozen=True)
class Cost:
    """The least work one call must do: each input read once, each output written once."""

    bytes: int
    flops: int = 0


@dataclass(frozen=True)
class OutputCheck:
    """How one output (a returned tensor, or an input the op writes in place) is judged.

    kind:
      "bf16"       BF16 tensor. With `bit_exact`, compared bit for bit with the reference: only
                   differences of exactly 1 ulp are tolerated, on at most `max_ulp_fraction` of
                   the elements (FP32 reductions in another order). Without it (GEMMs, whose
                   accumulation order is the library's choice), only the FP64 check applies.
                   Always: error against FP64 at most (1 + fp64_margin) x the reference's own.
      "fp32"       FP32 tensor: max relative error against FP64 (normwise) at most `rel_tol`, and
                   no worse than (1 + fp64_margin) x the reference's own.
      "index_set"  integer ids per row, compared as sets (order within a row is free); must be
                   identical to the reference's.
    `paired_with` names an index_set output whose row order this output follows (routing weights
    follow their ids), so both are compared after sorting each row by id.
    """

    name: str
    kind: Literal["bf16", "fp32", "index_set"]
    bit_exact: bool = True
    max_ulp_fraction: float = 0.01
    fp64_margin: float = 0.05
    rel_tol: float | None = None
    paired_with: str | None = None


@dataclass(frozen=True)
class Goal:
    """A target for the task's candidates on the GPU, in the harness's own benchmark and parity check.

    At most one time bar: `max_us`, a candidate's p50 at most this many microseconds; or
    `not_slower_than`, a baseline's name ("torch_compile", "reference" or one of the task's
    `baselines`): a candidate's p50 at most that baseline's p50 as promotion judges it (timed beside
    it in the candidate's own benchmark child, or faster elsewhere in the run: harness/promote.py
    bars). `shapes`: the GPU shape labels it applies to; empty means every GPU shape.
    `max_launches`, with a time bar: also at most this many GPU operations per call (kernels, memsets,
    memcpys: the nodes of a CUDA graph of one call, harness/bench.py launches_per_call); issue 4's
    "one kernel" is 1. A record without that count meets no such goal.
    `bit_exact`, with a time bar or alone: also no element of the task's bit-exact BF16 outputs off the
    reference the record's parity judged it against (issue 4's "bit-exact with the reference at T <= 64";
    BEAM.md section 5: the reference's rounding points, its FP32 reductions in the order written or exact,
    harness/parity.py), where the parity check tolerates 1-ulp flips on a small fraction of the elements.
    A record without the count of elements off meets no such goal.
    `source` says who set it (the issue), so that a reader can trace the number.
    `gpu`: the GPU the bar was set on, as part of the device name a record's environment gives ("H200");
    a time from another GPU (an H100's 236 us where the H200 takes 171) neither meets nor misses it.
    None: any GPU's records judge it.
    Judged against the records by harness/goals.py; promotion does not read goals.
    """

    max_us: float | None = None
    not_slower_than: str | None = None
    shapes: tuple[str, ...] = ()
    max_launches: int | None = None
    bit_exact: bool = False
    source: str = ""
    gpu: str | None = None

    def __post_init__(self) -> None:
        if self.max_us is not None and self.not_slower_than is not None:
            raise ValueError(
                f"a goal takes at most one time bar, max_us or not_slower_than; got max_us={self.max_us!r}, "
                f"not_slower_than={self.not_slower_than!r}"
            )
        if not isinstance(self.bit_exact, bool):
            raise ValueError(f"a goal's bit_exact must be True or False; got {self.bit_exact!r}")
        if not self.timed and not self.bit_exact:
            raise ValueError("a goal needs a bar: max_us or not_slower_than (a time), or bit_exact=True; got none")
        if self.max_us is not None and (
            isinstance(self.max_us, bool)
            or not isinstance(self.max_us, int | float)
            or not 0 < self.max_us < float("inf")
        ):
            raise ValueError(f"a goal's max_us must be a positive number of microseconds; got {self.max_us!r}")
        if isinstance(self.shapes, str):
            raise ValueError(f"a goal's shapes must be a tuple of shape labels; got the string {self.shapes!r}")
        launches = self.max_launches
        if launches is not None and (isinstance(launches, bool) or not isinstance(launches, int) or launches < 1):
            raise ValueError(f"a goal's max_launches must be a whole number >= 1; got {launches!r}")
        if launches is not None and not self.timed:
            raise ValueError(f"a goal's max_launches goes with a time bar, max_us or not_slower_than; got "
                             f"max_launches={launches!r} alone")  # fmt: skip
        if self.gpu is not None and not (isinstance(self.gpu, str) and self.gpu.strip()):
            raise ValueError(f"a goal's gpu must be part of a device name, such as 'H200', or None; got {self.gpu!r}")

    def judges_on(self, device_name: str) -> bool:
        """Whether a time measured on `device_name` (torch.cuda.get_device_name) stands against this goal."""
        return self.gpu is None or self.gpu.lower() in device_name.lower()

    @property
    def timed(self) -> bool:
        """Whether the goal has a time bar (max_us or not_slower_than)."""
        return self.max_us is not None or self.not_slower_than is not None

    @property
    def bar(self) -> str:
        """'p50 <= 2.3 us', 'not slower than torch_compile', 'p50 <= 2.8 us in one launch', 'bit-exact',
        'p50 <= 2.3 us, bit-exact': the bar as tables print it."""
        if not self.timed:
            return "bit-exact"
        bar = f"p50 <= {self.max_us:g} us" if self.max_us is not None else f"not slower than {self.not_slower_than}"
        if self.max_launches is not None:
            bar += " in one launch" if self.max_launches == 1 else f" in <= {self.max_launches} launches"
        return bar + (", bit-exact" if self.bit_exact else "")


@dataclass(frozen=True)
class Task:
    """One optimization target.

    reference: the op from reference_model/ops.py; a candidate's launcher has its name and signature.
    make_inputs(shape, seed, device) -> keyword arguments of the reference. Realistic values,
        fully determined by (shape, seed).
    outputs: one OutputCheck per returned tensor (in return order), then one per input in `mutated`.
    mutated: names of inputs the op writes in place (a KV cache); every other input must come
        back untouched.
    shapes: the GPU shapes (from the `beam` preset, plus odd sizes); cpu_shapes: the small subset
        run through the Triton interpreter.
    cost(shape): the floor's numerator.
    baselines: name -> factory returning a callable with the reference's signature (library
        kernels a user could use instead). A factory raises `BaselineUnavailable` when its library
        is missing or refuses the shape. `torch.compile` of the reference is always added by the
        harness and is not listed here.
    goals: the targets its candidates are held to on the GPU (Goal: time, launches, bit-exactness); reported,
        never used to promote.
    """

    name: str
    reference: Callable[..., Any]
    make_inputs: Callable[[Shape, int, torch.device], dict[str, Any]]
    outputs: tuple[OutputCheck, ...]
    shapes: tuple[Shape, ...]
    cpu_shapes: tuple[Shape, ...]
    cost: Callable[[Shape], Cost]
    description: str
    mutated: tuple[str, ...] = ()
    baselines: Mapping[str, Callable[[], Callable[..., Any]]] = field(default_factory=dict)
    goals: tuple[Goal, ...] = ()

    def __post_init__(self) -> None:
        labels = [s.label for s in self.shapes]
        peers = ["reference", "torch_compile", *self.baselines]
        for goal in self.goals:
            unknown = [s for s in goal.shapes if s not in labels]
            if unknown:
                raise ValueError(f"task {self.name!r}: goal {goal.bar!r} names shapes {unknown} that are not among its "
                                 f"GPU shapes {labels}")  # fmt: skip
            if goal.not_slower_than is not None and goal.not_slower_than not in peers:
                raise ValueError(f"task {self.name!r}: goal {goal.bar!r} names no baseline of the task; expected one "
                                 f"of {peers}")  # fmt: skip
            if goal.bit_exact and not self.exact_outputs:
                raise ValueError(f"task {self.name!r}: goal {goal.bar!r} asks for bit-exactness, but none of its "
                                 f"outputs {[c.name for c in self.outputs]} is a bit-exact BF16 output")  # fmt: skip

    @property
    def exact_outputs(self) -> tuple[str, ...]:
        """The outputs parity compares bit for bit (BF16 `bit_exact`): what a bit-exact goal counts."""
        return tuple(c.name for c in self.outputs if c.kind == "bf16" and c.bit_exact)

    def goal_shapes(self, goal: Goal) -> tuple[str, ...]:
        """The GPU shape labels `goal` applies to, in the task's shape order."""
        return tuple(s.label for s in self.shapes if not goal.shapes or s.label in goal.shapes)

    @property
    def op_name(self) -> str:
        """The launcher name a candidate must export: the reference function's own name."""
        return self.reference.__name__

    def shapes_for(self, device: torch.device | str) -> tuple[Shape, ...]:
        return self.shapes if torch.device(device).type == "cuda" else self.cpu_shapes

    def shape(self, label: str, device: torch.device | str) -> Shape:
        shapes = self.shapes_for(device)
        for s in shapes:
            if s.label == label:
                return s
        raise ValueError(f"task {self.name!r} has no shape {label!r} on {device}; known: {[s.label for s in shapes]}")


class BaselineUnavailable(RuntimeError):
    """A library baseline cannot run here (library absent, GPU absent, shape refused)."""
