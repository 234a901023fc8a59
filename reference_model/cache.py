"""Beam's KV cache: every token for the global layers, a ring of `sliding_window` slots for the others.

Layout. Each layer holds k and v of shape [n_seqs * rows + 1, K, Dh] (BF16), addressed through a
flat slot index. Sequence b owns rows b*rows .. (b+1)*rows - 1, where `rows` is the context
capacity for a global layer (the token at position p lives in row b*capacity + p) and the window
for a sliding-window layer (row b*window + p mod window). The last row is the discard row: slot -1
indexes it, so a token that is not kept (the head of a prefill chunk longer than the window) can be
written there or skipped, and no attention ever reads it (ops.write_kv_cache).

Positions. Attention masks by the absolute position of the token held in each slot (-1 = empty).
Every layer of a kind writes the same slots for the same tokens, so one position table per kind
(global, sliding) serves all its layers. Per-sequence lengths live on the device, so that a decode
step can be captured in a CUDA graph: it reads and advances them there, with no host round trip.

A step. `begin_prefill` and `begin_decode` plan where the step's new tokens go (a `Step`), record
their positions and advance the lengths; the model's layers then write k and v through the step's
slot mappings. If a forward pass fails half way, the cache is inconsistent: restore a snapshot.

Shape legend: B sequences, T new tokens, K kv heads, Dh head dim, S cache rows, W window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from reference_model import ops
from reference_model.config import BeamConfig

if TYPE_CHECKING:
    from reference_model.model import Beam

BF16 = torch.bfloat16
SYNTHETIC_CHUNK = 16384  # tokens generated per call while filling a synthetic context (bounds memory)


@dataclass(frozen=True)
class LayerKV:
    """One layer's cache: k and v [n_seqs * rows_per_seq + 1, K, Dh], the last row the discard row."""

    k_SKD: torch.Tensor
    v_SKD: torch.Tensor
    is_global: bool
    rows_per_seq: int


@dataclass(frozen=True)
class SeqSpan:
    """One sequence's new tokens in a step.

    start, stop: the rows of the step's flat token batch that belong to sequence `seq`.
    context_len: tokens the sequence holds once the step is written (prefill; host-side). In decode
        the lengths stay on the device, so it is None and attention reads the whole region.
    past_ring_positions_W: the positions held by the sequence's sliding-window ring before this
        step (prefill only): prefill attention on a sliding layer sees these past keys plus the
        chunk's own, because the chunk's write may overwrite ring slots its first queries need.
    """

    seq: int
    start: int
    stop: int
    context_len: int | None
    past_ring_positions_W: torch.Tensor | None


@dataclass(frozen=True)
class Step:
    """Where a step's T new tokens go. All tensors live on the cache's device."""

    positions_T: torch.Tensor  # absolute 0-based position of each new token
    global_slots_T: torch.Tensor  # row in a global layer's k/v (-1: discard)
    sliding_slots_T: torch.Tensor  # row in a sliding layer's ring (-1: not kept)
    spans: tuple[SeqSpan, ...]
    is_decode: bool

    def slots_for(self, layer_kv: LayerKV) -> torch.Tensor:
        return self.global_slots_T if layer_kv.is_global else self.sliding_slots_T


@dataclass(frozen=True)
class Snapshot:
    """Everything attention can see, to rewind a cache between timed repetitions.

    Global layers' k/v rows are not copied (gigabytes at 100K context): rows written after the
    snapshot get position -1 again on restore, so no attention reads them, and a replayed step
    rewrites them. Sliding rings are copied, since a step overwrites slots that stay visible.
    """

    lengths_B: torch.Tensor
    global_positions_S: torch.Tensor
    sliding_positions_S: torch.Tensor
    rings: tuple[tuple[torch.Tensor, torch.Tensor] | None, ...]


