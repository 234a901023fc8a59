"""`harness bench model`: the whole model, reference against optimized, in the scenarios of BEAM.md §7.

    harness bench model                                     beam-slice on the GPU (beam-tiny on CPU)
    harness bench model candidates=present                  every task's first candidate file, promoted or not
    harness bench model "ops=[moe_experts:reference]"       any task pinned to the reference, a file or a path

Scenarios: decode, batch 1, one token at `context` (~100K) cached tokens (filled synthetically);
prefill, `prefill_seqs` x `prefill_len` new tokens on top of `context` each. Variants, all on ONE
model (beam-slice is 66 GB: built once, its ops swapped, its q|k|v|gate projection switched
between packed and four GEMMs):
  reference           the reference ops, eager; decode steps launched one by one
  reference+compile   the fair peer: every reference op under torch.compile, and the decode step
                      captured in a CUDA graph (prefill is not graph-captured, as in a serving
                      engine). The MoE experts' prefill path groups tokens on the host: eager.
  optimized           the promoted candidates, the library paths, packing, decode CUDA graph;
                      the pointwise ops without a promoted candidate compiled (compiled:<op>)
  +<change>           the waterfall: changes added one at a time, in CHANGE_ORDER, from the
                      eager reference
  -<change>           the optimized model with one change removed (removing pack_qkv_gate also
                      idles a qkv_gate_gemm candidate: the unpacked model runs four projections)
Decode is timed in `decode_windows` windows of `decode_steps` consecutive steps (graph replays, or
eager steps), prefill as `prefill_repeats` runs after one warm-up; the cache is rewound before
each window and run, and the median is reported (every window and run is in the record).

Alongside: the physical floor of a decode step (the bytes it must read: every weight a token
uses, the 8 chosen experts only, the LM head, the KV cache at `context`) over the copy bandwidth
measured in the same process; kernels launched per dense and per MoE layer in one eager decode
step (torch.profiler kernel events inside the "L{l}.attention" + "L{l}.mlp"/"L{l}.moe" ranges);
the first decode step's logits of every variant against the reference's (a wiring check).
A variant or a phase that fails (beam-slice's prefill runs out of memory on an 80 GB GPU) is recorded
with its error, the rest is still timed and written, and the exit status is 1; running out of memory
names the sizes that asked for it and the settings that shrink them.
Records: results/model_bench/records.jsonl (one line per run, environment and reproducing
command), a PNG chart (<run>_waterfall.png, or <run>_variants.png with waterfall=false: the peers and
the optimized model alone) and a Markdown summary beside it (harness/bench_model_report.py).

On the CPU the command runs on beam-tiny through the Triton interpreter, so that CI exercises it:
its timings are labelled not meaningful, and there is no floor, graph or compiled peer.
"""

from __future__ import annotations

import os
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import TypeVar

import torch

from harness import environment, library_paths, optimized_model
from harness.optimized_model import CandidateChoice, LibraryOp, OptimizedOps
from harness.records import error_line
from reference_model import ops as reference_ops
from reference_model.cache import KVCache, fill_synthetic_context
from reference_model.config import get_config
from reference_model.model import Beam
from reference_model.ops import REFERENCE_OPS, ModelOps
from reference_model.weights import random_model
from tasks import get_task

# The waterfall's order: the model-level switches, the library paths, the compiled ops, then the tasks in the order
# of BEAM.md §6 (and the two routing/expert tasks beyond it).
CHANGE_ORDER = (
    "cuda_graph", "pack_qkv_gate", "library:attention", "library:moe_experts",
    "compiled:rms_norm", "compiled:output_gate", "compiled:swiglu",
    "fuse_norm", "qk_norm_rope", "output_gate", "router_gemm", "qkv_gate_gemm", "dense_act", "moe_route", "moe_experts",
)  # fmt: skip
CHOICE_MODES = ("promoted", "present")
GPU_DEFAULTS = {"preset": "beam-slice", "context": 100_352, "decode_steps": 20, "decode_windows": 5, "prefill_seqs": 8,
                "prefill_len": 2048}  # fmt: skip
