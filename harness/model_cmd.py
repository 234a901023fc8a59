"""`harness model info` and `harness model check`: the reference model's arithmetic, and a whole-model run.

info: parameter counts from a meta-device model (total, active, embedding), the layer pattern
and the KV-cache arithmetic of a preset. Needs no GPU and allocates nothing.

check: builds a preset with seeded random weights on the GPU (on the CPU without one, for small
presets), decodes one token per step at `context` tokens of synthetic context, eagerly and as a
replayed CUDA graph (which must give the eager logits), then prefills `prefill_seqs` sequences of
`prefill_len` new tokens on top of `context` tokens each. Writes one JSON record (figures, the
environment, the reproducing command) under `out`, never overwriting one. Exit code 0 when every
check passed, 1 otherwise.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path

import torch

from harness import environment
from reference_model.cache import KVCache, fill_synthetic_context
from reference_model.config import (
    BF16_BYTES,
    FP8_BYTES,
    BeamConfig,
    get_config,
    kv_bytes_per_token,
    sliding_kv_bytes_per_sequence,
)
from reference_model.model import Beam, parameter_counts
from reference_model.weights import random_model

GIB = 2**30
BENCH_CONTEXT = 100_352  # "about 100K" (BEAM.md §7): 98 x 1024 cached tokens
GRAPH_REL_TOL = 1e-2  # normwise; a replay runs the eager kernels, so any real difference is a bug


@dataclass(frozen=True)
class ModelInfoSettings:
    preset: str = "beam"  # beam | beam-slice | beam-tiny (reference_model/config.py)

    def __post_init__(self) -> None:
        get_config(self.preset)  # raises ValueError naming the known presets


@dataclass(frozen=True)
class ModelCheckSettings:
    preset: str = "beam-slice"  # beam-slice | beam-tiny (beam itself fits no single GPU)
    context: int = BENCH_CONTEXT  # synthetic tokens each sequence holds before decode / prefill
    decode_steps: int = 20  # timed decode steps, eager and graph
    prefill_seqs: int = 8  # sequences in the prefill batch
    prefill_len: int = 2048  # new tokens per sequence
    prefill_repeats: int = 2  # timed prefills (after one warm-up), each from the same cache state
    seed: int = 0  # weights and synthetic context
    out: str = "results/model_check"  # one JSON record per check, never overwritten

    def __post_init__(self) -> None:
        cfg = get_config(self.preset)
        counts = ("context", "decode_steps", "prefill_seqs", "prefill_len", "prefill_repeats")
        problems = [f"{name}={getattr(self, name)} must be >= 1" for name in counts if getattr(self, name) < 1]
        if self.seed < 0:
            problems.append(f"seed={self.seed} must be >= 0")
        longest = self.context + max(self.prefill_len, self.decode_steps + 2)
        if longest > cfg.max_positions:
            problems.append(
                f"context={self.context} plus the new tokens reaches {longest} positions; "
                f"preset {self.preset!r} has max_positions={cfg.max_positions}"
            )
        if problems:
            raise ValueError("invalid model check settings: " + "; ".join(problems))

    def command(self) -> str:
        args = " ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))
        return f"python -m harness model check {args}"


# ---- info ------------------------------------------------------------------------------------
def _count_formatter(largest: int) -> Callable[[int], str]:
    """Parameter counts in one unit, the one that suits the largest: 501.05B / 0.67B, 1.03M / 0.04M."""
    unit, scale = next(((u, s) for u, s in (("B", 1e9), ("M", 1e6)) if largest >= s), ("K", 1e3))
    return lambda n: f"{n / scale:.2f}{unit}"


def layer_pattern(cfg: BeamConfig) -> list[tuple[int, int, str, str]]:
    """Runs of consecutive layers of one kind: (first, last, "dense"|"moe", "sliding"|"global")."""
    runs: list[tuple[int, int, str, str]] = []
    for layer in range(cfg.n_layers):
        kind = ("moe" if cfg.is_moe(layer) else "dense", "global" if cfg.is_global(layer) else "sliding")
        if runs and runs[-1][2:] == kind and runs[-1][1] == layer - 1:
            runs[-1] = (runs[-1][0], layer, *kind)
        else:
            runs.append((layer, layer, *kind))
    return runs


def describe(cfg: BeamConfig) -> str:
    """The text of `harness model info`: counted on a meta-device model, so nothing is allocated."""
    counts = parameter_counts(Beam(cfg, device="meta"))
    fmt = _count_formatter(counts.total)
    lines = [
        f"preset {cfg.name!r}: {cfg.n_layers} layers, hidden {cfg.hidden}, vocab {cfg.vocab_size}, "
        f"heads {cfg.n_heads}/{cfg.n_kv_heads} x {cfg.head_dim}, window {cfg.sliding_window}, "
        f"{cfg.n_experts} experts top-{cfg.top_k} in {cfg.n_groups} groups (best {cfg.topk_groups})",
        f"parameters: total {fmt(counts.total)} ({counts.total:,}); "
        f"active per token {fmt(counts.active)} ({counts.active:,}) plus embedding "
        f"{fmt(counts.embedding)} ({counts.embedding:,})",
        "  by part: " + ", ".join(f"{part} {fmt(n)}" for part, n in counts.by_part.items()),
        f"  weights: {(counts.total + counts.by_part['router']) * BF16_BYTES / GIB:.1f} GiB (BF16, FP32 routers)",
        "layers:",
    ]
    for first, last, ffn, attention in layer_pattern(cfg):
        span = f"{first}" if first == last else f"{first}-{last}"
        lines.append(f"  {span:>7}  {ffn:<5}  {attention}")
    bf16, fp8 = kv_bytes_per_token(cfg, BF16_BYTES), kv_bytes_per_token(cfg, FP8_BYTES)
    lines += [
        f"KV cache: {len(cfg.global_layers)} global layers keep every token: {bf16 / 1024:.1f} KiB per token BF16, "
        f"{fp8 / 1024:.1f} KiB FP8",
        f"  sliding rings: {len(cfg.sliding_layers)} layers x {cfg.sliding_window} slots: "
        f"{sliding_kv_bytes_per_sequence(cfg, BF16_BYTES) / 2**20:.1f} MiB per sequence BF16 "
        f"({sliding_kv_bytes_per_sequence(cfg, FP8_BYTES) / 2**20:.1f} MiB FP8), whatever its length",
    ]
    for label, n_tokens in (("100K", BENCH_CONTEXT), ("2^20", 2**20)):
        lines.append(
            f"  at {label} tokens ({n_tokens:,}): {n_tokens * bf16 / GIB:.2f} GiB BF16, "
            f"{n_tokens * fp8 / GIB:.2f} GiB FP8 per sequence (global layers)"
        )
    return "\n".join(lines)


def info(settings: ModelInfoSettings) -> int:
    print(describe(get_config(settings.preset)))
    return 0


# ---- check -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelCheckRecord:
    preset: str
    device: str
    settings: dict
    parameters_total: int
    weights_gib: float
    init_s: float
    decode_eager_ms: float
    decode_graph_ms: float | None  # None without CUDA
    graph_max_abs_diff: float | None
    graph_rel_diff: float | None  # ||graph - eager|| / ||eager||
    graph_bit_identical: bool | None
    decode_peak_gib: float | None  # None on the CPU
    prefill_ms: float  # median of the timed repeats
    prefill_ms_each: list[float]
    prefill_tokens: int
    prefill_peak_gib: float | None
    peak_memory_gib: float | None
    failures: list[str]
    environment: dict
    command: str
    created_utc: str

    def __post_init__(self) -> None:
        if self.decode_eager_ms <= 0 or self.prefill_ms <= 0:
            raise ValueError(f"timings must be positive; got decode {self.decode_eager_ms}, prefill {self.prefill_ms}")

    @property
    def passed(self) -> bool:
        return not self.failures


def _timed(fn: Callable[[], object], device: torch.device) -> tuple[float, object]:
    """(milliseconds, result) of one call, the device drained before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1e3, result


