"""Library kernels the optimized model uses on the GPU: attention, and the MoE experts above decode sizes.

Which and why (measurements: TOOLCHAIN.md, H200, Beam's shapes):
- Prefill attention: flashinfer `single_prefill_with_kv_cache` (FA3 backend on sm90): 2048
  queries over 100352 keys in 7.9 ms = 643 TFLOP/s, against 14.5 ms for torch SDPA. Fallback when
  flashinfer is missing or refuses: torch's FlashAttention-2 (`aten::_flash_attention_forward`,
  varlen, bottom-right causal with a left window). Both need the keys in position order, ending
  at the last query: `prefill_layout` sorts a sliding layer's ring copy by position and drops its
  empty slots (a host sync, which prefill does anyway); a layout that is not one contiguous run
  of positions falls back to the reference.
- Decode attention (one query, the sequence's newest token at position p): torch's
  FlashAttention-2 varlen over the first n = min(p + 1, S) rows of the layer's region, with
  `seqused_k` = n computed ON the device from the query's position, so the step stays free of host
  syncs and replays in a CUDA graph (FA2 splits the keys over the SMs for one query). A global
  layer's region holds positions 0..p in rows 0..p and nothing after them; a sliding layer's ring
  of W slots holds positions 0..p in rows 0..p before it wraps and, after, exactly the last W
  positions, which are the window (reference_model/cache.py). Attention is a sum over keys, so
  the ring's rotation does not matter, and no mask is needed: the build-time probe checks a
  region with an empty tail, a full rotated ring and a part-full one. Plain SDPA cannot take the
  length; flashinfer 0.6.0's single_decode refuses Beam's GQA group of 6. The previous sliding
  path, SDPA with the boolean visibility mask of the positions (the fallback here), took 14 us
  in cuDNN plus 10 mask kernels per layer for a 1 MB ring on the H200 (eighth session's decode
  profile), where the ring's read floor is 0.25 us.
- MoE experts: torch._grouped_mm (CUTLASS grouped GEMM on sm90): 442 TFLOP/s at 16384 tokens,
  deterministic, sync-free (tasks/moe_experts.py grouped_mm_experts). With a promoted moe_experts
  candidate it runs only above the candidate's task shapes (T > 1000): decode is the candidate's
  (harness/optimized_model.py build_ops).
  flashinfer's cutlass_fused_moe is not used: its fused finalize sums with atomics.
- Pointwise ops with no promoted candidate (rms_norm, output_gate, swiglu): Inductor's fusion of
  the reference op (`torch.compile`), one kernel per call where the eager reference launches 9, 7
  and 6 (eighth session's decode profile: 14.7, 66 and 31 us of the 2.06 ms step). This is the
  `compile` baseline of the op's task: its candidates tie it at decode sizes and at the copy floor
  (results/README.md), so none beats it beyond noise and none is promoted; the model runs the
  baseline that wins instead of the eager reference. A promoted candidate replaces it.
Every attention path is probed once at build time against ops.attention on small inputs at the
model's head sizes, and every compiled op against its reference (within one BF16 ulp: Inductor
computes sigmoid with ex2.approx and sums in another order); a path that raises or disagrees is
replaced by the reference, and the reason is part of the op's recorded source.

Shape legend: T queries, S keys, H query heads, K kv heads, G = H/K, Dh head dim.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from harness.optimized_model import LibraryOp
from harness.records import error_line
from reference_model import ops
from reference_model.config import BeamConfig
from tasks import moe_experts as moe_experts_task

PROBE_REL_TOL = 1e-2  # normwise vs ops.attention: BF16 P @ V perturbs by about one BF16 ulp (2^-8)
PrefillKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int | None], torch.Tensor]
DecodeKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
SlidingDecode = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]


# ---- the layouts the kernels need -----------------------------------------------------------------
@dataclass(frozen=True)
class PrefillLayout:
    """Keys reordered into one contiguous run of positions ending at the last query's (`rows`,
    None when they already are), queries the last T positions of that run."""

    rows: torch.Tensor | None


def prefill_layout(q_positions_T: torch.Tensor, k_positions_S: torch.Tensor) -> PrefillLayout | None:
    """The reordering that puts the visible keys in position order (empty slots dropped), or None
    when the keys are not one contiguous run of positions whose end is the last query (then a
    position-order kernel with bottom-right causal alignment would compute something else)."""
    valid_S = k_positions_S >= 0
    n_empty = int((~valid_S).sum())
    in_order = n_empty == 0 and bool((k_positions_S[1:] > k_positions_S[:-1]).all())
    rows = None if in_order else torch.argsort(k_positions_S)[n_empty:]
    kp = k_positions_S if rows is None else k_positions_S[rows]
    T, S = q_positions_T.shape[0], kp.shape[0]
    if S < T:
        return None
    first, last = int(kp[0]), int(kp[-1])
    contiguous = last - first + 1 == S and bool((kp[1:] - kp[:-1] == 1).all())
    queries_last = bool((q_positions_T == torch.arange(last - T + 1, last + 1, device=kp.device)).all())
    return PrefillLayout(rows) if contiguous and queries_last else None


# ---- kernels ------------------------------------------------------------------------------------------
def _scale(q: torch.Tensor) -> float:
    return 1.0 / math.sqrt(q.shape[-1])


def flashinfer_prefill() -> PrefillKernel:
    """flashinfer's single-request prefill, causal (bottom-right), left window W-1 on sliding layers."""
    import flashinfer  # noqa: PLC0415 (GPU machine only; JIT-compiles on first use)

    def kernel(q_THD, k_SKD, v_SKD, window):
        return flashinfer.single_prefill_with_kv_cache(
            q_THD, k_SKD, v_SKD, causal=True, kv_layout="NHD", window_left=-1 if window is None else window - 1
        )

    return kernel