CPU_DEFAULTS = {"preset": "beam-tiny", "context": 24, "decode_steps": 2, "decode_windows": 1, "prefill_seqs": 2,
                "prefill_len": 6}  # fmt: skip


@dataclass(frozen=True)
class BenchModelSettings:
    preset: str = ""  # "": beam-slice on the GPU, beam-tiny on the CPU
    context: int = 0  # cached tokens per sequence before a step; 0: 100352 on the GPU, 24 on the CPU
    decode_steps: int = 0  # consecutive decode steps per timed window; 0: 20 (GPU), 2 (CPU)
    decode_windows: int = 0  # timed windows per variant, each from the same cache state (median); 0: 5 / 1
    prefill_seqs: int = 0  # sequences in one prefill; 0: 8 (GPU), 2 (CPU)
    prefill_len: int = 0  # new tokens per sequence; 0: 2048 (GPU), 6 (CPU)
    prefill_repeats: int = 2  # timed prefills per variant, after one warm-up
    candidates: str = "promoted"  # "promoted": the promotion records; "present": each task's first file
    ops: tuple[str, ...] = ()  # "task:choice" overrides, choice = reference | file stem | path
    compile_peer: bool = True  # time reference+compile (GPU only)
    waterfall: bool = True  # time the +change / -change variants
    libraries: bool = True  # library attention and MoE-expert paths, compiled pointwise ops (GPU only)
    seed: int = 0  # weights, synthetic context and tokens
    out: str = "results/model_bench"  # records, summaries and charts
    results_dir: str | None = None  # promotion records; default <repo>/results

    def __post_init__(self) -> None:
        problems = []
        if self.candidates not in CHOICE_MODES:
            problems.append(f"candidates must be one of {list(CHOICE_MODES)}; got {self.candidates!r}")
        for name in ("context", "decode_steps", "decode_windows", "prefill_seqs", "prefill_len"):
            if getattr(self, name) < 0:
                problems.append(f"{name}={getattr(self, name)} must be >= 0 (0: the default)")
        if self.prefill_repeats < 1 or self.seed < 0:
            problems.append(f"prefill_repeats={self.prefill_repeats} must be >= 1, seed={self.seed} >= 0")
        bad = [o for o in self.ops if o.count(":") != 1 or not all(o.split(":"))]
        if bad:
            problems.append(f"ops entries must read task:choice (choice: reference, a file stem or a path); got {bad}")
        if self.preset:
            get_config(self.preset)  # raises naming the known presets
        if problems:
            raise ValueError("invalid bench model settings: " + "; ".join(problems))

    def command(self) -> str:
        """The command line that reproduces these settings (the fields that differ from the defaults)."""
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value != (f.default if f.default is not MISSING else f.default_factory()):
                parts.append(f"{f.name}=[{','.join(value)}]" if f.name == "ops" else f"{f.name}={value}")
        return " ".join(["python -m harness bench model", *parts])


@dataclass(frozen=True)
class Plan:
    """The settings with every default resolved for the device."""

    settings: BenchModelSettings
    device: torch.device
    preset: str
    context: int
    decode_steps: int
    decode_windows: int
    prefill_seqs: int
    prefill_len: int

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"


def make_plan(settings: BenchModelSettings) -> Plan:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    defaults = GPU_DEFAULTS if device.type == "cuda" else CPU_DEFAULTS
    resolved = {k: getattr(settings, k) or v for k, v in defaults.items()}
    cfg = get_config(resolved["preset"])
    longest = resolved["context"] + max(resolved["prefill_len"], resolved["decode_steps"] + 4)
    if longest > cfg.max_positions:
        raise ValueError(f"context {resolved['context']} + new tokens reach {longest} > max_positions "
                         f"{cfg.max_positions} of preset {cfg.name!r}")  # fmt: skip
    return Plan(settings, device, **resolved)