def _peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def capture_decode_graph(model: Beam, cache: KVCache, tokens_B: torch.Tensor):
    """Capture one decode step in a CUDA graph. Returns (graph, logits buffer the replays fill).

    Warm-up steps run on a side stream first (allocator pools, cuBLAS handles); the cache is
    rewound after them, and capture itself executes nothing.
    """
    snap = cache.snapshot()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            model.decode(cache, tokens_B)
    torch.cuda.current_stream().wait_stream(side)
    cache.restore(snap)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits_BV = model.decode(cache, tokens_B)
    cache.restore(snap)
    return graph, logits_BV


def _check_decode(model: Beam, s: ModelCheckSettings, failures: list[str]) -> dict:
    dev, cfg = model.device, model.cfg
    _reset_peak(dev)
    cache = KVCache(cfg, 1, s.context + s.decode_steps + 2, dev)
    fill_synthetic_context(cache, model, s.context, s.seed)
    gen = torch.Generator(device=dev).manual_seed(s.seed)
    tokens_B = torch.randint(cfg.vocab_size, (1,), generator=gen, device=dev)
    snap = cache.snapshot()
    eager_BV = model.decode(cache, tokens_B).clone()  # also the warm-up
    cache.restore(snap)
    eager_ms, _ = _timed(lambda: [model.decode(cache, tokens_B) for _ in range(s.decode_steps)], dev)
    cache.restore(snap)
    if not torch.isfinite(eager_BV).all():
        failures.append("eager decode logits are not finite")
    figures = {"decode_eager_ms": eager_ms / s.decode_steps, "decode_graph_ms": None, "graph_max_abs_diff": None}
    figures |= {"graph_rel_diff": None, "graph_bit_identical": None}
    if dev.type == "cuda":
        graph, logits_BV = capture_decode_graph(model, cache, tokens_B)
        graph.replay()
        graph_BV = logits_BV.clone()
        cache.restore(snap)
        graph_ms, _ = _timed(lambda: [graph.replay() for _ in range(s.decode_steps)], dev)
        cache.restore(snap)
        rel = float((graph_BV - eager_BV).norm() / eager_BV.norm())
        figures |= {
            "decode_graph_ms": graph_ms / s.decode_steps,
            "graph_max_abs_diff": float((graph_BV - eager_BV).abs().max()),
            "graph_rel_diff": rel,
            "graph_bit_identical": bool(torch.equal(graph_BV, eager_BV)),
        }
        if not rel <= GRAPH_REL_TOL:
            failures.append(f"CUDA-graph decode differs from eager: normwise {rel:.3g} > {GRAPH_REL_TOL}")
        del graph
    figures["decode_peak_gib"] = _peak_gib(dev)
    return figures


