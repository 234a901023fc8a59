"""The optimized Beam: the reference model with its `ops` filled from promotion records.

    optimized = build_ops(promoted_choices(gpu=environment.gpu()), cfg, device,
                          library=library_paths.library_ops(device, cfg))
    model = optimized_model(cfg, optimized, device, seed)         # pack_qkv_gate=True

One builder, `build_ops`, turns an explicit mapping task -> CandidateChoice (a file and the content
hash it must have) into a ModelOps, on top of the library paths (GPU: harness/library_paths.py:
library kernels, and Inductor's fusion of the pointwise ops that have no promoted candidate) and
the reference. The mapping comes from the promotion records (`promoted_choices`: what
`harness run` promoted), from files named explicitly (`explicit_choices`: the CPU parity test
uses every candidate present, since promotion needs GPU timings), or from any subset of either
(the waterfall of `harness bench model` removes and adds changes one at a time).

Loading a candidate: its bytes are hashed and must equal the choice's hash, otherwise a
StaleCandidateError names the task, the expected and the found hash (a file edited after its
promotion is a different candidate, never loaded silently). The verified bytes are then executed
as a module: promoted candidates passed the sandboxed parity gate of the runner, so they are
imported here in-process. Modules are cached by hash: building many variants (the waterfall)
imports each file once, and Triton's autotuning results are kept. Under TRITON_INTERPRET=1 (the CPU)
loading also applies harness/interpreter_patches, as the runner's children do: without it the
interpreter's BF16 dots and casts differ from the GPU's, and under numpy 2.4 and later every `range`
over a runtime bound raises. Every in-process path to a candidate (the model check's CPU runs,
`harness bench model`, `harness profile`, the tests) goes through here, so none can forget it.

Load-time transformations: the model is built with pack_qkv_gate=True (q|k|v|gate weights in one
matrix, optimization #5). Then q, k, v and g reach qk_norm_rope and output_gate as strided views
of the packed projection's output (row stride N). Every candidate file of those tasks honours
strides (they pass strides to their kernels), but a future one may not: `build_ops` runs each
candidate of a strided-view op once on strided views and on contiguous copies of the same values,
and if the results differ, wraps it so that it receives contiguous copies (recorded in the op's
source: the copies cost one extra kernel each per layer). The model is then correct either way.

Shape legend: T tokens, H query heads, K kv heads, Dh head dim, N packed projection rows, S slots.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import torch

from harness import candidates, environment, interpreter_patches, promote
from harness.environment import REPO_ROOT
from reference_model import ops as reference_ops
from reference_model.config import BeamConfig, get_config
from reference_model.model import Attention, Beam
from reference_model.ops import REFERENCE_OPS, ModelOps
from reference_model.weights import random_model
from tasks import TASKS, get_task

# The ModelOps field each task replaces: the reference function's name (Task.op_name).
TASK_FIELDS: dict[str, str] = {name: task.op_name for name, task in TASKS.items()}
# Ops that receive strided views of the packed q|k|v|gate output, and which of their arguments.
STRIDED_VIEW_ARGS: dict[str, tuple[str, ...]] = {
    "qk_norm_rope": ("q_THD", "k_TKD", "v_TKD"),
    "output_gate": ("g_THD",),
}
PROBE_SEED = 20261130
PREFILL_TOKENS = 16384  # BEAM.md §7: the largest call a promotion must have measured to cover prefill


class StaleCandidateError(ValueError):
    """A chosen candidate file is missing, or its bytes are not the ones that were chosen."""


@dataclass(frozen=True)
class CandidateChoice:
    """Use the candidate at `path` for `task`, provided its bytes hash to `content_hash`."""

    task: str
    path: Path
    content_hash: str
    origin: str  # "promotion <id> (run <run_id>)" or "explicit"

    @property
    def name(self) -> str:
        return Path(self.path).stem


@dataclass(frozen=True)
class LibraryOp:
    """A library path for one ModelOps field (harness/library_paths.py). `make` receives the
    ModelOps with every chosen candidate in place, so a library path can call them. kind "library"
    is a maintained kernel library; "compiled" is Inductor's fusion of the reference op, a fallback
    for an op that has no promoted candidate."""

    field: str
    make: Callable[[ModelOps], Callable]  # the path, given the other ops (e.g. the SwiGLU it should use)
    name: str
    detail: str
    kind: Literal["library", "compiled"] = "library"

    @property
    def change(self) -> str:
        """Its name in the waterfall of `harness bench model`: "library:attention", "compiled:swiglu"."""
        return f"{self.kind}:{self.field}"


@dataclass(frozen=True)
class OpSource:
    field: str
    kind: Literal["reference", "candidate", "library", "compiled", "candidate+library", "candidate+compiled"]
    name: str
    detail: str


@dataclass(frozen=True)
class OptimizedOps:
    """The ops of an optimized model, where each came from, and the load-time packing switch."""

    ops: ModelOps
    sources: tuple[OpSource, ...]
    pack_qkv_gate: bool

    def source(self, field: str) -> OpSource:
        for s in self.sources:
            if s.field == field:
                return s
        raise KeyError(f"no op field {field!r}; fields: {[s.field for s in self.sources]}")

    def implementations(self) -> dict[str, str]:
        """What implements each op, one line per field: its kind and name ("reference" alone)."""
        return {s.field: s.kind if s.kind == "reference" else f"{s.kind} {s.name}" for s in self.sources}

    def describe(self) -> str:
        width = max(len(s.field) for s in self.sources)
        lines = [f"  {s.field:<{width}}  {s.kind:<17} {s.name}  {s.detail}".rstrip() for s in self.sources]
        return f"pack_qkv_gate={self.pack_qkv_gate}\n" + "\n".join(lines)


# ---- choosing candidates ----------------------------------------------------------------------------
def _check_task(task: str) -> None:
    get_task(task)  # raises ValueError naming the known tasks


def promoted_choices(results_dir: Path | str | None = None, tasks: tuple[str, ...] = (),
                     gpu: str | None = None) -> dict[str, CandidateChoice]:  # fmt: skip
    """The candidate in force on `gpu` (environment.gpu(); None: no GPU, a CPU build) for every task that has
    one (harness/promote.py `promoted`: a GPU without promotions of its own takes another GPU's), by task."""
    chosen = {}
    for task in tasks or tuple(TASKS):
        _check_task(task)
        record = promote.promoted(task, results_dir, gpu)
        if record is not None:
            on = promote.gpu_of(record)
            origin = f"promotion {record.promotion_id} (run {record.run_id}{f', on the {on}' if on else ''})"
            path = Path(record.path)
            if not path.is_absolute():
                path = REPO_ROOT / path
            chosen[task] = CandidateChoice(task, path, record.content_hash, origin)
    return chosen


def explicit_choices(mapping: Mapping[str, str | Path]) -> dict[str, CandidateChoice]:
    """Choices from task -> candidate (a file stem in candidate_kernels/<task>/, or a path), hashed now."""
    chosen = {}
    for task, selector in mapping.items():
        _check_task(task)
        (candidate,) = candidates.resolve(task, TASK_FIELDS[task], (str(selector),))
        chosen[task] = CandidateChoice(task, candidate.path, candidate.content_hash, "explicit")
    return chosen


def present_candidates() -> dict[str, list[str]]:
    """Every candidate file present, by task (file stems, sorted): the CPU parity test's mapping."""
    return {task: [c.name for c in candidates.discover(task, field)] for task, field in TASK_FIELDS.items()}


# ---- loading --------------------------------------------------------------------------------------
_MODULES: dict[str, types.ModuleType] = {}


def load_candidate_op(choice: CandidateChoice) -> Callable:
    """The launcher of a chosen candidate, after checking its content hash (modules cached by hash)."""
    field = TASK_FIELDS[choice.task]
    path = Path(choice.path)
    if not path.is_file():
        raise StaleCandidateError(
            f"task {choice.task!r}: candidate file {str(path)!r} ({choice.origin}) does not exist; "
            f"expected a file with content hash {choice.content_hash}"
        )
    source = path.read_bytes()
    found = candidates.content_hash(source)
    if found != choice.content_hash:
        raise StaleCandidateError(
            f"task {choice.task!r}: candidate {str(path)!r} ({choice.origin}) has content hash {found}, "
            f"expected {choice.content_hash}: the file changed after it was chosen; re-run "
            f"`harness run task={choice.task}` to evaluate (and promote) the new version, or, where only its "
            f"docstrings or comments changed, `harness rehash task={choice.task}` to carry the promotion over"
        )
    module = _MODULES.get(found)
    if module is None:
        name = f"beam_optimized_{choice.task}_{found[:16]}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        exec(compile(source, str(path), "exec"), module.__dict__)  # the verified bytes, not a re-read
        _MODULES[found] = module
    launcher = getattr(module, field, None)
    if not callable(launcher):
        raise StaleCandidateError(f"task {choice.task!r}: {str(path)!r} defines no launcher {field!r}")
    if os.environ.get("TRITON_INTERPRET") == "1":
        interpreter_patches.apply()  # idempotent; see the module docstring
    return launcher


# ---- strided inputs -----------------------------------------------------------------------------
def _probe_inputs(field: str, cfg: BeamConfig, device: torch.device, variant: str) -> tuple[dict, tuple[str, ...]]:
    """Arguments of `field` at the model's head sizes, with the STRIDED_VIEW_ARGS as views of one
    packed [T, N] projection output (as the packed model passes them), and the names of the
    arguments written in place."""
    T, H, K, Dh = 3, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    gen = torch.Generator(device=device).manual_seed(PROBE_SEED)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=device).to(torch.bfloat16)

    q, k, v, g = randn(T, cfg.qkv_gate_size).split([cfg.q_size, cfg.kv_size, cfg.kv_size, cfg.q_size], dim=1)
    if field == "output_gate":
        return {"o_THD": randn(T, H, Dh), "g_THD": g.view(T, H, Dh), "bias_H": randn(H)}, ()
    slots = 2 * T + 1  # rows 0..T-1 written, the rest must stay zero
    args = {
        "q_THD": q.view(T, H, Dh), "k_TKD": k.view(T, K, Dh), "v_TKD": v.view(T, K, Dh),
        "q_norm_weight": 1 + 0.1 * randn(Dh).float(), "k_norm_weight": 1 + 0.1 * randn(Dh).float(),
        "positions_T": torch.arange(5, 5 + T, device=device), "slot_mapping_T": torch.arange(T, device=device),
        "k_cache_SKD": torch.zeros((slots, K, Dh), dtype=torch.bfloat16, device=device),
        "v_cache_SKD": torch.zeros((slots, K, Dh), dtype=torch.bfloat16, device=device),
        "rope_cos_sin_PD": None, "ssmax_scale_P": None, "eps": cfg.norm_eps,
    }  # fmt: skip
    args["q_norm_weight"] = args["q_norm_weight"].to(torch.bfloat16)
    args["k_norm_weight"] = args["k_norm_weight"].to(torch.bfloat16)
    if variant == "sliding":
        args["rope_cos_sin_PD"] = reference_ops.rope_table(16, Dh, cfg.rope_theta).to(device)
    else:
        args["ssmax_scale_P"] = reference_ops.ssmax_table(16, cfg.ssmax_base, cfg.ssmax_exponent).to(device)
    return args, ("k_cache_SKD", "v_cache_SKD")