def torch_flash_prefill(q_THD, k_SKD, v_SKD, window):
    """torch's FlashAttention-2, one varlen sequence: bottom-right causal, left window W-1."""
    T, S, dev = q_THD.shape[0], k_SKD.shape[0], q_THD.device
    cu_q = torch.tensor([0, T], dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0, S], dtype=torch.int32, device=dev)
    left = -1 if window is None else window - 1
    return torch.ops.aten._flash_attention_forward(
        q_THD, k_SKD, v_SKD, cu_q, cu_k, T, S, 0.0, True, False, scale=_scale(q_THD),
        window_size_left=left, window_size_right=0,
    )[0]  # fmt: skip


def torch_flash_decode(q_THD, k_SKD, v_SKD, q_positions_T):
    """The newest token's query (position p) over the first min(p + 1, S) rows, counted on the device."""
    S, dev = k_SKD.shape[0], q_THD.device
    n_used = torch.empty(1, dtype=torch.int32, device=dev)
    torch.add(q_positions_T[:1].clamp(max=S - 1), 1, out=n_used)
    cu_q = torch.arange(2, dtype=torch.int32, device=dev)  # [0, 1], built on the device: capturable
    return torch.ops.aten._flash_attention_forward(
        q_THD, k_SKD, v_SKD, cu_q, cu_q * S, 1, S, 0.0, False, False, scale=_scale(q_THD), seqused_k=n_used,
    )[0]  # fmt: skip