def _check_prefill(model: Beam, s: ModelCheckSettings, failures: list[str]) -> dict:
    dev, cfg = model.device, model.cfg
    _reset_peak(dev)
    cache = KVCache(cfg, s.prefill_seqs, s.context + s.prefill_len, dev)
    fill_synthetic_context(cache, model, s.context, s.seed)
    gen = torch.Generator(device=dev).manual_seed(s.seed + 1)
    tokens = [torch.randint(cfg.vocab_size, (s.prefill_len,), generator=gen, device=dev) for _ in range(s.prefill_seqs)]
    snap = cache.snapshot()
    logits_BV = model.prefill(cache, tokens)  # warm-up
    cache.restore(snap)
    if logits_BV.shape != (s.prefill_seqs, cfg.vocab_size) or not torch.isfinite(logits_BV).all():
        failures.append(
            f"prefill logits: shape {tuple(logits_BV.shape)}, finite {bool(torch.isfinite(logits_BV).all())}"
        )
    each = []
    for _ in range(s.prefill_repeats):
        ms, _ = _timed(lambda: model.prefill(cache, tokens), dev)
        each.append(ms)
        cache.restore(snap)
    return {
        "prefill_ms": statistics.median(each),
        "prefill_ms_each": each,
        "prefill_tokens": s.prefill_seqs * s.prefill_len,
        "prefill_peak_gib": _peak_gib(dev),
    }