# ---- what the optimized model is made of ------------------------------------------------------------
def choose_candidates(settings: BenchModelSettings, gpu: str | None = None) -> dict[str, CandidateChoice]:
    """The candidates of the optimized model: those in force on `gpu` (None: no GPU), or the first file of each
    task, then `ops=` overrides."""
    if settings.candidates == "promoted":
        chosen = optimized_model.promoted_choices(settings.results_dir, gpu=gpu)
    else:
        present = optimized_model.present_candidates()
        chosen = optimized_model.explicit_choices({t: names[0] for t, names in present.items() if names})
    for entry in settings.ops:
        task, choice = entry.split(":")
        if choice == "reference":
            get_task(task)  # raises naming the known tasks
            chosen.pop(task, None)
        else:
            chosen.update(optimized_model.explicit_choices({task: choice}))
    return chosen


@dataclass(frozen=True)
class Variant:
    name: str
    kind: str  # "peer", "optimized", "added", "removed"
    changes: tuple[str, ...]  # the CHANGE_ORDER names in force
    compiled: bool = False


def available_changes(choices: dict[str, CandidateChoice], library: dict[str, LibraryOp], on_gpu: bool) -> list[str]:
    """The changes in force, in CHANGE_ORDER. A compiled path stands in for a missing candidate:
    with a candidate chosen for its op it never runs, so it is no change."""
    with_candidate = {optimized_model.TASK_FIELDS[t] for t in choices}
    paths = [lib.change for f, lib in library.items() if lib.kind != "compiled" or f not in with_candidate]
    present = {"pack_qkv_gate", *choices, *paths}
    if on_gpu:
        present.add("cuda_graph")
    return [c for c in CHANGE_ORDER if c in present]


def variants(changes: list[str], waterfall: bool, compile_peer: bool) -> list[Variant]:
    out = [Variant("reference", "peer", ())]
    if compile_peer:
        out.append(Variant("reference+compile", "peer", ("cuda_graph",), compiled=True))
    out.append(Variant("optimized", "optimized", tuple(changes)))
    if waterfall:
        out += [Variant(f"+{c}", "added", tuple(changes[: i + 1])) for i, c in enumerate(changes[:-1])]
        out += [Variant(f"-{c}", "removed", tuple(x for x in changes if x != c)) for c in changes]
    return out


def variant_ops(variant: Variant, choices, library, cfg, device) -> OptimizedOps | ModelOps:
    if variant.compiled:
        return compiled_reference_ops()
    chosen = {t: c for t, c in choices.items() if t in variant.changes}
    libs = {f: op for f, op in library.items() if op.change in variant.changes}
    return optimized_model.build_ops(chosen, cfg, device, libs, pack_qkv_gate="pack_qkv_gate" in variant.changes)


_COMPILED: ModelOps | None = None


def compiled_reference_ops() -> ModelOps:
    """Every reference op under torch.compile (built once per process: compiled per shape on use).
    The experts' grouped prefill path syncs with the host per expert: it stays eager. An op that
    torch.compile cannot handle runs eagerly (dynamo's suppress_errors: the peer is then no worse
    than the eager reference there, and the run goes on); the recompile limit is raised so that the
    ops called at many sizes (12 residual indices, 7 GEMM shapes) stay compiled."""
    global _COMPILED
    if _COMPILED is None:
        dynamo = torch._dynamo.config
        dynamo.suppress_errors = True
        dynamo.recompile_limit = max(dynamo.recompile_limit, 64)
        fields = {f: torch.compile(getattr(REFERENCE_OPS, f)) for f in ModelOps.__dataclass_fields__}
        compiled_experts = fields["moe_experts"]

        def moe_experts(x_TD, weights_Tk, ids_Tk, w_gate_EFD, w_up_EFD, w_down_EDF):
            few = ids_Tk.numel() <= w_gate_EFD.shape[0]
            fn = compiled_experts if few else reference_ops.moe_experts
            return fn(x_TD, weights_Tk, ids_Tk, w_gate_EFD, w_up_EFD, w_down_EDF)

        fields["moe_experts"] = moe_experts
        _COMPILED = ModelOps(**fields)
    return _COMPILED


# ---- measuring ----------------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _elapsed_ms(fn: Callable[[], object], device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return (time.perf_counter() - start) * 1e3