def honours_strides(field: str, fn: Callable, cfg: BeamConfig, device: torch.device) -> bool:
    """Whether `fn` gives bit-identical results (returned and written in place) on strided views of
    the packed projection and on contiguous copies of them."""
    for variant in ("sliding", "global") if field == "qk_norm_rope" else ("-",):
        strided, mutated = _probe_inputs(field, cfg, device, variant)
        dense = {n: a.clone() if isinstance(a, torch.Tensor) else a for n, a in strided.items()}
        for name in STRIDED_VIEW_ARGS[field]:
            dense[name] = dense[name].contiguous()
        got, want = fn(**strided), fn(**dense)
        got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
        outputs = list(zip(got, want, strict=True)) + [(strided[m], dense[m]) for m in mutated]
        if not all(torch.equal(a, b) for a, b in outputs):
            return False
    return True


def with_contiguous_inputs(fn: Callable, names: tuple[str, ...]) -> Callable:
    """`fn` called with contiguous copies of the arguments `names` (the others pass through)."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        for name in names:
            bound.arguments[name] = bound.arguments[name].contiguous()
        return fn(*bound.args, **bound.kwargs)

    return call


# ---- building -------------------------------------------------------------------------------------
def measured_tokens(task: str) -> int:
    """The most tokens of a GPU shape of `task`: how far its promotion's evidence reaches."""
    return max(shape.params.get("T", 0) for shape in get_task(task).shapes)


