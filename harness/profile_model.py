"""The model profile: a decode or prefill step of Beam under the PyTorch profiler, op by op.

Every field of the model's ModelOps is wrapped in `torch.profiler.record_function(<op name>)` and
the wrapped ModelOps is passed to the model (nothing is patched); the model itself opens
"embedding", "L{l}.attention", "L{l}.mlp" / "L{l}.moe" and "lm_head". Each profiled step runs in a
"profile.step" range, from the same cache state (a snapshot is restored after every step, so all
steps see the same context). While profiling, the wrapper also logs each call's first weight
argument (which parameter: `layers.3.attention.wq`) and, where a task addresses the op, the
task's Cost at the call's actual shape; harness/profile_analysis.py pairs that log with the ranges.
(That bookkeeping costs the host a few microseconds per op call, outside the op ranges.)

Scenarios (BEAM.md §7): decode is one new token per sequence (batch 1) at about 100K cached tokens
(filled by reference_model.cache.fill_synthetic_context, no 100K prefill); prefill is 8 sequences
x 2048 new tokens on top of about 100K each. On CPU, and for presets whose position tables are
shorter than that, a small version runs (SCENARIOS: the one place these sizes are written).

`ops=optimized` runs the promoted kernels: harness/optimized_model.py provides
`build_model_ops(device) -> (ModelOps, pack_qkv_gate, {op: what implements it})`, looked up when
asked for; the summary and profile.json name each op's implementation.

Shape legend: B sequences, T new tokens of a step, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import inspect
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from harness import bench, environment, profile_analysis, profile_summary
from harness.profile import ProfileSettings
from reference_model.cache import KVCache, fill_synthetic_context
from reference_model.config import BeamConfig, get_config
from reference_model.model import Beam, parameter_counts
from reference_model.ops import REFERENCE_OPS, ModelOps
from reference_model.weights import random_model
from tasks import TASKS
from tasks.task import Cost, Shape

STEP_RANGE = "profile.step"
OPS_CHOICES = ("reference", "optimized")
OPTIMIZED_MODULE, OPTIMIZED_HOOK = "harness.optimized_model", "build_model_ops"
MEMORY_HEADROOM = 0.85  # weights + cache may take this fraction of the free memory; the rest is activations


@dataclass(frozen=True)
class Size:
    seqs: int
    new_tokens: int
    context: int


@dataclass(frozen=True)
class Scenario:
    full: Size  # BEAM.md §7, on the GPU
    small: Size  # on CPU, and for presets whose tables cannot hold the full context
    warmup: int
    steps: int


SCENARIOS: dict[str, Scenario] = {
    "decode": Scenario(full=Size(1, 1, 100_352), small=Size(1, 1, 64), warmup=3, steps=5),
    "prefill": Scenario(full=Size(8, 2048, 100_352), small=Size(2, 16, 32), warmup=1, steps=1),
}


@dataclass(frozen=True)
class Plan:
    """A validated model profile: every size resolved, the output folder chosen."""

    settings: ProfileSettings
    cfg: BeamConfig
    device: torch.device
    ops: ModelOps
    pack_qkv_gate: bool
    implementations: Mapping[str, str]  # op -> what implements it (empty for the reference ops)
    size: Size
    warmup: int
    steps: int
    run_dir: Path

    @property
    def on_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def capacity(self) -> int:
        """Cache rows per sequence: the context plus one step's new tokens (the cache is rewound after each)."""
        return self.size.context + self.size.new_tokens


# ---- validation ----------------------------------------------------------------------------------
def _device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("device=cuda requested but torch.cuda.is_available() is False on this machine")
    return torch.device(requested)