def write_record(record: ModelCheckRecord, out_dir: str | Path) -> Path:
    """Append-only: a new file per run, named by preset, device kind and UTC time."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    device = "".join(c if c.isalnum() else "-" for c in record.device.split("(")[0].strip())
    stem = f"{record.preset}_{device}_{record.created_utc.replace(':', '')}"
    path, n = out / f"{stem}.json", 1
    while path.exists():
        path, n = out / f"{stem}_{n}.json", n + 1
    path.write_text(json.dumps(asdict(record) | {"passed": record.passed}, indent=2) + "\n")
    return path


def _out_of_memory(phase: str, s: ModelCheckSettings, device_name: str, dev: torch.device, error: Exception) -> int:
    """A phase that ran out of GPU memory: what it asked for, on which GPU, and the settings that shrink it
    (beam-slice's 8 x 2048 prefill at 100K context peaked at 86.0 GiB on an H200: more than an H100 has)."""
    total = torch.cuda.get_device_properties(dev).total_memory / GIB if dev.type == "cuda" else None
    on = f"{device_name} ({total:.1f} GiB)" if total is not None else device_name
    shrink = ("context", "decode_steps") if phase == "decode" else ("prefill_seqs", "prefill_len", "context")
    now = ", ".join(f"{name}={getattr(s, name)}" for name in shrink)
    print(f"error: the {phase} check of {s.preset!r} ran out of memory on {on}: {str(error).splitlines()[0]}\n"
          f"  no record written; smaller values of {now} shrink it", file=sys.stderr)  # fmt: skip
    return 1


def check(settings: ModelCheckSettings) -> int:
    cfg = get_config(settings.preset)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    env = environment.capture()
    failures: list[str] = []
    print(f"model check: preset {cfg.name!r} on {env.device}; {settings.command()}")
    init_ms, model = _timed(lambda: random_model(cfg, settings.seed, dev), dev)
    counts = parameter_counts(model)
    print(f"  weights: {_count_formatter(counts.total)(counts.total)} parameters, built in {init_ms / 1e3:.1f} s")
    try:
        decode = _check_decode(model, settings, failures)
    except torch.OutOfMemoryError as e:
        return _out_of_memory("decode", settings, env.device, dev, e)
    print(f"  decode at {settings.context:,} context: eager {decode['decode_eager_ms']:.2f} ms/step", end="")
    if decode["decode_graph_ms"] is not None:
        print(
            f", CUDA graph {decode['decode_graph_ms']:.2f} ms/step "
            f"(vs eager: max |diff| {decode['graph_max_abs_diff']:.3g}, bit-identical {decode['graph_bit_identical']})"
        )
    else:
        print(" (no CUDA: graph replay skipped)")
    try:
        prefill = _check_prefill(model, settings, failures)
    except torch.OutOfMemoryError as e:
        return _out_of_memory("prefill", settings, env.device, dev, e)
    shape = f"{settings.prefill_seqs} x {settings.prefill_len}"
    print(f"  prefill {shape} at {settings.context:,} context: {prefill['prefill_ms']:.1f} ms")
    record = ModelCheckRecord(
        preset=cfg.name,
        device=env.device,
        settings=asdict(settings),
        parameters_total=counts.total,
        weights_gib=sum(p.numel() * p.element_size() for p in model.parameters()) / GIB,
        init_s=init_ms / 1e3,
        **decode,
        **prefill,
        peak_memory_gib=max(decode["decode_peak_gib"], prefill["prefill_peak_gib"]) if dev.type == "cuda" else None,
        failures=failures,
        environment=env.to_dict(),
        command=settings.command(),
        created_utc=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    path = write_record(record, settings.out)
    print(f"  {'passed' if record.passed else 'FAILED: ' + '; '.join(failures)}; record: {path}")
    return 0 if record.passed else 1