def split_by_tokens(small: Callable, large: Callable, max_small_tokens: int) -> Callable:
    """An op that calls `small` when its first argument (the tokens: x_TD, q_THD, logits_TE, ...) has
    at most `max_small_tokens` rows, `large` above: a shape-only decision, fixed in a CUDA graph."""
    first_name = next(iter(inspect.signature(small).parameters))

    @functools.wraps(small)
    def call(*args, **kwargs):
        first = args[0] if args else kwargs[first_name]
        return (small if first.shape[0] <= max_small_tokens else large)(*args, **kwargs)

    return call


def build_ops(
    choices: Mapping[str, CandidateChoice],
    cfg: BeamConfig,
    device: torch.device | str,
    library: Mapping[str, LibraryOp] | None = None,
    pack_qkv_gate: bool = True,
) -> OptimizedOps:
    """ModelOps: the reference, overridden by the library paths, overridden by the chosen candidates.

    A candidate whose task's GPU shapes stop short of prefill size (router_gemm, qkv_gate_gemm and
    moe_experts go up to 1000 tokens) runs only up to that size, where its promotion measured it;
    larger calls go to the op's library path if there is one (the MoE experts' grouped GEMM), else
    to the reference (cuBLAS).
    """
    device = torch.device(device)
    library = dict(library or {})
    sources: dict[str, OpSource] = {
        f: OpSource(f, "reference", "reference", "reference_model/ops.py") for f in ModelOps.__dataclass_fields__
    }
    unknown = sorted(set(library) - set(sources))
    if unknown:
        raise ValueError(f"library paths for unknown op fields {unknown}; fields: {sorted(sources)}")
    chosen: dict[str, Callable] = {}
    for task, choice in choices.items():
        if choice.task != task:
            raise ValueError(f"choice for task {task!r} names task {choice.task!r}")
        field = TASK_FIELDS[task]
        fn = load_candidate_op(choice)
        detail = f"{choice.content_hash[:12]} ({choice.origin})"
        if field in STRIDED_VIEW_ARGS and pack_qkv_gate and not honours_strides(field, fn, cfg, device):
            fn = with_contiguous_inputs(fn, STRIDED_VIEW_ARGS[field])
            detail += f"; ignores input strides: gets contiguous {', '.join(STRIDED_VIEW_ARGS[field])}"
        chosen[field] = fn
        sources[field] = OpSource(field, "candidate", f"{task}/{choice.name}", detail)
    with_candidates = replace(REFERENCE_OPS, **chosen)
    fields = dict(chosen)
    for field, lib in library.items():
        if field not in chosen:
            fields[field] = lib.make(with_candidates)
            sources[field] = OpSource(field, lib.kind, lib.name, lib.detail)
    for task in choices:
        field, max_tokens = TASK_FIELDS[task], measured_tokens(task)
        if max_tokens < PREFILL_TOKENS:
            lib = library.get(field)
            above = lib.make(with_candidates) if lib else getattr(REFERENCE_OPS, field)
            above_name = f"{lib.name} ({lib.detail})" if lib else "the reference"
            fields[field] = split_by_tokens(chosen[field], above, max_tokens)
            cand = sources[field]
            kind = f"candidate+{lib.kind}" if lib else "candidate"
            detail = f"{cand.detail}; T <= {max_tokens} (its task's shapes), above: {above_name}"
            sources[field] = OpSource(field, kind, cand.name + (f" | {lib.name}" if lib else ""), detail)
    return OptimizedOps(replace(REFERENCE_OPS, **fields), tuple(sources.values()), pack_qkv_gate)