def load_ops(name: str, device: torch.device) -> tuple[ModelOps, bool, Mapping[str, str]]:
    """The ModelOps to profile, whether the model packs its q|k|v|gate projection, and what
    implements each op (empty for the reference)."""
    if name not in OPS_CHOICES:
        raise ValueError(f"ops {name!r} unknown; known: {list(OPS_CHOICES)}")
    if name == "reference":
        return REFERENCE_OPS, False, {}
    if device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any promoted kernel is decorated
    try:
        module = importlib.import_module(OPTIMIZED_MODULE)
    except ModuleNotFoundError as e:
        if e.name != OPTIMIZED_MODULE:
            raise
        raise ValueError(
            f"ops=optimized needs {OPTIMIZED_MODULE} (the promoted kernels as ModelOps), which does not exist yet; "
            "use ops=reference"
        ) from None
    build = getattr(module, OPTIMIZED_HOOK, None)
    if not callable(build):
        raise ValueError(
            f"{OPTIMIZED_MODULE} has no {OPTIMIZED_HOOK}(device) -> (ModelOps, pack_qkv_gate, implementations)"
        )
    # Printed before and after: on a machine where nothing is compiled yet the build compiles the
    # promoted kernels and the compiled ops first (on a fresh H200, minutes), with no other output.
    print(f"profile: building ops=optimized on {device.type} ({OPTIMIZED_MODULE}.{OPTIMIZED_HOOK})")
    started = time.perf_counter()
    built = build(device)
    print(f"profile: ops=optimized built in {time.perf_counter() - started:.1f} s")
    kinds = (ModelOps, bool, Mapping)
    if not (isinstance(built, tuple) and len(built) == 3 and all(map(isinstance, built, kinds))):
        got = ", ".join(type(x).__name__ for x in built) if isinstance(built, tuple) else type(built).__name__
        raise TypeError(f"{OPTIMIZED_HOOK} must return (ModelOps, bool, Mapping[str, str]); got ({got})")
    ops, pack, implementations = built
    return ops, pack, dict(implementations)


def _resolve_size(s: ProfileSettings, cfg: BeamConfig, device: torch.device) -> Size:
    if s.scenario not in SCENARIOS:
        raise ValueError(f"scenario {s.scenario!r} unknown; known: {sorted(SCENARIOS)}")
    scenario = SCENARIOS[s.scenario]
    full = scenario.full
    base = full if device.type == "cuda" and full.context + full.new_tokens <= cfg.max_positions else scenario.small
    size = Size(
        seqs=base.seqs if s.seqs is None else s.seqs,
        new_tokens=base.new_tokens if s.new_tokens is None else s.new_tokens,
        context=base.context if s.context is None else s.context,
    )
    if s.scenario == "decode" and size.new_tokens != 1:
        raise ValueError(f"decode adds one token per sequence; got new_tokens={size.new_tokens} (use scenario=prefill)")
    if size.context + size.new_tokens > cfg.max_positions:
        raise ValueError(
            f"context={size.context} plus {size.new_tokens} new tokens exceed the max_positions={cfg.max_positions} "
            f"of preset {cfg.name!r}"
        )
    return size


def _memory_check(cfg: BeamConfig, size: Size, device: torch.device) -> None:
    """Refuse a profile whose weights and cache cannot fit, before allocating anything."""
    counts = parameter_counts(Beam(cfg, device="meta"))
    weight_bytes = 2 * counts.total + 2 * counts.by_part["router"]  # BF16, the routers FP32
    rows = sum((size.context + size.new_tokens) if cfg.is_global(layer) else cfg.sliding_window
               for layer in range(cfg.n_layers))  # fmt: skip
    cache_bytes = size.seqs * rows * 2 * cfg.n_kv_heads * cfg.head_dim * 2
    if device.type == "cuda":
        free, where = torch.cuda.mem_get_info(device)[0], f"free on {torch.cuda.get_device_name(device)}"
    else:
        free, where = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "of RAM on this machine"
    if weight_bytes + cache_bytes > MEMORY_HEADROOM * free:
        raise ValueError(
            f"preset {cfg.name!r} needs {weight_bytes / 1e9:.1f} GB of weights and {cache_bytes / 1e9:.1f} GB of "
            f"KV cache; {free / 1e9:.1f} GB {where}"
            + (" (on CPU, profile model=beam-tiny)" if device.type == "cpu" else "")
        )