class KVCache:
    """KV cache of `n_seqs` sequences of up to `capacity` tokens each, for every layer of `cfg`."""

    def __init__(
        self,
        cfg: BeamConfig,
        n_seqs: int,
        capacity: int,
        device: torch.device | str,
        dtype: torch.dtype = BF16,
    ) -> None:
        if n_seqs < 1:
            raise ValueError(f"n_seqs must be >= 1; got {n_seqs}")
        if not 1 <= capacity <= cfg.max_positions:
            raise ValueError(
                f"capacity must be in 1..max_positions={cfg.max_positions} of preset {cfg.name!r}; got {capacity}"
            )
        self.cfg = cfg
        self.n_seqs = n_seqs
        self.capacity = capacity
        self.window = cfg.sliding_window
        self.lengths_B = torch.zeros(n_seqs, dtype=torch.int64, device=device)
        self.device = self.lengths_B.device  # "cuda" made concrete ("cuda:0"), as the model's weights are
        K, Dh = cfg.n_kv_heads, cfg.head_dim
        layers = []
        for layer in range(cfg.n_layers):
            rows = capacity if cfg.is_global(layer) else self.window
            shape = (n_seqs * rows + 1, K, Dh)
            layers.append(
                LayerKV(
                    k_SKD=torch.zeros(shape, dtype=dtype, device=self.device),
                    v_SKD=torch.zeros(shape, dtype=dtype, device=self.device),
                    is_global=cfg.is_global(layer),
                    rows_per_seq=rows,
                )
            )
        self.layers: tuple[LayerKV, ...] = tuple(layers)
        self.global_positions_S = torch.full((n_seqs * capacity + 1,), -1, dtype=torch.int64, device=self.device)
        self.sliding_positions_S = torch.full((n_seqs * self.window + 1,), -1, dtype=torch.int64, device=self.device)
        # First row of each sequence's region, per kind: device constants for sync-free decode slots.
        self._global_base_B = torch.arange(n_seqs, device=self.device) * capacity
        self._sliding_base_B = torch.arange(n_seqs, device=self.device) * self.window

    # ---- reading ---------------------------------------------------------------------------
    def positions_for(self, layer_kv: LayerKV) -> torch.Tensor:
        return self.global_positions_S if layer_kv.is_global else self.sliding_positions_S

    def region(self, layer: int, span: SeqSpan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Views (k [S, K, Dh], v, positions [S]) of the rows of `span.seq` that attention reads.

        Prefill of a global layer reads the rows up to the sequence's new length (known on the
        host); decode reads the whole region and lets the positions mask the empty slots.
        """
        lkv = self.layers[layer]
        first = span.seq * lkv.rows_per_seq
        n_rows = lkv.rows_per_seq
        if lkv.is_global and span.context_len is not None:
            n_rows = span.context_len
        rows = slice(first, first + n_rows)
        return lkv.k_SKD[rows], lkv.v_SKD[rows], self.positions_for(lkv)[rows]

    def ring_copy(self, layer: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of a sliding layer's ring (k, v) [W, K, Dh] for one sequence, taken before a write."""
        lkv = self.layers[layer]
        if lkv.is_global:
            raise ValueError(f"layer {layer} is a global layer; only sliding-window layers have a ring")
        rows = slice(seq * self.window, (seq + 1) * self.window)
        return lkv.k_SKD[rows].clone(), lkv.v_SKD[rows].clone()

    def lengths(self) -> list[int]:
        """Host copy of the per-sequence lengths (synchronizes with the device)."""
        return self.lengths_B.tolist()

    @property
    def nbytes(self) -> int:
        tensors = [t for lkv in self.layers for t in (lkv.k_SKD, lkv.v_SKD)]
        tensors += [self.global_positions_S, self.sliding_positions_S, self.lengths_B]
        return sum(t.numel() * t.element_size() for t in tensors)

    # ---- planning a step -------------------------------------------------------------------
    def ensure_room(self, n_new: int, seq_ids: Sequence[int] | None = None) -> None:
        """Raise unless every listed sequence (default: all) can take `n_new` more tokens.

        Synchronizes with the device. Decode does not check (it must not synchronize): a caller
        that runs a loop of decode steps checks once before it. A decode step past the capacity
        writes its global-layer k/v to the discard row rather than into the next sequence's rows.
        """
        lengths = self.lengths()
        for seq in range(self.n_seqs) if seq_ids is None else seq_ids:
            if lengths[seq] + n_new > self.capacity:
                raise ValueError(
                    f"sequence {seq} holds {lengths[seq]} tokens; {n_new} more exceed "
                    f"the cache capacity {self.capacity}"
                )

    def begin_prefill(self, seq_ids: Sequence[int], n_new: Sequence[int]) -> Step:
        """Plan a prefill that appends n_new[i] tokens to sequence seq_ids[i] (tokens concatenated in that order)."""
        if len(seq_ids) != len(n_new) or not seq_ids:
            raise ValueError(f"need one token count per sequence; got seq_ids={list(seq_ids)}, n_new={list(n_new)}")
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"a sequence may appear once per prefill; got seq_ids={list(seq_ids)}")
        bad = [s for s in seq_ids if not 0 <= s < self.n_seqs]
        if bad:
            raise ValueError(f"sequence ids {bad} outside 0..{self.n_seqs - 1} (the cache holds {self.n_seqs})")
        if any(n < 1 for n in n_new):
            raise ValueError(f"every sequence needs at least one new token; got n_new={list(n_new)}")
        lengths = self.lengths()
        W, spans, positions, global_slots, sliding_slots = self.window, [], [], [], []
        start = 0
        for seq, n in zip(seq_ids, n_new, strict=True):
            past = lengths[seq]
            if past + n > self.capacity:
                raise ValueError(
                    f"sequence {seq} holds {past} tokens; {n} more exceed the cache capacity {self.capacity}"
                )
            pos = torch.arange(past, past + n)
            positions.append(pos)
            global_slots.append(seq * self.capacity + pos)
            # Only the chunk's last W tokens stay in the ring; the others go to the discard row.
            kept = pos >= past + n - W
            sliding_slots.append(torch.where(kept, seq * W + pos % W, -1))
            ring = self.sliding_positions_S[seq * W : (seq + 1) * W].clone()
            spans.append(SeqSpan(seq, start, start + n, past + n, ring))
            start += n
        step = Step(
            positions_T=torch.cat(positions).to(self.device),
            global_slots_T=torch.cat(global_slots).to(self.device),
            sliding_slots_T=torch.cat(sliding_slots).to(self.device),
            spans=tuple(spans),
            is_decode=False,
        )
        self._record(step)
        self.lengths_B[list(seq_ids)] += torch.tensor(list(n_new), device=self.device)
        return step

    def begin_decode(self) -> Step:
        """Plan one new token for every sequence, entirely on the device (capturable in a CUDA graph)."""
        positions_B = self.lengths_B.clone()
        in_room_B = positions_B < self.capacity
        step = Step(
            positions_T=positions_B,
            global_slots_T=torch.where(in_room_B, self._global_base_B + positions_B, -1),
            sliding_slots_T=self._sliding_base_B + positions_B % self.window,
            spans=tuple(SeqSpan(b, b, b + 1, None, None) for b in range(self.n_seqs)),
            is_decode=True,
        )
        self._record(step)
        self.lengths_B += 1
        return step

    def _record(self, step: Step) -> None:
        """Mark the step's slots as holding its positions; the discard rows stay empty."""
        self.global_positions_S[step.global_slots_T] = step.positions_T
        self.sliding_positions_S[step.sliding_slots_T] = step.positions_T
        # fill_ on a one-row view: indexed assignment of a Python scalar would copy a CPU tensor,
        # which CUDA-graph capture refuses.
        self.global_positions_S[-1:].fill_(-1)
        self.sliding_positions_S[-1:].fill_(-1)

    # ---- rewinding -------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        rings = tuple(None if lkv.is_global else (lkv.k_SKD.clone(), lkv.v_SKD.clone()) for lkv in self.layers)
        return Snapshot(
            self.lengths_B.clone(), self.global_positions_S.clone(), self.sliding_positions_S.clone(), rings
        )

    def restore(self, snap: Snapshot) -> None:
        """Rewind in place (tensor addresses stay, so a captured CUDA graph keeps working)."""
        self.lengths_B.copy_(snap.lengths_B)
        self.global_positions_S.copy_(snap.global_positions_S)
        self.sliding_positions_S.copy_(snap.sliding_positions_S)
        for lkv, ring in zip(self.layers, snap.rings, strict=True):
            if ring is not None:
                lkv.k_SKD.copy_(ring[0])
                lkv.v_SKD.copy_(ring[1])