@dataclass
class Measurement:
    decode_ms: float | None = None  # median over windows of the per-step time
    prefill_ms: float | None = None  # median over repeats
    decode_ms_windows: list[float] = field(default_factory=list)
    prefill_ms_repeats: list[float] = field(default_factory=list)
    decode_logits_err: float | None = None  # first decode step vs the reference's, normwise
    errors: list[str] = field(default_factory=list)


class DecodeBench:
    """One sequence at `context` cached tokens; every variant decodes from the same snapshot."""

    def __init__(self, model: Beam, plan: Plan):
        self.model, self.plan = model, plan
        self.cache = KVCache(model.cfg, 1, plan.context + plan.decode_steps + 8, model.device)
        fill_synthetic_context(self.cache, model, plan.context, plan.settings.seed)
        gen = torch.Generator(device=model.device).manual_seed(plan.settings.seed)
        self.tokens_B = torch.randint(model.cfg.vocab_size, (1,), generator=gen, device=model.device)
        self.snapshot = self.cache.snapshot()
        self.reference_logits: torch.Tensor | None = None

    def run(self, graph: bool) -> tuple[list[float], torch.Tensor]:
        """(ms per step of each timed window, the first step's logits). Every window starts from the
        snapshot, so each times the same `decode_steps` steps."""
        model, cache, plan, dev = self.model, self.cache, self.plan, self.model.device
        cache.restore(self.snapshot)
        first = model.decode(cache, self.tokens_B).float().clone()  # also the warm-up (autotuning, compile)
        cache.restore(self.snapshot)
        if graph:
            from harness.model_cmd import capture_decode_graph

            cuda_graph, logits_BV = capture_decode_graph(model, cache, self.tokens_B)
            cuda_graph.replay()
            first = logits_BV.float().clone()
            step = cuda_graph.replay
        else:
            step = lambda: model.decode(cache, self.tokens_B)  # noqa: E731
        windows = []
        for _ in range(plan.decode_windows):
            cache.restore(self.snapshot)
            windows.append(_elapsed_ms(lambda: [step() for _ in range(plan.decode_steps)], dev) / plan.decode_steps)
        cache.restore(self.snapshot)
        return windows, first


class PrefillBench:
    def __init__(self, model: Beam, plan: Plan):
        self.model, self.plan = model, plan
        n, length = plan.prefill_seqs, plan.prefill_len
        self.cache = KVCache(model.cfg, n, plan.context + length, model.device)
        fill_synthetic_context(self.cache, model, plan.context, plan.settings.seed)
        gen = torch.Generator(device=model.device).manual_seed(plan.settings.seed + 1)
        self.tokens = [torch.randint(model.cfg.vocab_size, (length,), generator=gen, device=model.device)
                       for _ in range(n)]  # fmt: skip
        self.snapshot = self.cache.snapshot()

    def run(self) -> list[float]:
        """Milliseconds of each timed prefill (after one warm-up), each from the same cache state."""
        model, cache, dev = self.model, self.cache, self.model.device
        cache.restore(self.snapshot)
        model.prefill(cache, self.tokens)  # warm-up
        times = []
        for _ in range(self.plan.settings.prefill_repeats):
            cache.restore(self.snapshot)
            times.append(_elapsed_ms(lambda: model.prefill(cache, self.tokens), dev))
        cache.restore(self.snapshot)
        return times


def apply_variant(model: Beam, ops: ModelOps, packed: bool) -> None:
    optimized_model.set_ops(model, ops)
    optimized_model.set_packed(model, packed)


def count_kernels(model: Beam, decode: DecodeBench, configs: dict[str, tuple[ModelOps, bool]], failures: list[str]
                  ) -> dict[str, dict | None]:  # fmt: skip
    """Kernels per sublayer range in one eager decode step of each configuration (None if it failed)."""
    from harness.bench_model_report import profile_decode_step

    counts: dict[str, dict | None] = {}
    for name, (ops, packed) in configs.items():
        counts[name] = None
        try:
            apply_variant(model, ops, packed)
            decode.cache.restore(decode.snapshot)
            model.decode(decode.cache, decode.tokens_B)  # warm: autotuning and compilation stay out of the profile
            decode.cache.restore(decode.snapshot)
            step = lambda: model.decode(decode.cache, decode.tokens_B)  # noqa: E731
            counts[name] = profile_decode_step(step, decode.plan.on_gpu)
        except Exception as e:  # recorded; the timings go on
            failures.append(f"kernel count {name}: {error_line(e, 300)}")
        decode.cache.restore(decode.snapshot)
    return counts