def _run_dir(s: ProfileSettings, cfg: BeamConfig, device: torch.device) -> Path:
    out = Path(s.out)
    if s.name is not None:
        if not s.name or "/" in s.name or s.name in (".", ".."):
            raise ValueError(f"name must be a plain folder name; got {s.name!r}")
        if (out / s.name).exists():
            raise ValueError(f"{out / s.name} exists; profiles are never overwritten: choose another name=")
        return out / s.name
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    stem = f"{cfg.name}-{s.scenario}-{s.ops}-{device.type}-{stamp}"
    path, n = out / stem, 1
    while path.exists():
        path, n = out / f"{stem}-{n}", n + 1
    return path


def prepare(s: ProfileSettings) -> Plan:
    """Every check that needs no model: raises ValueError naming what was expected."""
    cfg = get_config(s.model)
    if cfg.name == "beam":
        raise ValueError("preset 'beam' (501B parameters) exists only on the meta device; profile beam-slice")
    device = _device(s.device)
    size = _resolve_size(s, cfg, device)
    scenario = SCENARIOS[s.scenario]
    _memory_check(cfg, size, device)
    ops, pack, implementations = load_ops(s.ops, device)
    warmup = scenario.warmup if s.warmup is None else s.warmup
    steps = scenario.steps if s.steps is None else s.steps
    return Plan(s, cfg, device, ops, pack, implementations, size, warmup, steps, _run_dir(s, cfg, device))


# ---- the traced ops ------------------------------------------------------------------------------
@dataclass(frozen=True)
class OpCall:
    """One call of a ModelOps op, as the wrapper saw it."""

    op: str
    weight: str | None  # name of its first argument that is a model weight ("layers.3.moe.router")
    task: str | None  # the task that addresses this call
    cost: Cost | None  # the task's Cost at this call's shape


def _dims(a: Mapping[str, Any], name: str, *keys: str) -> dict[str, int]:
    return dict(zip(keys, a[name].shape, strict=True))


# Task shape parameters from an op's (bound) arguments: what each task's `cost` reads.
OP_SHAPES: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "norm_residual_norm": lambda a: _dims(a, "y_TD", "T", "D"),
    "qk_norm_rope": lambda a: {**_dims(a, "q_THD", "T", "H", "Dh"), "K": a["k_TKD"].shape[1],
                               "variant": "sliding" if a["rope_cos_sin_PD"] is not None else "global"},
    "output_gate": lambda a: _dims(a, "o_THD", "T", "H", "Dh"),
    "router_logits": lambda a: {**_dims(a, "x_TD", "T", "D"), "E": a["w_router_ED"].shape[0]},
    "qkv_gate_proj": lambda a: {**_dims(a, "x_TD", "T", "D"), "N": a["w_qkvg_ND"].shape[0]},
    "swiglu": lambda a: _dims(a, "gate_TF", "T", "F"),
    "moe_route": lambda a: {**_dims(a, "logits_TE", "T", "E"), "top_k": a["top_k"]},
    "moe_experts": lambda a: {**_dims(a, "w_gate_EFD", "E", "Fe", "D"), "T": a["x_TD"].shape[0],
                              "k": a["ids_Tk"].shape[1]},
}  # fmt: skip
# The unpacked model's four projections are what qkv_gate_gemm packs into one GEMM: each is costed
# with that task's formula at its own row count (the four add up to the packed GEMM but for x read 4x).
PACKED_PROJECTIONS = ("wq", "wk", "wv", "wg")
TASK_OF_OP = {task.reference.__name__: name for name, task in TASKS.items()}


def _task_shape(op: str, args: Mapping[str, Any], weight: str | None) -> tuple[str, dict[str, Any]] | None:
    if op in TASK_OF_OP and op in OP_SHAPES:
        return TASK_OF_OP[op], OP_SHAPES[op](args)
    if op == "linear" and weight is not None and weight.rsplit(".", 1)[-1] in PACKED_PROJECTIONS:
        return "qkv_gate_gemm", {**_dims(args, "x", "T", "D"), "N": args["weight"].shape[0]}
    return None


