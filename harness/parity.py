"""Parity: a candidate's outputs against the reference op and an FP64 evaluation. Numbers, then a verdict.

Runs in the parent process only, on outputs a child saved: the parent regenerates the inputs from
the seed, runs the reference (`admissible_references`) and the FP64 evaluation (`fp64_evaluation`),
and compares (`Expected`: one per inputs, for every implementation's outputs). Nothing here runs candidate code.

The checks per output (tasks/task.py OutputCheck), in order: type, shape, dtype, finiteness, then
values. BF16 `bit_exact`: equal bit for bit except differences of exactly 1 ulp on at most
`max_ulp_fraction` of the elements (FP32 reductions in another order); always: normwise relative
error against FP64 at most (1 + fp64_margin) x the reference's own. FP32: that error at most
`rel_tol` as well. index_set: rows equal as sets; `paired_with` outputs compared after sorting
each row by its ids.

Policies (one per device):
  gpu          the reference as written (round to nearest even at every rounding point), and the
               same with exact FP32 reductions (ExactReductions): the contract leaves their order free.
  interpreter  the same bounds, against a wider set of admissible references. The Triton
               interpreter's own fp32 -> bf16 cast truncates (TOOLCHAIN.md); harness/
               interpreter_patches.py makes it round to nearest like the GPU, and the child applies
               it, so with the patch present the reference as written is the only admissible one
               and the remaining interpreter differences (numpy's FP32 sums and rsqrt against
               torch's) are the reduction-order flips the 1-ulp budget is for.
               Without the patch, a correct kernel differs from torch by an ulp on about half the
               elements at each rounding point, and by more after a chain of them (a truncated h'
               feeds the next norm). Loosening the tolerance to "a few ulps anywhere" would also
               pass a kernel that skips a rounding point, the bug this gate exists for. Instead the
               reference is evaluated again with its casts truncated (`RoundingEmulation`): with
               every assignment of {nearest, truncate} to the op's first MAX_ENUMERATED_ROUNDINGS
               rounding points in call order (a launcher may round some points in torch and others
               in Triton), else all-nearest and all-truncate; the candidate must pass the unchanged
               policy against one of them. The FP64 margin is then taken against that reference's
               own FP64 error, which is the honest widening: truncation's error is uniform on
               [0, 1) ulp against nearest's [-1/2, 1/2), an RMS ratio of sqrt((1/3) / (1/12)) = 2,
               so a truncating reference's own error is about 2x the nearest one's (1.4-2x after
               chained rounding points; both are recorded per output).
Small outputs: "at most fraction f of n elements" allows max(1, floor(f * n)) elements, so that a
tiny CPU shape (n = 288) can still carry the one reduction-order flip that 5120 elements would.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from tasks.task import OutputCheck, Task

LOW_PRECISION_FLOATS = (torch.bfloat16, torch.float16, torch.float32)
MAX_ENUMERATED_ROUNDINGS = 4  # 2^4 = 16 reference evaluations per (shape, seed) on CPU shapes
FIRST_INDICES = 5  # how many mismatch positions a report lists
ULP_BUCKETS = ((0, 0), (1, 1), (2, 2), (3, 4), (5, 16), (17, 256), (257, None))
_CONVERSION_METHODS = {
    torch.Tensor.to,
    torch.Tensor.float,
    torch.Tensor.bfloat16,
    torch.Tensor.half,
    torch.Tensor.type,
}


def _bucket_label(lo: int, hi: int | None) -> str:
    return f">{lo - 1}" if hi is None else (str(lo) if lo == hi else f"{lo}-{hi}")


# ---- the references ----------------------------------------------------------------------------
def _map_dtypes(args: tuple, kwargs: dict, mapping: Callable[[torch.dtype], torch.dtype]) -> tuple[tuple, dict]:
    args = tuple(mapping(a) if isinstance(a, torch.dtype) else a for a in args)
    kwargs = {k: mapping(v) if isinstance(v, torch.dtype) else v for k, v in kwargs.items()}
    return args, kwargs


class Float64Mode(TorchFunctionMode):
    """Every conversion to BF16/FP16/FP32 (`.to`, `.float()`, `.bfloat16()`, `dtype=`, `out_dtype=`)
    becomes float64: run inside it with float64 inputs, an op's rounding points disappear."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.float, torch.Tensor.bfloat16, torch.Tensor.half):
            return args[0].to(torch.float64)
        args, kwargs = _map_dtypes(args, kwargs, lambda d: torch.float64 if d in LOW_PRECISION_FLOATS else d)
        if kwargs.get("out_dtype") is torch.float64:
            kwargs.pop("out_dtype")  # the inputs are float64 already
        return func(*args, **kwargs)