_Bench = TypeVar("_Bench", DecodeBench, PrefillBench)


def measure_all(model: Beam, plan: Plan, runs: list[tuple[Variant, ModelOps, bool]],
                count_configs: dict[str, tuple[ModelOps, bool]], echo: Callable[[str], None], began: float
                ) -> tuple[dict[str, Measurement], dict[str, dict | None], list[str]]:  # fmt: skip
    """Kernel counts and decode for every variant, then prefill for every variant (one cache alive at
    a time). A variant that fails is recorded with its error and the others go on: one broken path
    must not cost the whole GPU run. Progress lines carry the seconds since `began`."""
    results = {v.name: Measurement() for v, _, _ in runs}
    failures: list[str] = []
    counts: dict[str, dict | None] = dict.fromkeys(count_configs)
    decode = _set_up("decode", DecodeBench, model, plan, results, echo, began)
    if decode is not None:
        counts = count_kernels(model, decode, count_configs, failures)
        echo(f"  {_since(began)} kernels counted: {', '.join(count_configs)}")
        for variant, ops, packed in runs:
            m = results[variant.name]
            try:
                apply_variant(model, ops, packed)
                graph = plan.on_gpu and "cuda_graph" in variant.changes
                m.decode_ms_windows, first = decode.run(graph)
                m.decode_ms = statistics.median(m.decode_ms_windows)
                if decode.reference_logits is None:
                    decode.reference_logits = first
                diff = first - decode.reference_logits
                m.decode_logits_err = float(diff.double().norm() / decode.reference_logits.double().norm())
            except Exception as e:  # the variant's failure is data; the harness goes on with the others
                m.errors.append(failure_text("decode", e, plan))
                echo(traceback.format_exc(limit=3))
            echo(f"  {_since(began)} decode  {variant.name:<24} {_fmt(m.decode_ms)} ms")
    del decode
    _release(plan.device)
    prefill = _set_up("prefill", PrefillBench, model, plan, results, echo, began)
    if prefill is not None:
        reuse: dict[tuple, list[float]] = {}
        for variant, ops, packed in runs:
            m = results[variant.name]
            key = (id(ops) if variant.compiled else tuple(c for c in variant.changes if c != "cuda_graph"), packed)
            try:
                if key not in reuse:  # the graph does not change prefill: "+cuda_graph" reuses the reference's
                    apply_variant(model, ops, packed)
                    reuse[key] = prefill.run()
                m.prefill_ms_repeats = reuse[key]
                m.prefill_ms = statistics.median(m.prefill_ms_repeats)
            except Exception as e:
                m.errors.append(failure_text("prefill", e, plan))
                echo(traceback.format_exc(limit=3))
            echo(f"  {_since(began)} prefill {variant.name:<24} {_fmt(m.prefill_ms)} ms")
    del prefill
    _release(plan.device)
    apply_variant(model, REFERENCE_OPS, False)
    return results, counts, failures


def _set_up(phase: str, bench: Callable[[Beam, Plan], _Bench], model: Beam, plan: Plan,
            results: dict[str, Measurement], echo: Callable[[str], None], began: float) -> _Bench | None:  # fmt: skip
    """The phase's cache and inputs (`bench(model, plan)`), or None when they cannot be made: that
    failure (running out of memory, most often) is then every variant's, recorded, and the run goes on."""
    try:
        return bench(model, plan)
    except Exception as e:
        text = failure_text(phase, e, plan)
        for m in results.values():
            m.errors.append(text)
        echo(f"  {_since(began)} {phase} not timed: {text}")
        return None  # the caller releases the cached memory once the phase is over


