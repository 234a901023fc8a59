"""beam-slice (layers 0..5 at full width, 66 GB of BF16 weights) on one H200.

Run: python -m pytest -m gpu tests/test_model_gpu.py   (about a minute; skipped without CUDA, and the
prefill on a GPU with less memory than its peak: an H100's 79.2 GiB)

Decode: one token at 100352 tokens of synthetic context, eager and replayed from a CUDA graph.
Prefill: 8 sequences x 2048 new tokens, each on top of 100352 tokens of context. Memory: weights
66 GB, the 8-sequence cache 3.4 GB (one global layer), the reference attention's FP32 scores
of 256 queries x 102400 keys x 48 heads (5 GB, a few copies) for one sequence at a time.
"""

from __future__ import annotations

import pytest
import torch

from harness.model_cmd import BENCH_CONTEXT, GRAPH_REL_TOL, capture_decode_graph
from reference_model.cache import KVCache, fill_synthetic_context
from reference_model.model import Beam, parameter_counts
from reference_model.weights import random_model

pytestmark = pytest.mark.gpu

PREFILL_SEQS, PREFILL_LEN = 8, 2048
LOGITS_TOL = 0.1  # normwise per token, as in test_model.py (same paths, same reasoning)
# The prefill's peak as `harness model check preset=beam-slice` measured it on the H200
# (results/model_check/beam-slice_NVIDIA-H200_2026-11-30T065343Z.json): more than an H100's 79.2 GiB.
PREFILL_PEAK_GIB = 86.0


def _gpu_gib() -> float:
    return torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else 0.0


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a - b).norm(dim=-1) / b.norm(dim=-1)


@pytest.fixture(scope="module")
def model() -> Beam:
    assert not torch.backends.cuda.matmul.allow_tf32, "the FP32 router and attention must not run in TF32"
    torch.cuda.reset_peak_memory_stats()
    return random_model("beam-slice", seed=0, device="cuda")


def test_beam_slice_instantiates_on_one_gpu(model):
    counts = parameter_counts(model)
    assert abs(counts.total - 33.12e9) < 0.01e9
    weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert torch.cuda.memory_allocated() < weights_bytes * 1.02, "built on the device without a second copy"
    assert all(p.device.type == "cuda" for p in model.parameters())


def test_decode_at_100k_context_replays_in_a_cuda_graph(model):
    cache = KVCache(model.cfg, 1, BENCH_CONTEXT + 8, "cuda")
    fill_synthetic_context(cache, model, BENCH_CONTEXT, seed=0)
    tokens_B = torch.tensor([1234], device="cuda")
    snap = cache.snapshot()
    eager_BV = model.decode(cache, tokens_B).clone()
    assert eager_BV.shape == (1, model.cfg.vocab_size) and torch.isfinite(eager_BV).all()
    assert cache.lengths() == [BENCH_CONTEXT + 1]
    cache.restore(snap)

    graph, logits_BV = capture_decode_graph(model, cache, tokens_B)
    assert cache.lengths() == [BENCH_CONTEXT], "capture executes nothing"
    graph.replay()
    first_BV = logits_BV.clone()
    rel = float(_rel_err(first_BV, eager_BV).max())
    print(f"graph vs eager: bit-identical {torch.equal(first_BV, eager_BV)}, normwise {rel:.3g}")
    assert rel <= GRAPH_REL_TOL
    assert cache.lengths() == [BENCH_CONTEXT + 1], "the replay advanced the lengths on the device"
    graph.replay()  # the next position: the graph reads positions from the cache, not from capture time
    assert cache.lengths() == [BENCH_CONTEXT + 2]
    assert not torch.equal(logits_BV, first_BV), "a graph with baked-in positions would repeat step one"
    cache.restore(snap)
    eager_next = [model.decode(cache, tokens_B).clone() for _ in range(2)][1]
    assert float(_rel_err(logits_BV, eager_next).max()) <= GRAPH_REL_TOL


@pytest.mark.skipif(
    torch.cuda.is_available() and _gpu_gib() < PREFILL_PEAK_GIB,
    reason=f"the 8 x 2048 prefill at 100K context peaks at {PREFILL_PEAK_GIB} GiB (on the H200); "
    f"this GPU has {_gpu_gib():.1f} GiB",
)
def test_prefill_8x2048_at_100k_context(model):
    cfg = model.cfg
    cache = KVCache(cfg, PREFILL_SEQS, BENCH_CONTEXT + PREFILL_LEN, "cuda")
    fill_synthetic_context(cache, model, BENCH_CONTEXT, seed=0)
    gen = torch.Generator(device="cuda").manual_seed(1)
    tokens = [torch.randint(cfg.vocab_size, (PREFILL_LEN,), generator=gen, device="cuda") for _ in range(8)]
    torch.cuda.reset_peak_memory_stats()
    logits_BV = model.prefill(cache, tokens)
    print(f"prefill peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    assert logits_BV.shape == (PREFILL_SEQS, cfg.vocab_size) and torch.isfinite(logits_BV).all()
    assert cache.lengths() == [BENCH_CONTEXT + PREFILL_LEN] * PREFILL_SEQS
    del cache
    # Sequence 3 alone (same synthetic context: it is seeded per sequence index) gives the same logits.
    alone = KVCache(cfg, 4, BENCH_CONTEXT + PREFILL_LEN, "cuda")
    fill_synthetic_context(alone, model, BENCH_CONTEXT, seed=0)
    alone_BV = model.prefill(alone, [tokens[3]], seq_ids=[3])
    assert float(_rel_err(alone_BV[0], logits_BV[3])) <= LOGITS_TOL