def _truncate_to_bf16(x: torch.Tensor) -> torch.Tensor:
    """FP32 -> BF16 by dropping the low 16 bits (what the Triton interpreter's cast does); NaN stays NaN."""
    x32 = x.float()
    truncated = (x32.view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)  # exact: low bits are 0
    return torch.where(torch.isnan(x32), x32.to(torch.bfloat16), truncated)


def _converts_to_bf16(func, args, kwargs) -> bool:
    if func is torch.Tensor.bfloat16:
        return True
    if func in (torch.Tensor.to, torch.Tensor.type):
        return kwargs.get("dtype") is torch.bfloat16 or any(a is torch.bfloat16 for a in args[1:])
    return False


class RoundingEmulation(TorchFunctionMode):
    """Counts an op's FP32 -> BF16 roundings in call order; rounding i truncates when truncate(i)."""

    def __init__(self, truncate: Callable[[int], bool]):
        super().__init__()
        self.truncate = truncate
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _CONVERSION_METHODS and _converts_to_bf16(func, args, kwargs) and args[0].dtype == torch.float32:
            i, self.count = self.count, self.count + 1
            if self.truncate(i):
                return _truncate_to_bf16(args[0])
        return func(*args, **kwargs)


def clone_inputs(inputs: dict[str, Any], dtype: torch.dtype | None = None) -> dict[str, Any]:
    """Fresh copies of the tensor inputs (floating ones converted to `dtype` when given)."""
    out = {}
    for k, v in inputs.items():
        if isinstance(v, torch.Tensor):
            v = v.to(dtype) if dtype is not None and v.is_floating_point() else v.clone()
        out[k] = v
    return out


def output_tensors(task: Task, returned: Any, inputs: dict[str, Any]) -> list[torch.Tensor]:
    """The op's outputs in OutputCheck order: the returned tensors, then the mutated inputs."""
    if returned is None:
        returned = ()
    elif isinstance(returned, torch.Tensor):
        returned = (returned,)
    return [*returned, *(inputs[name] for name in task.mutated)]


def run_reference(task: Task, inputs: dict[str, Any], mode: TorchFunctionMode | None = None) -> list[torch.Tensor]:
    fresh = clone_inputs(inputs)
    if mode is None:
        return output_tensors(task, task.reference(**fresh), fresh)
    with mode:
        return output_tensors(task, task.reference(**fresh), fresh)


def fp64_evaluation(task: Task, inputs: dict[str, Any]) -> list[torch.Tensor]:
    """The reference op with float64 inputs and every rounding point removed (Float64Mode)."""
    fresh = clone_inputs(inputs, torch.float64)
    with Float64Mode():
        return output_tensors(task, task.reference(**fresh), fresh)


@dataclass(frozen=True)
class AdmissibleReference:
    rounding: str  # "nearest", "truncate", or one letter per rounding point, e.g. "NTN"
    outputs: list[torch.Tensor]