def masked_decode(q_THD, k_SKD, v_SKD, q_positions_T, k_positions_S, window):
    """One query, exact visibility from the positions: SDPA with a boolean mask, GQA group folded
    into the query-length dim ([1, K, G, Dh] queries against [1, K, S, Dh] keys)."""
    _, H, Dh = q_THD.shape
    K = k_SKD.shape[1]
    kp_S, qp = k_positions_S, q_positions_T[0]
    visible_S = (kp_S >= 0) & (kp_S <= qp)
    if window is not None:
        visible_S &= kp_S > qp - window
    q4 = q_THD.view(1, K, H // K, Dh)
    out = F.scaled_dot_product_attention(
        q4, k_SKD.permute(1, 0, 2)[None], v_SKD.permute(1, 0, 2)[None], attn_mask=visible_S[None, None, None, :]
    )
    return out.reshape(1, H, Dh)


def ring_decode(kernel: DecodeKernel) -> SlidingDecode:
    """A DecodeKernel on a sliding layer's ring of `window` slots, every filled slot of which is in
    the window (module doc); any other key layout goes to the reference."""

    def sliding(q_THD, k_SKD, v_SKD, q_positions_T, k_positions_S, window):
        if k_SKD.shape[0] != window:
            return ops.attention(q_THD, k_SKD, v_SKD, q_positions_T, k_positions_S, window)
        return kernel(q_THD, k_SKD, v_SKD, q_positions_T)

    return sliding


# ---- the op ---------------------------------------------------------------------------------------------
class LibraryAttention:
    """ops.attention through library kernels where the layout allows it, the reference elsewhere.

    decode_global: a DecodeKernel for one query on a global layer (None: the reference);
    decode_sliding: a SlidingDecode for one query on a sliding layer (None: the reference);
    prefill: a PrefillKernel for many queries (None: the reference).
    """

    def __init__(self, decode_global: DecodeKernel | None, decode_sliding: SlidingDecode | None,
                 prefill: PrefillKernel | None):  # fmt: skip
        self.decode_global, self.decode_sliding, self.prefill = decode_global, decode_sliding, prefill

    def __call__(self, q_THD, k_SKD, v_SKD, q_positions_T, k_positions_S, window, query_chunk=256):
        if q_THD.shape[0] == 1:
            if window is None and self.decode_global is not None:
                return self.decode_global(q_THD, k_SKD, v_SKD, q_positions_T)
            if window is not None and self.decode_sliding is not None:
                return self.decode_sliding(q_THD, k_SKD, v_SKD, q_positions_T, k_positions_S, window)
        elif self.prefill is not None:
            layout = prefill_layout(q_positions_T, k_positions_S)
            if layout is not None:
                if layout.rows is not None:
                    k_SKD, v_SKD = k_SKD.index_select(0, layout.rows), v_SKD.index_select(0, layout.rows)
                return self.prefill(q_THD, k_SKD, v_SKD, window)
        return ops.attention(q_THD, k_SKD, v_SKD, q_positions_T, k_positions_S, window, query_chunk)


# ---- probing ------------------------------------------------------------------------------------------
def _probe_cases(cfg: BeamConfig, device: torch.device) -> dict[str, list[dict]]:
    """Small ops.attention calls shaped like the model's: a global decode region with an empty tail,
    a full and a part-full sliding ring, a prefill chunk on top of a ring and of a global region."""
    gen = torch.Generator(device=device).manual_seed(7)
    H, K, Dh, W = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.sliding_window

    def rand(*shape):
        return torch.randn(shape, generator=gen, device=device).to(torch.bfloat16)

    def pos(values):
        return torch.tensor(values, dtype=torch.int64, device=device)

    # A ring after 3W + 5 tokens: slot s holds the position p = s mod W among the last W (rotated).
    length = 3 * W + 5
    ring_full = [3 * W + s if s < 5 else 2 * W + s for s in range(W)]
    ring_part = [s if s < 5 else -1 for s in range(W)]  # after 5 tokens
    n_pre = 40
    return {
        "decode_global": [dict(q_THD=rand(1, H, Dh), k_SKD=rand(300, K, Dh), v_SKD=rand(300, K, Dh),
                               q_positions_T=pos([279]), k_positions_S=pos(list(range(280)) + [-1] * 20), window=None)],
        "decode_sliding": [
            dict(q_THD=rand(1, H, Dh), k_SKD=rand(W, K, Dh), v_SKD=rand(W, K, Dh),
                 q_positions_T=pos([length - 1]), k_positions_S=pos(ring_full), window=W),
            dict(q_THD=rand(1, H, Dh), k_SKD=rand(W, K, Dh), v_SKD=rand(W, K, Dh),
                 q_positions_T=pos([4]), k_positions_S=pos(ring_part), window=W),
        ],
        "prefill": [
            dict(q_THD=rand(n_pre, H, Dh), k_SKD=rand(W + n_pre, K, Dh), v_SKD=rand(W + n_pre, K, Dh),
                 q_positions_T=pos(range(length, length + n_pre)),
                 k_positions_S=pos(ring_full + list(range(length, length + n_pre))), window=W),
            dict(q_THD=rand(n_pre, H, Dh), k_SKD=rand(W + n_pre, K, Dh), v_SKD=rand(W + n_pre, K, Dh),
                 q_positions_T=pos(range(5, 5 + n_pre)), k_positions_S=pos(ring_part + list(range(5, 5 + n_pre))),
                 window=W),
            dict(q_THD=rand(n_pre, H, Dh), k_SKD=rand(300, K, Dh), v_SKD=rand(300, K, Dh),
                 q_positions_T=pos(range(260, 300)), k_positions_S=pos(range(300)), window=None),
        ],
    }  # fmt: skip


def probe(op: Callable, cases: list[dict]) -> str | None:
    """None when `op` matches ops.attention on every case within PROBE_REL_TOL, else why not."""
    for i, case in enumerate(cases):
        want = ops.attention(**case).double()
        try:
            got = op(**case)
        except Exception as e:  # a library refusing a shape is a finding, recorded; the reference runs instead
            return f"case {i} raised {error_line(e)}"
        if got.shape != want.shape or not torch.isfinite(got.float()).all():
            return f"case {i}: shape {tuple(got.shape)} (want {tuple(want.shape)}) or non-finite output"
        err = float((got.double() - want).norm() / want.norm())
        if not err <= PROBE_REL_TOL:
            return f"case {i}: normwise error {err:.3g} against ops.attention > {PROBE_REL_TOL}"
    return None


def build_attention(cfg: BeamConfig, device: torch.device) -> tuple[LibraryAttention, str, list[str]]:
    """The attention op with every path that passes its probe; (op, name, notes on what fell back)."""
    cases, notes = _probe_cases(cfg, device), []
    decode = torch_flash_decode
    if (why := probe(LibraryAttention(decode, None, None), cases["decode_global"])) is not None:
        decode, _ = None, notes.append(f"global decode: torch flash varlen unusable ({why}); reference")
    sliding, sliding_name = None, "reference"
    options = [("flash varlen on the ring", ring_decode(decode))] if decode else []
    for name, op in [*options, ("SDPA masked", masked_decode)]:
        if (why := probe(LibraryAttention(None, op, None), cases["decode_sliding"])) is None:
            sliding, sliding_name = op, name
            break
        notes.append(f"sliding decode: {name} unusable ({why})")
    prefill, prefill_name = None, "reference"
    try:
        candidates = [("flashinfer", flashinfer_prefill())]
    except ImportError as e:
        candidates = []
        notes.append(f"prefill: flashinfer does not import ({e})")
    candidates.append(("torch flash", torch_flash_prefill))
    for name, kernel in candidates:
        why = probe(LibraryAttention(None, None, kernel), cases["prefill"])
        if why is None:
            prefill, prefill_name = kernel, name
            break
        notes.append(f"prefill: {name} unusable ({why})")
    decode_name = f"{'flash varlen' if decode else 'reference'} (global) / {sliding_name} (sliding)"
    name = f"prefill {prefill_name}; decode {decode_name}"
    return LibraryAttention(decode, sliding, prefill), name, notes


# ---- compiled pointwise ops -------------------------------------------------------------------------
COMPILED_FIELDS = ("rms_norm", "output_gate", "swiglu")


def _compiled_probe_args(field: str, cfg: BeamConfig, device: torch.device) -> dict:
    """Arguments of `field` at the model's sizes, T = 3; output_gate's gate is a strided view of the
    packed projection's output, as the packed model passes it."""
    gen = torch.Generator(device=device).manual_seed(11)
    T, H, Dh = 3, cfg.n_heads, cfg.head_dim

    def rand(*shape):
        return torch.randn(shape, generator=gen, device=device).to(torch.bfloat16)

    if field == "rms_norm":
        return {"x": rand(T, cfg.hidden), "weight": 1 + 0.1 * rand(cfg.hidden), "eps": cfg.norm_eps}
    if field == "output_gate":
        g = rand(T, cfg.qkv_gate_size)[:, cfg.q_size + 2 * cfg.kv_size :]
        return {"o_THD": rand(T, H, Dh), "g_THD": g.view(T, H, Dh), "bias_H": 0.1 * rand(H)}
    if field == "swiglu":
        return {"gate_TF": rand(T, cfg.dense_ff), "up_TF": rand(T, cfg.dense_ff)}
    raise ValueError(f"no compiled path for op field {field!r}; expected one of {COMPILED_FIELDS}")


def probe_within_ulp(op: Callable, reference: Callable, args: dict) -> str | None:
    """None when `op` gives the reference's shape and dtype and every element within one BF16 ulp
    of it (|got - want| <= 2^-7 |want|), else why not."""
    want = reference(**args)
    try:
        got = op(**args)
    except Exception as e:  # a compiler failure is a finding, recorded; the reference runs instead
        return f"raised {error_line(e)}"
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"gave {tuple(got.shape)} {got.dtype}, want {tuple(want.shape)} {want.dtype}"
    diff, bound = (got.float() - want.float()).abs(), want.float().abs() * 2**-7
    if not bool((diff <= bound).all()):
        return f"{int((diff > bound).sum())} of {want.numel()} elements more than one BF16 ulp from the reference"
    return None


def compiled_ops(cfg: BeamConfig, device: torch.device, compile_fn: Callable = torch.compile) -> dict[str, LibraryOp]:
    """{field: LibraryOp} for every COMPILED_FIELDS op: its compiled form where that passes its probe,
    else the reference, named so, with the probe's finding as the detail (the model's op table shows
    it). The compiled function is built once per (field, compile_fn) and compiled per input shape
    on use (dynamo's guards); the decode CUDA graph captures its kernel."""
    found = {}
    for field in COMPILED_FIELDS:
        reference = getattr(ops.REFERENCE_OPS, field)
        fn = _compiled(field, compile_fn)
        if (why := probe_within_ulp(fn, reference, _compiled_probe_args(field, cfg, device))) is not None:
            found[field] = LibraryOp(field, lambda _ops, ref=reference: ref, "reference",
                                     f"torch.compile unusable ({why}); the reference runs", "compiled")  # fmt: skip
            continue
        detail = "Inductor's fusion of the reference op (no promoted candidate)"
        found[field] = LibraryOp(field, lambda _ops, fn=fn: fn, "torch.compile", detail, "compiled")
    return found


@functools.cache
def _compiled(field: str, compile_fn: Callable) -> Callable:
    return compile_fn(getattr(ops.REFERENCE_OPS, field))


def library_ops(device: torch.device | str, cfg: BeamConfig,
                progress: Callable[[str], None] = lambda _: None) -> dict[str, LibraryOp]:  # fmt: skip
    """The library paths for a model of `cfg` on `device` (none on the CPU); `progress` is told when
    the attention paths and when the compiled ops have been probed (the probes' first calls build
    flashinfer's prefill and Inductor's kernels)."""
    device = torch.device(device)
    if device.type != "cuda":
        return {}
    attention, name, notes = build_attention(cfg, device)
    progress(f"attention paths probed: {name}")
    compiled = compiled_ops(cfg, device)
    progress(f"compiled ops probed: {', '.join(f'{f} {op.name}' for f, op in compiled.items())}")
    return compiled | {
        "attention": LibraryOp("attention", lambda _ops: attention, name, "; ".join(notes) or "every path probed ok"),
        "moe_experts": LibraryOp(
            "moe_experts", lambda model_ops: moe_experts_task.grouped_mm_experts(model_ops.swiglu), "torch._grouped_mm",
            "sorted pairs, 3 grouped GEMMs, the model's SwiGLU",
        ),
    }  # fmt: skip