@torch.no_grad()
def fill_synthetic_context(cache: KVCache, model: Beam, n_tokens: int, seed: int) -> None:
    """Give every sequence of an empty cache a synthetic context of positions 0..n_tokens-1.

    Keys are what the model would cache: N(0, 1) projections through the layer's own K norm,
    then RoPE on sliding-window layers (via the reference qk_norm_rope, which also writes them);
    values are N(0, 1). Seeded per (seed, layer, sequence). Sliding layers get only the ring's tokens.
    Lets benchmarks decode at ~100K context without a 100K-token prefill.
    """
    if not 1 <= n_tokens <= cache.capacity:
        raise ValueError(f"n_tokens must be in 1..capacity={cache.capacity}; got {n_tokens}")
    if any(cache.lengths()):
        raise ValueError(f"fill_synthetic_context needs an empty cache; lengths are {cache.lengths()}")
    if cache.cfg != model.cfg:
        raise ValueError(f"cache is for preset {cache.cfg.name!r}, model is {model.cfg.name!r}")
    cfg, dev = cache.cfg, cache.device
    K, Dh = cfg.n_kv_heads, cfg.head_dim
    for layer, lkv in enumerate(cache.layers):
        attn = model.layers[layer].attention
        first = 0 if lkv.is_global else max(0, n_tokens - cache.window)
        for seq in range(cache.n_seqs):
            # Hashing a tuple of ints is stable across processes; the seed does not depend on n_seqs,
            # so sequence b's context is the same in a cache of any size.
            gen = torch.Generator(device=dev).manual_seed(hash((seed, layer, seq)) & (2**63 - 1))
            base = seq * lkv.rows_per_seq
            for start in range(first, n_tokens, SYNTHETIC_CHUNK):
                pos_T = torch.arange(start, min(n_tokens, start + SYNTHETIC_CHUNK), device=dev)
                k_TKD = torch.randn((len(pos_T), K, Dh), generator=gen, device=dev).to(BF16)
                v_TKD = torch.randn((len(pos_T), K, Dh), generator=gen, device=dev).to(BF16)
                slots_T = base + (pos_T if lkv.is_global else pos_T % cache.window)
                ops.qk_norm_rope(
                    k_TKD[:, :1],  # a dummy query head: only the keys and their write matter here
                    k_TKD,
                    v_TKD,
                    attn.q_norm,
                    attn.k_norm,
                    pos_T,
                    slots_T,
                    lkv.k_SKD,
                    lkv.v_SKD,
                    None if lkv.is_global else model.rope_cos_sin_PD,
                    model.ssmax_scale_P if lkv.is_global else None,
                    cfg.norm_eps,
                )
    for seq in range(cache.n_seqs):
        pos = torch.arange(n_tokens, device=dev)
        cache.global_positions_S[seq * cache.capacity + pos] = pos
        ring_pos = pos[max(0, n_tokens - cache.window) :]
        cache.sliding_positions_S[seq * cache.window + ring_pos % cache.window] = ring_pos
    cache.lengths_B.fill_(n_tokens)