class ExactReductions(TorchFunctionMode):
    """The reference with its FP32 sums and means evaluated in float64 and rounded once to FP32.

    The numerics contract leaves the order of FP32 reductions free. The last bit of such a sum
    depends on that order; a flipped bit before a rounding point flips that BF16 rounding, and
    where a later step nearly cancels (the rotation x1*cos - x2*sin, the scaled residual add) or
    scales, one flip becomes several ulps of the output, beyond the 1-ulp budget, although the
    kernel is correct. Against this reference the reductions are order independent (for sums of
    squares of BF16 values, exact), so a kernel that reduces exactly matches it bit for bit.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _REDUCTIONS and args and isinstance(args[0], torch.Tensor) and args[0].dtype == torch.float32:
            if kwargs.get("dtype") is None:
                return func(args[0].double(), *args[1:], **kwargs).float()
        return func(*args, **kwargs)


_REDUCTIONS = {torch.Tensor.mean, torch.mean, torch.Tensor.sum, torch.sum}


def admissible_references(task: Task, inputs: dict[str, Any], emulate_truncation: bool) -> list[AdmissibleReference]:
    """The reference as written, then with exact reductions (ExactReductions); with
    `emulate_truncation` also its truncating variants (module docstring)."""
    counter = RoundingEmulation(lambda i: False)
    refs = [AdmissibleReference("nearest", run_reference(task, inputs, counter))]
    exact = run_reference(task, inputs, ExactReductions())
    if any(not torch.equal(a, b) for a, b in zip(exact, refs[0].outputs, strict=True) if a.is_floating_point()):
        refs.append(AdmissibleReference("exact_reductions", exact))
    if not emulate_truncation or counter.count == 0:
        return refs
    refs.append(AdmissibleReference("truncate", run_reference(task, inputs, RoundingEmulation(lambda i: True))))
    if 1 < counter.count <= MAX_ENUMERATED_ROUNDINGS:
        for bits in itertools.product((False, True), repeat=counter.count):
            if len(set(bits)) == 2:
                label = "".join("T" if b else "N" for b in bits)
                emulation = RoundingEmulation(lambda i, bits=bits: bits[i])
                refs.append(AdmissibleReference(label, run_reference(task, inputs, emulation)))
    return refs


# ---- comparing one output ------------------------------------------------------------------------
def _ordered_bits(x: torch.Tensor) -> torch.Tensor:
    """Float bits mapped to integers whose order is the floats' order (+0 and -0 both 0), as int64."""
    int_dtype = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[x.dtype]
    bits = x.contiguous().view(int_dtype).to(torch.int64)
    magnitude = bits & (torch.iinfo(int_dtype).max)
    return torch.where(bits < 0, -magnitude, magnitude)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Number of representable values between a and b (same float dtype), elementwise, int64."""
    return (_ordered_bits(a) - _ordered_bits(b)).abs()


def normwise_error(x: torch.Tensor, exact: torch.Tensor) -> float:
    """||x - exact||_2 / ||exact||_2 in float64 (absolute when exact is all zeros)."""
    diff = (x.double() - exact.double()).norm().item()
    scale = exact.double().norm().item()
    return diff / scale if scale > 0 else diff


def allowed_count(fraction: float, n: int) -> int:
    return max(1, math.floor(fraction * n))


@dataclass(frozen=True)
class OutputParity:
    """The figures for one output on one call, and whether they pass."""

    name: str
    passed: bool
    reason: str  # empty when passed
    n_elements: int = 0
    max_abs_err: float | None = None  # against the reference
    max_rel_err: float | None = None
    max_ulp: int | None = None
    ulp_hist: dict[str, int] = field(default_factory=dict)
    n_mismatched: int = 0  # elements not bit-identical to the reference (rows, for index_set)
    n_over_tolerance: int = 0  # elements beyond 1 ulp (bf16 bit_exact)
    first_mismatch_indices: list[list[int]] = field(default_factory=list)
    nonfinite: int = 0  # elements non-finite in the candidate where the reference is finite, or vice versa
    fp64_err: float | None = None  # normwise relative error against FP64
    ref_fp64_err: float | None = None  # the admissible reference's own
    nearest_ref_fp64_err: float | None = None  # the reference as written (differs on the interpreter)
    fp64_ratio: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _first_indices(mask: torch.Tensor) -> list[list[int]]:
    return [list(map(int, idx)) for idx in torch.nonzero(mask)[:FIRST_INDICES].tolist()]


def _structure_problem(check: OutputCheck, got: Any, want: torch.Tensor) -> str | None:
    if type(got) is not torch.Tensor:
        return f"expected a torch.Tensor; got {type(got).__name__}"
    if tuple(got.shape) != tuple(want.shape):
        return f"shape {tuple(got.shape)} expected {tuple(want.shape)}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} expected {want.dtype}"
    return None


def _compare_index_set(check: OutputCheck, got: torch.Tensor, want: torch.Tensor) -> OutputParity:
    rows_equal = (got.sort(dim=-1).values == want.sort(dim=-1).values).all(dim=-1)
    bad = ~rows_equal
    n_bad = int(bad.sum())
    reason = f"{n_bad} of {rows_equal.numel()} rows choose a different set of ids" if n_bad else ""
    return OutputParity(
        check.name, n_bad == 0, reason, n_elements=got.numel(), n_mismatched=n_bad,
        first_mismatch_indices=_first_indices(bad),
    )  # fmt: skip


def _sorted_by_ids(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return x.gather(-1, ids.argsort(dim=-1))


def _elementwise_figures(check: OutputCheck, got: torch.Tensor, want: torch.Tensor) -> dict[str, Any]:
    """ULP distances, their histogram, absolute and relative errors, non-finite disagreements."""
    n = got.numel()
    got_finite, want_finite = torch.isfinite(got), torch.isfinite(want)
    nonfinite_mask = got_finite != want_finite
    nonfinite = int(nonfinite_mask.sum())
    both = got_finite & want_finite
    ulps = ulp_distance(got, want)
    ulps = torch.where(both, ulps, torch.where(nonfinite_mask, torch.full_like(ulps, 1 << 40), 0))
    # One pass: the bucket of each distance is the number of buckets' lower edges above 0 it reaches.
    edges = torch.tensor([lo for lo, _ in ULP_BUCKETS[1:]], dtype=ulps.dtype, device=ulps.device)
    counts = torch.bincount(torch.bucketize(ulps.flatten(), edges, right=True), minlength=len(ULP_BUCKETS)).tolist()
    hist = {_bucket_label(lo, hi): c for (lo, hi), c in zip(ULP_BUCKETS, counts, strict=True)}
    diff = (got.double() - want.double()).abs().where(both, 0.0)
    max_abs = float(diff.max()) if n else 0.0
    max_rel = float((diff / want.double().abs().clamp_min(torch.finfo(want.dtype).tiny)).max()) if n else 0.0
    mismatched = ulps > 0
    over = ulps > 1 if (check.kind == "bf16" and check.bit_exact) else torch.zeros_like(mismatched)
    return dict(
        n_elements=n,
        max_abs_err=max_abs,
        max_rel_err=max_rel,
        max_ulp=int(ulps.where(both, 0).max()) if n else 0,
        ulp_hist=hist,
        n_mismatched=int(mismatched.sum()),
        n_over_tolerance=int(over.sum()),
        first_mismatch_indices=_first_indices(over if over.any() else mismatched),
        nonfinite=nonfinite,
    )


def _figures_of_equal(n: int) -> dict[str, Any]:
    """_elementwise_figures of two tensors equal in value (torch.equal: +0 equals -0, NaN equals nothing)."""
    hist = {_bucket_label(lo, hi): n if lo == 0 else 0 for lo, hi in ULP_BUCKETS}
    return dict(n_elements=n, max_abs_err=0.0, max_rel_err=0.0, max_ulp=0, ulp_hist=hist, n_mismatched=0,
                n_over_tolerance=0, first_mismatch_indices=[], nonfinite=0)  # fmt: skip


def compare_output(
    check: OutputCheck,
    got: Any,
    want: torch.Tensor,
    exact: torch.Tensor,
    nearest: torch.Tensor,
    reference_errors: tuple[float, float] | None = None,
) -> OutputParity:
    """One output against its admissible reference `want`, the FP64 value `exact` and the reference
    as written `nearest` (the same tensor as `want` on the GPU). `reference_errors`: the normwise errors
    of `want` and `nearest` against `exact` where the caller has them already (`Expected`)."""
    problem = _structure_problem(check, got, want)
    if problem is not None:
        return OutputParity(check.name, False, problem)
    n = got.numel()
    if check.kind == "index_set":
        return _compare_index_set(check, got, want)
    equal = torch.equal(got, want)  # most calls: one pass, and the element-wise figures are all 0
    figures = _figures_of_equal(n) if equal else _elementwise_figures(check, got, want)
    if figures["nonfinite"]:
        return OutputParity(check.name, False, f"{figures['nonfinite']} non-finite values where the reference is "
                            "finite (or finite where it is not)", **figures)  # fmt: skip
    ref_err, nearest_err = reference_errors or (normwise_error(want, exact), normwise_error(nearest, exact))
    fp64_err = ref_err if equal else normwise_error(got, exact)
    ratio = fp64_err / ref_err if ref_err > 0 else (1.0 if fp64_err == 0 else math.inf)
    figures.update(
        fp64_err=fp64_err,
        ref_fp64_err=ref_err,
        nearest_ref_fp64_err=nearest_err,
        fp64_ratio=ratio if math.isfinite(ratio) else None,
    )
    if check.kind == "bf16" and check.bit_exact:
        budget = allowed_count(check.max_ulp_fraction, n)
        if figures["n_over_tolerance"]:
            return OutputParity(check.name, False, f"{figures['n_over_tolerance']} elements differ by more than "
                                f"1 ulp (max {figures['max_ulp']})", **figures)  # fmt: skip
        if figures["n_mismatched"] > budget:
            return OutputParity(check.name, False, f"{figures['n_mismatched']} of {n} elements differ by 1 ulp; "
                                f"at most {budget} allowed ({check.max_ulp_fraction:.2%})", **figures)  # fmt: skip
    if check.kind == "fp32" and check.rel_tol is not None and fp64_err > check.rel_tol:
        return OutputParity(check.name, False, f"error against FP64 {fp64_err:.3g} above rel_tol "
                            f"{check.rel_tol:.3g}", **figures)  # fmt: skip
    # FP32 outputs: when both errors are about one FP32 rounding (~1e-7) their ratio is noise, so an
    # excess of at most the FP32 unit roundoff also passes. Not for BF16, whose unit roundoff (2e-3)
    # would hide a skipped rounding point.
    slack = torch.finfo(torch.float32).eps / 2 if check.kind == "fp32" else 0.0
    if not (ratio <= 1 + check.fp64_margin or fp64_err <= ref_err + slack):
        return OutputParity(check.name, False, f"error against FP64 {fp64_err:.3g} is {ratio:.3g}x the reference's "
                            f"own {ref_err:.3g}; at most {1 + check.fp64_margin:.3g}x allowed", **figures)  # fmt: skip
    return OutputParity(check.name, True, "", **figures)


# ---- one call: every output, against the admissible references -----------------------------------
@dataclass(frozen=True)
class CallParity:
    passed: bool
    rounding: str  # which admissible reference the outputs were judged against
    outputs: dict[str, OutputParity]

    @property
    def reason(self) -> str:
        return "; ".join(f"{name}: {o.reason}" for name, o in self.outputs.items() if not o.passed)

    @property
    def elements_off(self) -> int:
        """Elements (rows, for index_set) not bit-identical to the reference, over every output."""
        return sum(o.n_mismatched + o.n_over_tolerance for o in self.outputs.values())


# One output as an implementation's is compared with it: (want, exact, nearest, the errors of want and nearest).
_ExpectedOutput = tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[float, float] | None]


class Expected:
    """What every implementation's outputs for one (shape, seed) are judged against: the admissible references
    (`admissible_references`, the reference as written first) and the FP64 evaluation (`fp64_evaluation`).
    What a comparison needs from them alone (the outputs re-ordered by their ids for `paired_with` checks, the
    references' own FP64 errors) is the same for every implementation, so it is worked out once, on first use:
    for outputs equal to the reference it was most of judging a call."""

    def __init__(self, task: Task, references: Sequence[AdmissibleReference], exact: list[torch.Tensor]):
        self.task, self.references, self.exact = task, list(references), exact
        index = {c.name: i for i, c in enumerate(task.outputs)}
        self._paired = {i: index[c.paired_with] for i, c in enumerate(task.outputs) if c.paired_with is not None}
        self._outputs: dict[tuple[int, int, bool], _ExpectedOutput] = {}

    def judge(self, got: Sequence[Any]) -> CallParity:
        """The verdict for one call, against the admissible reference it is closest to (fewest elements off),
        the first of those in order where several are as close: among those it passes against, else among
        all. So a kernel equal bit for bit to one admissible reference is judged against that one (its record
        shows no element off), even where it also passes against another within the 1-ulp budget."""
        task = self.task
        if len(got) != len(task.outputs):
            names = [c.name for c in task.outputs]
            reason = f"expected {len(names)} outputs {names} (returned, then mutated inputs); got {len(got)}"
            return CallParity(False, self.references[0].rounding, {"outputs": OutputParity("outputs", False, reason)})
        verdicts = [self._judge_against(got, k) for k in range(len(self.references))]
        passed = [v for v in verdicts if v.passed]
        return min(passed or verdicts, key=lambda v: v.elements_off)

    def _judge_against(self, got: Sequence[Any], k: int) -> CallParity:
        results: dict[str, OutputParity] = {}
        for i, check in enumerate(self.task.outputs):
            g, by_ids = got[i], False
            if i in self._paired:
                ids = got[self._paired[i]]
                if type(ids) is torch.Tensor and type(g) is torch.Tensor:
                    by_ids = ids.shape == self.references[k].outputs[self._paired[i]].shape
                    if by_ids and g.shape == ids.shape:
                        g = _sorted_by_ids(g, ids)
            results[check.name] = compare_output(check, g, *self._output(k, i, by_ids))
        return CallParity(all(o.passed for o in results.values()), self.references[k].rounding, results)

    def _output(self, k: int, i: int, by_ids: bool) -> _ExpectedOutput:
        """Output i of reference k, of the FP64 evaluation and of the reference as written, and the normwise
        errors of the two references against FP64 (none for an index set); `by_ids`: each re-ordered by its own
        ids (the output its check is paired with)."""
        key = (k, i, by_ids)
        if key not in self._outputs:
            want, exact, nearest = self.references[k].outputs[i], self.exact[i], self.references[0].outputs[i]
            if by_ids:
                j = self._paired[i]
                want = _sorted_by_ids(want, self.references[k].outputs[j])
                exact = _sorted_by_ids(exact, self.exact[j])
                nearest = _sorted_by_ids(nearest, self.references[0].outputs[j])
            errors = None
            if self.task.outputs[i].kind != "index_set":
                errors = (normwise_error(want, exact), normwise_error(nearest, exact))
            self._outputs[key] = (want, exact, nearest, errors)
        return self._outputs[key]


def judge(
    task: Task,
    got: Sequence[Any],
    references: Sequence[AdmissibleReference],
    exact: list[torch.Tensor],
) -> CallParity:
    """One call's verdict (`Expected.judge`); where several implementations are judged on the same inputs,
    one `Expected` serves them all."""
    return Expected(task, references, exact).judge(got)


def summarize(calls: Sequence[CallParity]) -> dict[str, dict[str, Any]]:
    """Per output, the worst figures over several calls (seeds) of one shape, for the record."""
    summary: dict[str, dict[str, Any]] = {}
    for call in calls:
        for name, o in call.outputs.items():
            s = summary.setdefault(name, {"passed": True, "reason": "", "calls": 0, "roundings": []})
            s["calls"] += 1
            if call.rounding not in s["roundings"]:
                s["roundings"].append(call.rounding)
            if not o.passed and s["passed"]:
                s["passed"], s["reason"] = False, f"call {s['calls']}: {o.reason}"
                s["first_mismatch_indices"] = o.first_mismatch_indices
            for key in ("max_abs_err", "max_rel_err", "max_ulp", "fp64_err", "ref_fp64_err", "nearest_ref_fp64_err",
                        "fp64_ratio"):  # fmt: skip
                value = getattr(o, key)
                if value is not None:
                    s[key] = max(s.get(key, value), value)
            for key in ("n_elements", "n_mismatched", "n_over_tolerance", "nonfinite"):
                s[key] = s.get(key, 0) + getattr(o, key)
            hist = s.setdefault("ulp_hist", {})
            for bucket, count in o.ulp_hist.items():
                hist[bucket] = hist.get(bucket, 0) + count
            s.setdefault("first_mismatch_indices", o.first_mismatch_indices)
    return summary