def failure_text(phase: str, e: BaseException, plan: Plan) -> str:
    """A phase's failure as the record carries it; running out of GPU memory names the sizes that asked
    for it and the settings that make them smaller."""
    if not isinstance(e, torch.OutOfMemoryError):
        return f"{phase}: {error_line(e, 300)}"
    if phase == "decode":
        size, knobs = f"one sequence at a {plan.context}-token context", "context"
    else:
        size = f"{plan.prefill_seqs} x {plan.prefill_len} new tokens at a {plan.context}-token context"
        knobs = "prefill_seqs, prefill_len or context"
    return f"{phase}: out of GPU memory for {size} ({plan.preset}; smaller {knobs} may fit): {error_line(e, 160)}"


def _since(began: float) -> str:
    return f"[{time.perf_counter() - began:6.1f} s]"


def _fmt(ms: float | None) -> str:
    return "   failed" if ms is None else f"{ms:9.3f}"


def _release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def build_runs(plan: Plan, model: Beam, echo: Callable[[str], None], began: float) -> tuple[list, OptimizedOps, dict]:
    """(variant, ops, packed) for every variant, the full optimized ops, and the library paths; a
    progress line, stamped from `began`, after each step (on fresh GPU machines they took 138-206 s in all)."""
    cfg, s = model.cfg, plan.settings

    def step(what: str) -> None:
        echo(f"  {_since(began)} {what}")

    choices = choose_candidates(s, environment.gpu() if plan.on_gpu else None)
    library = library_paths.library_ops(plan.device, cfg, step) if s.libraries else {}
    changes = available_changes(choices, library, plan.on_gpu)
    runs = []
    for v in variants(changes, s.waterfall, s.compile_peer and plan.on_gpu):
        built = variant_ops(v, choices, library, cfg, plan.device)
        ops = built if isinstance(built, ModelOps) else built.ops
        packed = not v.compiled and "pack_qkv_gate" in v.changes
        runs.append((v, ops, packed))
        loaded = sum(t in v.changes for t in choices)
        plural = "" if loaded == 1 else "s"
        step(
            f"variant {v.name}: ops built" + ("" if v.compiled else f" ({loaded} candidate{plural} loaded and probed)")
        )
    optimized = optimized_model.build_ops(choices, cfg, plan.device, library)
    echo("optimized model:\n" + optimized.describe())
    return runs, optimized, library


def bench(settings: BenchModelSettings, echo: Callable[[str], None] = print) -> int:
    from harness import bench as op_bench
    from harness import bench_model_report as report

    began = time.perf_counter()  # every phase is stamped from here, so a run cut short shows where the time went
    plan = make_plan(settings)
    if not plan.on_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any candidate kernel is decorated
    env = environment.capture()
    cfg = get_config(plan.preset)
    echo(f"bench model: {cfg.name} on {env.device}; {settings.command()}")
    if not plan.on_gpu:
        echo("  (CPU, Triton interpreter: timings are NOT meaningful; no CUDA graph, compiled peer or floor)")
    model = random_model(cfg, settings.seed, plan.device, pack_qkv_gate=True)
    echo(f"  {_since(began)} model built")
    runs, optimized, _ = build_runs(plan, model, echo, began)
    echo(f"  {_since(began)} {len(runs)} variants built")
    copy_gbps = op_bench.measure_copy_gbps(op_bench.BenchSettings()) if plan.on_gpu else None
    if copy_gbps is not None:
        echo(f"  {_since(began)} copy bandwidth {copy_gbps:.0f} GB/s")
    configs = {"reference": (REFERENCE_OPS, False), "optimized": (optimized.ops, optimized.pack_qkv_gate)}
    results, counts, failures = measure_all(model, plan, runs, configs, echo, began)
    record = report.make_record(plan, env.to_dict(), [v for v, _, _ in runs], results, optimized, counts, copy_gbps,
                                time.perf_counter() - began, failures)  # fmt: skip
    paths = report.write(record, Path(settings.out))
    echo(f"  {_since(began)} record, summary and chart written")
    echo(report.console_table(record.to_dict()))
    for failure in record.failures:
        echo(f"failed: {failure}")
    echo(f"records: {paths['records']}\nsummary: {paths['summary']}\nchart:   {paths['chart']}")
    return 0 if not record.failures else 1


# `harness bench model` (harness/cli.py): the entry point's name.
main = bench