def optimized_model(cfg: BeamConfig | str, optimized: OptimizedOps, device: torch.device | str, seed: int) -> Beam:
    """A seeded random Beam with the optimized ops and load-time packing (same weights as
    random_model(cfg, seed, device): packing does not change the values)."""
    cfg = get_config(cfg) if isinstance(cfg, str) else cfg
    return random_model(cfg, seed, device, ops=optimized.ops, pack_qkv_gate=optimized.pack_qkv_gate)


def set_ops(model: Beam, ops: ModelOps) -> None:
    """Give an existing model other ops (the model holds them in its modules): the waterfall swaps
    ops on one model instead of building beam-slice's 66 GB again."""
    if not isinstance(ops, ModelOps):
        raise TypeError(f"ops must be a ModelOps; got {type(ops).__name__}")
    for module in model.modules():
        if hasattr(module, "ops"):
            module.ops = ops


def set_packed(model: Beam, packed: bool) -> None:
    """Switch a model built with pack_qkv_gate=True between the packed GEMM and four projections
    (wq..wg stay views of the packed rows, so the weights are the same either way)."""
    if not model.pack_qkv_gate:
        raise ValueError("set_packed needs a model built with pack_qkv_gate=True")
    for module in model.modules():
        if isinstance(module, Attention):
            if not hasattr(module, "_packed_w_qkvg"):
                module._packed_w_qkvg = module.w_qkvg
            module.w_qkvg = module._packed_w_qkvg if packed else None


# ---- the hook of `harness profile` (harness/profile_model.py) -------------------------------------
def build_model_ops(device: torch.device | str) -> tuple[ModelOps, bool, dict[str, str]]:
    """The promoted kernels (and on a GPU the library paths) as ModelOps, pack_qkv_gate, and what
    implements each op ("candidate fuse_norm/persistent_prefetch", "compiled torch.compile", ...)."""
    from harness import library_paths

    device = torch.device(device)
    # Head sizes of the strided-input probe (the layout is the same in every preset; tiny is quick
    # in the interpreter).
    cfg = get_config("beam-tiny" if device.type == "cpu" else "beam")
    chosen = promoted_choices(gpu=environment.gpu() if device.type == "cuda" else None)
    optimized = build_ops(chosen, cfg, device, library=library_paths.library_ops(device, cfg))
    return optimized.ops, optimized.pack_qkv_gate, optimized.implementations()