class CallLog:
    """What the traced ops saw while `recording`: one OpCall per call, in call order."""

    def __init__(self) -> None:
        self.recording = False
        self.calls: list[OpCall] = []
        self.weights: dict[tuple[int, tuple[int, ...]], str] = {}  # (data_ptr, shape) -> parameter name

    def know_weights(self, model: Beam) -> None:
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if t is not None:
                self.weights.setdefault((t.data_ptr(), tuple(t.shape)), name)

    def record(self, op: str, args: Mapping[str, Any]) -> None:
        weight = next((self.weights[key] for v in args.values() if isinstance(v, torch.Tensor)
                       and (key := (v.data_ptr(), tuple(v.shape))) in self.weights), None)  # fmt: skip
        found = _task_shape(op, args, weight)
        task, cost = None, None
        if found is not None:
            task, params = found
            cost = TASKS[task].cost(Shape(f"{op} call", params))
        self.calls.append(OpCall(op, weight, task, cost))


def traced_ops(ops: ModelOps, log: CallLog) -> ModelOps:
    """`ops` with every field wrapped in a profiler range named after the field (the op)."""
    wrapped = {}
    for f in dataclasses.fields(ModelOps):
        fn = getattr(ops, f.name)
        signature = inspect.signature(getattr(REFERENCE_OPS, f.name))  # the contract every implementation keeps

        def call(*args, _name=f.name, _fn=fn, _signature=signature, **kwargs):
            if log.recording:
                log.record(_name, _signature.bind(*args, **kwargs).arguments)
            with record_function(_name):
                return _fn(*args, **kwargs)

        wrapped[f.name] = call
    return ModelOps(**wrapped)


# ---- the run -------------------------------------------------------------------------------------
def _ceilings(plan: Plan) -> tuple[float | None, float | None]:
    """Copy bandwidth (GB/s) and BF16 GEMM rate (TFLOP/s), measured now on the GPU; none on CPU."""
    if not plan.on_cuda:
        return None, None
    settings = bench.BenchSettings()
    return bench.measure_copy_gbps(settings), bench.measure_gemm_tflops(settings)


def execute(plan: Plan) -> int:
    s, cfg, dev, size = plan.settings, plan.cfg, plan.device, plan.size
    log = CallLog()
    print(f"profile: {cfg.name} {s.scenario} ({size.seqs} x {size.new_tokens} new tokens at {size.context:,} "
          f"context), ops={s.ops}, on {environment.capture().device}; {plan.warmup} warm-up + {plan.steps} "
          f"profiled steps")  # fmt: skip
    model = random_model(cfg, s.seed, dev, ops=traced_ops(plan.ops, log), pack_qkv_gate=plan.pack_qkv_gate)
    log.know_weights(model)
    cache = KVCache(cfg, size.seqs, plan.capacity, dev)
    fill_synthetic_context(cache, model, size.context, s.seed)
    gen = torch.Generator(device=dev).manual_seed(s.seed)
    token_lists = [torch.randint(cfg.vocab_size, (size.new_tokens,), generator=gen, device=dev)
                   for _ in range(size.seqs)]  # fmt: skip
    tokens_B = torch.cat(token_lists)
    snap = cache.snapshot()

    def step() -> None:
        with record_function(STEP_RANGE):
            if s.scenario == "decode":
                model.decode(cache, tokens_B)
            else:
                model.prefill(cache, token_lists)
            if plan.on_cuda:
                torch.cuda.synchronize(dev)  # the step's wall time includes its kernels
        cache.restore(snap)

    for _ in range(plan.warmup):
        step()
    copy_gbps, gemm_tflops = _ceilings(plan)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if plan.on_cuda else [])
    log.recording = True
    with profile(activities=activities) as prof:
        for _ in range(plan.steps):
            step()
    log.recording = False
    plan.run_dir.mkdir(parents=True)
    trace = plan.run_dir / profile_summary.TRACE_FILE
    prof.export_chrome_trace(str(trace))  # every figure is read from it (harness/profile_analysis.py)
    ranges = profile_analysis.trace_ranges(profile_analysis.read_trace(trace), STEP_RANGE, plan.on_cuda)
    tables = profile_analysis.analyze(ranges, log.calls, cfg, plan.steps, copy_gbps, gemm_tflops)
    written = profile_summary.write(plan, tables, copy_gbps, gemm_tflops, environment.capture().to_dict())
    print(profile_summary.console_summary(tables, plan.settings.top))
    print(f"written to {plan.run_dir}/: " + ", ".join(p.name for p in [*written, trace]))
    return 0
