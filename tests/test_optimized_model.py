"""The optimized model: candidate choices and their hash checks, promotion records, strided inputs,
swapping ops on one model, the library attention's layouts, whole-model parity on beam-tiny (every
candidate present, through the interpreter) and beam-slice (GPU), and the reference's golden logits.

Regenerate the golden file after a deliberate change of the reference model (and say why in the
commit): BEAM_WRITE_GOLDEN=1 .venv/bin/python -m pytest tests/test_optimized_model.py -k golden
"""

from __future__ import annotations

import dataclasses
import functools
import json
import multiprocessing
import os
import re
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import torch

from harness import environment, library_paths, model_parity, optimized_model
from harness.candidates import content_hash
from harness.optimized_model import CandidateChoice, StaleCandidateError
from harness.records import PROMOTIONS_FILE, PromotionRecord, append
from reference_model import ops
from reference_model.cache import KVCache
from reference_model.config import get_config
from reference_model.ops import REFERENCE_OPS
from reference_model.weights import random_model

CPU = torch.device("cpu")
TINY = get_config("beam-tiny")
REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden" / "beam_tiny_reference.json"
OUTPUT_GATE = REPO / "candidate_kernels" / "output_gate" / "head_rows.py"
DECODE_STEPS = 32
# The candidates' whole-model run decodes fewer steps (a decode step of the interpreted model costs
# seconds, 4.5 with every task's first candidate): positions 17..24, so each sliding layer's ring of 8
# wraps once more, at the last.
CANDIDATE_STEPS = 8
SEED = 0


def _prompt_chunks(cfg, lengths: tuple[int, ...]) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(cfg.vocab_size, (sum(lengths),), generator=gen).tolist()
    out, start = [], 0
    for n in lengths:
        out.append(prompt[start : start + n])
        start += n
    return out


# Two chunks: the second finds the first in the cache, its ring part full (window 8), then wraps.
TINY_CHUNKS = _prompt_chunks(TINY, (11, 6))


@pytest.fixture(scope="module")
def reference_run() -> model_parity.GreedyRun:
    return model_parity.greedy_run(random_model(TINY, SEED, CPU), TINY_CHUNKS, DECODE_STEPS)


def _choice(path: Path, task: str = "output_gate", digest: str | None = None) -> CandidateChoice:
    return CandidateChoice(task, path, digest or content_hash(path.read_bytes()), "explicit")


# ---- choices and hashes ----------------------------------------------------------------------------
def test_a_changed_candidate_is_refused_naming_task_and_both_hashes(tmp_path):
    copy = tmp_path / "head_rows.py"
    copy.write_bytes(OUTPUT_GATE.read_bytes())
    choice = _choice(copy)
    copy.write_bytes(OUTPUT_GATE.read_bytes() + b"\n# edited after promotion\n")
    found = content_hash(copy.read_bytes())
    with pytest.raises(StaleCandidateError) as err:
        optimized_model.build_ops({"output_gate": choice}, TINY, CPU)
    message = str(err.value)
    assert "task 'output_gate'" in message and choice.content_hash in message and found in message


def test_a_missing_candidate_is_refused_naming_task_and_hash(tmp_path):
    choice = CandidateChoice("output_gate", tmp_path / "gone.py", "ab" * 32, "explicit")
    with pytest.raises(StaleCandidateError, match=r"task 'output_gate'.*does not exist.*(ab){32}"):
        optimized_model.build_ops({"output_gate": choice}, TINY, CPU)


def test_unknown_task_in_an_explicit_mapping_names_the_known_ones():
    with pytest.raises(ValueError, match=r"task 'fuse_norms' unknown; known: \["):
        optimized_model.explicit_choices({"fuse_norms": "row_per_program"})


def _promotion(task: str, path: str, digest: str, action: str = "promote") -> PromotionRecord:
    return PromotionRecord(task=task, action=action, candidate=Path(path).stem, path=path, content_hash=digest,
                           run_id="run-1", evidence=["rec-1"], reason="test", speedups={}, environment={})  # fmt: skip


def test_promotion_records_choose_the_candidate_and_a_withdrawal_removes_it(tmp_path):
    rel = str(OUTPUT_GATE.relative_to(REPO))
    promotions = tmp_path / "output_gate" / PROMOTIONS_FILE
    record = _promotion("output_gate", rel, content_hash(OUTPUT_GATE.read_bytes()))
    append(promotions, record)
    chosen = optimized_model.promoted_choices(tmp_path)
    assert set(chosen) == {"output_gate"}
    assert chosen["output_gate"].path == OUTPUT_GATE and record.promotion_id in chosen["output_gate"].origin
    built = optimized_model.build_ops(chosen, TINY, CPU)
    assert built.source("output_gate").kind == "candidate" and built.pack_qkv_gate
    assert built.ops.output_gate is not ops.output_gate and built.ops.qk_norm_rope is ops.qk_norm_rope
    append(promotions, _promotion("output_gate", rel, record.content_hash, action="withdraw"))
    assert optimized_model.promoted_choices(tmp_path) == {}


def test_a_stale_promotion_fails_the_build(tmp_path):
    append(tmp_path / "output_gate" / PROMOTIONS_FILE, _promotion("output_gate", str(OUTPUT_GATE), "cd" * 32))
    with pytest.raises(StaleCandidateError, match=r"task 'output_gate'.*expected (cd){32}"):
        optimized_model.build_ops(optimized_model.promoted_choices(tmp_path), TINY, CPU)


# ---- token ranges: a candidate runs where its promotion measured it ------------------------------------
def test_a_candidate_measured_up_to_1000_tokens_hands_larger_calls_to_the_library_or_the_reference():
    calls = []

    def library_experts(**kwargs):
        calls.append(kwargs["x_TD"].shape[0])
        return ops.moe_experts(**kwargs)

    library = {"moe_experts": optimized_model.LibraryOp("moe_experts", lambda _ops: library_experts, "lib", "test")}
    choices = optimized_model.explicit_choices({"moe_experts": "routed_slots", "router_gemm": "splitk_bf16x3"})
    built = optimized_model.build_ops(choices, TINY, CPU, library)
    assert optimized_model.measured_tokens("moe_experts") == 1000
    experts, router = built.source("moe_experts"), built.source("router_logits")
    assert experts.kind == "candidate+library" and "T <= 1000" in experts.detail and "lib" in experts.name
    assert router.kind == "candidate" and "above: the reference" in router.detail
    task = optimized_model.get_task("moe_experts")
    small = task.make_inputs(task.shape("tiny T=3", CPU), 0, CPU)
    built.ops.moe_experts(**small)
    assert calls == []  # 3 tokens: the candidate
    big = dict(small, x_TD=small["x_TD"][[0]].expand(1001, -1).contiguous())
    big |= {"weights_Tk": small["weights_Tk"][[0]].expand(1001, -1), "ids_Tk": small["ids_Tk"][[0]].expand(1001, -1)}
    built.ops.moe_experts(**big)
    assert calls == [1001]
    x = torch.randn(1001, TINY.hidden).to(torch.bfloat16)
    w = torch.randn(TINY.n_experts, TINY.hidden) / TINY.hidden**0.5
    assert torch.equal(built.ops.router_logits(x, w), ops.router_logits(x, w))  # above 1000: the reference itself


# ---- strided views of the packed projection ---------------------------------------------------------
STRIDE_IGNORING_GATE = """
import torch

CANDIDATE = {"author": "human", "model": None, "parent": None, "idea": "reads g as if contiguous (a test fixture)"}


def output_gate(o_THD, g_THD, bias_H):
    T, H, Dh = g_THD.shape
    g = torch.as_strided(g_THD, (T, H, Dh), (H * Dh, Dh, 1))  # wrong for a view with row stride N
    return (o_THD.float() * torch.sigmoid(g.float() + bias_H.float()[None, :, None])).to(torch.bfloat16)
"""


def test_present_candidates_honour_strides_and_one_that_does_not_gets_contiguous_inputs(tmp_path):
    present = optimized_model.present_candidates()
    for task in optimized_model.STRIDED_VIEW_ARGS:
        for name in present[task]:
            fn = optimized_model.load_candidate_op(optimized_model.explicit_choices({task: name})[task])
            assert optimized_model.honours_strides(task, fn, TINY, CPU), f"{task}/{name} ignores input strides"
    bad = tmp_path / "ignores_strides.py"
    bad.write_text(STRIDE_IGNORING_GATE)
    fn = optimized_model.load_candidate_op(_choice(bad))
    assert not optimized_model.honours_strides("output_gate", fn, TINY, CPU)
    built = optimized_model.build_ops({"output_gate": _choice(bad)}, TINY, CPU)
    assert "ignores input strides" in built.source("output_gate").detail
    qkvg = torch.randn(3, TINY.qkv_gate_size).to(torch.bfloat16)
    g = qkvg[:, -TINY.q_size :].view(3, TINY.n_heads, TINY.head_dim)
    o, bias = torch.randn(3, TINY.n_heads, TINY.head_dim).to(torch.bfloat16), torch.randn(TINY.n_heads)
    assert torch.equal(built.ops.output_gate(o, g, bias), ops.output_gate(o, g, bias))


FRESH_INTERPRETER_LOAD = """
import os
os.environ["TRITON_INTERPRET"] = "1"
import torch
from harness import interpreter_patches, optimized_model
from reference_model.config import get_config

assert not interpreter_patches.is_applied(), "not a fresh process: the patches were applied before any load"
fn = optimized_model.load_candidate_op(optimized_model.explicit_choices({"qk_norm_rope": "token_ring"})["qk_norm_rope"])
assert interpreter_patches.is_applied(), "loading a candidate under TRITON_INTERPRET=1 left the interpreter unpatched"
assert optimized_model.honours_strides("qk_norm_rope", fn, get_config("beam-tiny"), torch.device("cpu"))
"""


def test_loading_a_candidate_on_the_interpreter_patches_it_in_a_fresh_process():
    """Every in-process path to a candidate (model check, bench model, profile) loads it through
    load_candidate_op, which applies harness/interpreter_patches under TRITON_INTERPRET=1. Checked in a
    fresh process, since in this one an earlier test may have applied them: token_ring's loop over a
    runtime token count raised TypeError there under numpy 2.4 and later, and its BF16 outputs were
    truncated, not rounded as on the GPU."""
    child = subprocess.run([sys.executable, "-c", FRESH_INTERPRETER_LOAD], cwd=REPO, capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    assert child.returncode == 0, child.stderr[-4000:]


# ---- one model, ops swapped -----------------------------------------------------------------------
def test_a_packed_model_with_swapped_ops_computes_the_reference(reference_run):
    """The waterfall's mechanism: one model built packed, its ops swapped and its packing switched off,
    decodes bit for bit like a plainly built reference model (same seeded weights)."""
    model = random_model(TINY, SEED, CPU, pack_qkv_gate=True)
    built = optimized_model.build_ops(optimized_model.explicit_choices({"output_gate": "head_rows"}), TINY, CPU)
    optimized_model.set_ops(model, built.ops)
    assert all(m.ops is built.ops for m in model.modules() if hasattr(m, "ops"))
    optimized_model.set_ops(model, REFERENCE_OPS)
    optimized_model.set_packed(model, False)
    run = model_parity.greedy_run(model, TINY_CHUNKS, 4)
    assert run.tokens == reference_run.tokens[:4] and run.argmax == reference_run.argmax[:4]
    assert all(torch.equal(a, b) for a, b in zip(run.step_logits, reference_run.step_logits[:4], strict=True))
    optimized_model.set_packed(model, True)
    assert all(m.w_qkvg is not None for m in model.modules() if hasattr(m, "w_qkvg"))
    with pytest.raises(ValueError, match="pack_qkv_gate=True"):
        optimized_model.set_packed(random_model(TINY, SEED, CPU), True)


def test_every_decode_step_records_each_moe_layers_experts(reference_run):
    n_moe = sum(TINY.is_moe(layer) for layer in range(TINY.n_layers))
    assert len(reference_run.step_routes) == DECODE_STEPS
    assert all(len(step) == n_moe and all(ids.shape == (1, TINY.top_k) for ids in step)
               for step in reference_run.step_routes)  # fmt: skip
    assert model_parity.compare(reference_run, reference_run).reroutings == {}


NEAR_TIE = model_parity.NEAR_TIE


def _rerouted(run: model_parity.GreedyRun, steps: dict[int, int], argmax_changed: tuple[int, ...] = (),
              layer: int = 0):  # fmt: skip
    """`run` with `n` experts of MoE layer `layer` swapped at each step of `steps` (step -> n), and
    its greedy token changed at the steps of `argmax_changed` (a far-from-tie change)."""
    routes = [list(layers) for layers in run.step_routes]
    for step, n in steps.items():
        ids = routes[step][layer].clone()
        unused = [e for e in range(TINY.n_experts) if e not in set(ids[0].tolist())]
        ids[0, :n] = torch.tensor(unused[:n])
        routes[step][layer] = ids
    argmax = [a + 1 if i in argmax_changed else a for i, a in enumerate(run.argmax)]
    return dataclasses.replace(run, step_routes=routes, argmax=argmax)


def test_a_changed_token_is_admissible_only_where_a_narrow_rerouting_was_observed(reference_run):
    def gap_rel(logits):  # the top-2 gap over the RMS, as the verdict measures it
        top2 = logits.double().topk(2).values
        return float((top2[0] - top2[1]) / logits.double().pow(2).mean().sqrt())

    big_gap = next(i for i, logits in enumerate(reference_run.step_logits) if gap_rel(logits) > 5 * NEAR_TIE)
    rerouted = model_parity.compare(reference_run, _rerouted(reference_run, {big_gap: 1}, (big_gap,)), strict=False)
    assert rerouted.passed and rerouted.reroutings == {big_gap: {0: 1}}, rerouted.summary()
    assert f"1 rerouted: [{big_gap}]" in rerouted.summary()
    assert not model_parity.compare(reference_run, _rerouted(reference_run, {big_gap: 1}, (big_gap,))).passed  # strict
    unexplained = model_parity.compare(reference_run, _rerouted(reference_run, {}, (big_gap,)), strict=False)
    assert not unexplained.passed and f"step {big_gap}: greedy token" in unexplained.summary()
    wide = model_parity.compare(reference_run, _rerouted(reference_run, {big_gap: 3}), strict=False)
    assert not wide.passed and "more than 2 experts swapped in the first rerouted layer" in wide.summary()
    cascade = _rerouted(_rerouted(reference_run, {big_gap: 1}), {big_gap: TINY.top_k}, layer=1)  # its consequence
    assert model_parity.compare(reference_run, cascade, strict=False).passed
    everywhere = _rerouted(reference_run, dict.fromkeys(range(DECODE_STEPS // 2 + 1), 1))
    often = model_parity.compare(reference_run, everywhere, strict=False)
    assert not often.passed and f"rerouted at {DECODE_STEPS // 2 + 1} of {DECODE_STEPS} steps" in often.summary()


def _routed_as(run: model_parity.GreedyRun, step: int, ids: list[int]) -> model_parity.GreedyRun:
    """`run` with its first MoE layer at `step` choosing the experts `ids`."""
    routes = [list(layers) for layers in run.step_routes]
    routes[step][0] = torch.tensor([ids])
    return dataclasses.replace(run, step_routes=routes)


def test_one_expert_group_traded_for_another_is_one_selection_boundary(reference_run):
    """beam-tiny's 16 experts form 4 groups of 4, 2 groups kept. The reference chose experts 0, 1, 2 (group 0) and
    4 (group 1): the optimized run trading group 0 for group 2 (8, 9, 10) swaps 3 experts at one boundary, and is
    admissible with one more swap beside it (5 for 4); 3 swapped into two groups (2 and 3) is no trade, and stays
    too wide, as is any 3-expert swap where the verdict is not told the groups."""
    step, per_group = 1, TINY.experts_per_group
    assert per_group == 4
    reference = _routed_as(reference_run, step, [0, 1, 2, 4])

    def verdict(ids, groups=per_group):
        return model_parity.compare(reference, _routed_as(reference, step, ids), strict=False, experts_per_group=groups)

    traded = verdict([8, 9, 10, 4])
    assert traded.passed and traded.reroutings == {step: {0: 3}} and traded.group_trades == {step: (0, 2)}
    assert traded.untraded == {step: 0} and f"(step: (left, taken)) {{{step}: (0, 2)}}" in traded.summary()
    beside = verdict([8, 9, 10, 5])
    assert beside.passed and beside.untraded == {step: 1} and beside.group_trades == {step: (0, 2)}
    for scattered in (verdict([8, 9, 12, 4]), verdict([8, 9, 10, 4], groups=None)):
        assert not scattered.passed and scattered.group_trades == {}
        assert "more than 2 experts swapped in the first rerouted layer at steps {1: {0: 3}}" in scattered.summary()
    assert verdict([8, 9, 12, 4]).untraded == {step: 3}


# ---- compiled pointwise ops -------------------------------------------------------------------------------
AOT_EAGER = functools.partial(torch.compile, backend="aot_eager")  # dynamo's tracing, no code generation


def test_compiled_pointwise_ops_stand_in_where_no_candidate_is_chosen(reference_run):
    """Each compiled op passes its probe; a chosen candidate takes its op's place; the model with the
    compiled ops (dynamo tracing its real calls: strided gate views, prefill chunks, decode) gives
    the reference's logits."""
    compiled = library_paths.compiled_ops(TINY, CPU, AOT_EAGER)
    assert sorted(compiled) == sorted(library_paths.COMPILED_FIELDS)
    assert {op.name for op in compiled.values()} == {"torch.compile"}
    assert {op.change for op in compiled.values()} == {f"compiled:{f}" for f in library_paths.COMPILED_FIELDS}
    built = optimized_model.build_ops({"output_gate": _choice(OUTPUT_GATE)}, TINY, CPU, compiled)
    kinds = {s.field: s.kind for s in built.sources}
    assert (kinds["output_gate"], kinds["rms_norm"], kinds["swiglu"]) == ("candidate", "compiled", "compiled")
    only_compiled = optimized_model.build_ops({}, TINY, CPU, compiled)
    for field, op in compiled.items():  # the model's ops are the compiled functions themselves
        assert getattr(only_compiled.ops, field) is op.make(REFERENCE_OPS) is not getattr(REFERENCE_OPS, field)
    model = optimized_model.optimized_model(TINY, only_compiled, CPU, SEED)
    run = model_parity.greedy_run(model, TINY_CHUNKS, DECODE_STEPS, forced=reference_run.tokens)
    assert run.argmax == reference_run.argmax
    for got, want in zip(run.chunk_logits + run.step_logits, reference_run.chunk_logits + reference_run.step_logits,
                         strict=True):  # fmt: skip
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_library_ops_say_when_attention_and_the_compiled_ops_are_probed(monkeypatch):
    """The bench model's set-up took 138-206 s on fresh GPU machines, in one unexplained step: each part
    of the library set-up now reports when it is done, naming what it chose; the CPU has none to report."""
    told = []
    assert library_paths.library_ops(CPU, TINY, told.append) == {} and told == []
    attention = library_paths.LibraryAttention(None, None, None)
    monkeypatch.setattr(library_paths, "build_attention", lambda cfg, device: (attention, "prefill flashinfer", []))
    compiled_ops = library_paths.compiled_ops
    monkeypatch.setattr(library_paths, "compiled_ops", lambda cfg, device: compiled_ops(cfg, CPU, AOT_EAGER))
    found = library_paths.library_ops("cuda", TINY, told.append)
    assert told == [
        "attention paths probed: prefill flashinfer",
        "compiled ops probed: rms_norm torch.compile, output_gate torch.compile, swiglu torch.compile",
    ]
    assert sorted(found) == sorted([*library_paths.COMPILED_FIELDS, "attention", "moe_experts"])
    assert found["attention"].make(REFERENCE_OPS) is attention


def _more_than_an_ulp_off(fn):
    return lambda **kwargs: (fn(**kwargs).float() * 1.02).to(torch.bfloat16)


def _failing(fn):
    def call(**kwargs):
        raise RuntimeError("backend compiler failed")

    return call


@pytest.mark.parametrize("compile_fn, why", [
    (_more_than_an_ulp_off, r"elements more than one BF16 ulp from the reference"),
    (_failing, r"raised RuntimeError: backend compiler failed"),
])  # fmt: skip
def test_a_compiled_op_that_fails_its_probe_leaves_the_reference_in_place(compile_fn, why):
    """The reference runs, and the op's recorded source says why."""
    compiled = library_paths.compiled_ops(TINY, CPU, compile_fn)
    assert sorted(compiled) == sorted(library_paths.COMPILED_FIELDS)
    for field, op in compiled.items():
        assert op.make(REFERENCE_OPS) is getattr(REFERENCE_OPS, field)
        assert op.name == "reference" and re.search(rf"^torch.compile unusable \(.*{why}", op.detail), op.detail
    source = optimized_model.build_ops({}, TINY, CPU, compiled).source("swiglu")
    assert (source.kind, source.name) == ("compiled", "reference") and "unusable" in source.detail


# ---- the library attention's layouts, with stand-in kernels on the CPU --------------------------------
def _stand_in_prefill(q_THD, k_SKD, v_SKD, window):
    """The contract of a position-order prefill kernel (keys = one run of positions ending at the last
    query's; bottom-right causal; left window), computed by ops.attention."""
    S, T = k_SKD.shape[0], q_THD.shape[0]
    return ops.attention(q_THD, k_SKD, v_SKD, torch.arange(S - T, S), torch.arange(S), window)


def _stand_in_decode(q_THD, k_SKD, v_SKD, q_positions_T):
    """The contract of the flash-varlen decode: the newest token's query (position p) over the first
    min(p + 1, S) rows, unmasked."""
    n = min(int(q_positions_T[0]) + 1, k_SKD.shape[0])
    return ops.attention(q_THD, k_SKD[:n], v_SKD[:n], torch.tensor([n - 1]), torch.arange(n), None)


@pytest.mark.parametrize("sliding", ["ring", "masked"])
def test_library_attention_layouts_reproduce_the_reference_in_the_model(reference_run, sliding):
    """Ring copies sorted by position with empty slots dropped, the global region's prefix, and in
    decode either the ring unmasked (its slots are the window) or SDPA masked by the positions: the
    whole model with these paths passes the whole-model verdict the GPU's library paths get. SDPA sums
    in its own order, so its greedy tokens may part from the reference's where the verdict allows
    (near ties, observed reroutings): on an AMD EPYC with AVX2 alone the masked run did at 3 of 32
    steps, all near ties with top-2 gaps of 0.05-0.07 x RMS; a wrong layout moves every step by O(1)."""
    decode_sliding = library_paths.ring_decode(_stand_in_decode) if sliding == "ring" else library_paths.masked_decode
    attention = library_paths.LibraryAttention(_stand_in_decode, decode_sliding, _stand_in_prefill)
    model = random_model(TINY, SEED, CPU, ops=ops.ModelOps(attention=attention))
    run = model_parity.greedy_run(model, TINY_CHUNKS, DECODE_STEPS, forced=reference_run.tokens)
    verdict = model_parity.compare(reference_run, run, strict=False, experts_per_group=TINY.experts_per_group)
    assert verdict.passed, verdict.summary()
    cases = library_paths._probe_cases(TINY, CPU)
    assert library_paths.probe(attention, cases["prefill"] + cases["decode_global"] + cases["decode_sliding"]) is None


def test_ring_decode_takes_only_ring_shaped_regions_and_its_probe_needs_the_filled_count():
    cases = library_paths._probe_cases(TINY, CPU)
    ring = library_paths.ring_decode(_stand_in_decode)
    wide = dict(cases["decode_global"][0], window=TINY.sliding_window)  # 300 rows: not a ring of the window's size
    assert torch.equal(ring(**wide), ops.attention(**wide))

    def every_row(q_THD, k_SKD, v_SKD, q_positions_T):  # ignores the count: reads a part-full ring's empty slots
        S = k_SKD.shape[0]
        return ops.attention(q_THD, k_SKD, v_SKD, torch.tensor([S - 1]), torch.arange(S), None)

    attention = library_paths.LibraryAttention(None, library_paths.ring_decode(every_row), None)
    why = library_paths.probe(attention, cases["decode_sliding"])  # case 0: a full ring, case 1: part-full
    assert why is not None and why.startswith("case 1: normwise error")


def test_prefill_layout_refuses_keys_that_are_not_one_run_ending_at_the_last_query():
    q = torch.arange(10, 14)
    assert library_paths.prefill_layout(q, torch.arange(0, 14)).rows is None  # in order already
    ring = torch.tensor([8, 9, -1, -1, 6, 7])  # rotated, two empty slots
    layout = library_paths.prefill_layout(q, torch.cat([ring, q]))
    assert torch.equal(torch.cat([ring, q])[layout.rows], torch.arange(6, 14))
    assert library_paths.prefill_layout(q, torch.tensor([0, 1, 3, 10, 11, 12, 13])) is None  # a gap
    assert library_paths.prefill_layout(q, torch.arange(0, 15)) is None  # keys beyond the last query
    assert library_paths.prefill_layout(q, torch.arange(0, 3)) is None  # fewer keys than queries


def test_a_wrong_kernel_fails_its_probe_with_the_error_size():
    def top_left_causal(q_THD, k_SKD, v_SKD, window):
        return ops.attention(q_THD, k_SKD, v_SKD, torch.arange(q_THD.shape[0]), torch.arange(k_SKD.shape[0]), window)

    why = library_paths.probe(library_paths.LibraryAttention(None, None, top_left_causal),
                              library_paths._probe_cases(TINY, CPU)["prefill"])  # fmt: skip
    assert why is not None and why.startswith("case 0: normwise error")


# ---- whole-model parity on beam-tiny, every candidate present -------------------------------------------
def _first_steps(run: model_parity.GreedyRun, steps: int) -> model_parity.GreedyRun:
    """The run as if it had decoded only its first `steps` steps (the prefill's logits unchanged)."""
    return model_parity.GreedyRun(run.chunk_logits, run.step_logits[:steps], run.tokens[:steps], run.argmax[:steps],
                                  run.step_routes[:steps])  # fmt: skip


def _mappings() -> list[dict[str, str]]:
    """Mapping 0: every task's first candidate (the whole optimized model); mapping i > 0: the i-th
    candidate of the tasks that have one, the reference elsewhere. Every file present is in one."""
    present = {t: names for t, names in optimized_model.present_candidates().items() if names}
    width = max(len(names) for names in present.values())
    return [{t: names[i] for t, names in present.items() if i < len(names)} for i in range(width)]


@pytest.mark.slow
def test_optimized_beam_tiny_matches_the_reference_with_every_candidate(reference_run):
    """Prefill in two chunks and CANDIDATE_STEPS decode steps through the Triton interpreter, one child
    process per mapping, in parallel (as many mappings as the task with the most candidates has files: ten, about two
    minutes on two cores)."""
    mappings = _mappings()
    assert {t for m in mappings for t in m} >= {"fuse_norm", "output_gate", "moe_experts"}
    reference = _first_steps(reference_run, CANDIDATE_STEPS)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(len(mappings), os.cpu_count() or 1), mp_context=context) as pool:
        futures = [pool.submit(model_parity.optimized_cpu_run, TINY.name, m, TINY_CHUNKS, CANDIDATE_STEPS, SEED,
                               reference.tokens) for m in mappings]  # fmt: skip
        runs = [f.result() for f in futures]
    for mapping, run in zip(mappings, runs, strict=True):
        verdict = model_parity.compare(reference, run)
        assert verdict.passed, f"{mapping}: {verdict.summary()}"


# ---- the reference's golden logits -----------------------------------------------------------------------
GOLDEN_REL_TOL = 1e-5  # the pinned numerics repeat to the bit; a changed eps moves logits by ~3%


def test_reference_logits_match_the_golden_summary():
    """A silent change to the reference model (an eps, a rounding point, a residual coefficient, the
    routing) changes these numbers: checked when written by editing ops.py's eps and a rounding point.
    The run is a child process with the CPU numerics pinned (tests/golden/summarize.py), so that the
    CPU's ISA does not move them: left to pick kernels by the CPU, an AMD EPYC with AVX2 alone parted
    from a summary written with AVX-512 at decode step 25."""
    spec = {"preset": TINY.name, "seed": SEED, "chunks": TINY_CHUNKS, "decode_steps": DECODE_STEPS}
    child = subprocess.run([sys.executable, str(GOLDEN.parent / "summarize.py"), json.dumps(spec)],
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert child.returncode == 0, child.stderr[-4000:]
    got = json.loads(child.stdout)
    if not got["cpu"]["has_avx2"]:
        pytest.skip("the golden summary is of ATen's AVX2 kernels, and this CPU has no AVX2")
    assert got["cpu"]["aten_capability"] == "AVX2", f"ATEN_CPU_CAPABILITY=avx2 was not taken: {got['cpu']}"
    if os.environ.get("BEAM_WRITE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(got, indent=1) + "\n")
        pytest.skip(f"wrote {GOLDEN}")
    want = json.loads(GOLDEN.read_text())
    assert {k: got[k] for k in spec} == {k: want[k] for k in spec}, "the golden run's inputs changed"
    assert got["torch"] == want["torch"], (
        f"the golden summary is of torch {want['torch']}, this is torch {got['torch']}: versions draw other "
        "random weights for one seed (2.11 and 2.13 do)"
    )
    assert got["tokens"] == want["tokens"], "greedy tokens of the reference changed"
    for kind in ("chunk_logits", "step_logits"):
        for i, (g, w) in enumerate(zip(got[kind], want[kind], strict=True)):
            assert g["argmax"] == w["argmax"], f"{kind}[{i}] argmax"
            for key in ("mean", "std", "logsumexp", "top2_gap"):
                assert g[key] == pytest.approx(w[key], rel=GOLDEN_REL_TOL, abs=1e-6), f"{kind}[{i}] {key}"
            assert g["values"] == pytest.approx(w["values"], rel=GOLDEN_REL_TOL, abs=1e-6), f"{kind}[{i}] values"


# ---- on the GPU machine: beam-slice ------------------------------------------------------------------------
SLICE_CHUNKS_LENGTHS = (400, 300)  # the second chunk finds a part-full ring; the ring wraps within it


@pytest.fixture(scope="module")
def slice_model():
    """ONE beam-slice model (66 GB), packed; the reference is the same model with reference ops, unpacked."""
    cfg = get_config("beam-slice")
    model = random_model(cfg, SEED, "cuda", pack_qkv_gate=True)
    optimized_model.set_ops(model, REFERENCE_OPS)
    optimized_model.set_packed(model, False)
    chunks = _prompt_chunks(cfg, SLICE_CHUNKS_LENGTHS)
    reference = model_parity.greedy_run(model, chunks, DECODE_STEPS)
    return model, chunks, reference


@pytest.mark.gpu
@pytest.mark.parametrize("choose", ["promoted", "present"])
def test_optimized_beam_slice_matches_the_reference_on_cuda(slice_model, choose):
    """The optimized model (promoted candidates, or every task's first file; library paths; packed;
    decode replayed from a CUDA graph) against the eager reference."""
    model, chunks, reference = slice_model
    cfg = model.cfg
    if choose == "promoted":
        choices = optimized_model.promoted_choices(gpu=environment.gpu())  # the kernels proven on this GPU
    else:
        present = optimized_model.present_candidates()
        choices = optimized_model.explicit_choices({t: names[0] for t, names in present.items() if names})
    built = optimized_model.build_ops(choices, cfg, "cuda", library_paths.library_ops("cuda", cfg))
    print(f"optimized model ({choose}):\n{built.describe()}")
    optimized_model.set_ops(model, built.ops)
    optimized_model.set_packed(model, True)
    try:
        run = model_parity.greedy_run(model, chunks, DECODE_STEPS, use_graph=True, forced=reference.tokens)
    finally:
        optimized_model.set_ops(model, REFERENCE_OPS)
        optimized_model.set_packed(model, False)
    verdict = model_parity.compare(reference, run, strict=False, experts_per_group=cfg.experts_per_group)
    print(verdict.summary())
    assert verdict.passed, verdict.summary()


@pytest.mark.gpu
def test_every_library_attention_path_passes_its_probe_on_cuda():
    cfg = get_config("beam-slice")
    _, name, notes = library_paths.build_attention(cfg, torch.device("cuda"))
    print(name)
    assert not notes, f"library attention fell back: {notes}"


@pytest.mark.gpu
def test_every_compiled_pointwise_op_passes_its_probe_on_cuda():
    compiled = library_paths.compiled_ops(get_config("beam-slice"), torch.device("cuda"))
    names, details = {f: op.name for f, op in compiled.items()}, [op.detail for op in compiled.values()]
    assert names == dict.fromkeys(library_paths.COMPILED_FIELDS, "torch.compile"), details


@pytest.mark.gpu
def test_decode_library_paths_are_graph_capturable_on_cuda():
    """One decode step of a small model through the decode library paths (flash varlen on the region and the ring,
    grouped GEMM experts, the compiled pointwise ops), captured and replayed: the eager step's logits, bit for bit."""
    from harness.model_cmd import capture_decode_graph
    from tasks.moe_experts import grouped_mm_experts

    cfg = TINY.replace(head_dim=64)  # FlashAttention-2 wants head_dim % 8 == 0
    flash = library_paths.torch_flash_decode
    attention = library_paths.LibraryAttention(flash, library_paths.ring_decode(flash), None)
    cases = library_paths._probe_cases(cfg, torch.device("cuda"))
    assert library_paths.probe(attention, cases["decode_global"] + cases["decode_sliding"]) is None
    compiled = library_paths.compiled_ops(cfg, torch.device("cuda"))
    assert {op.name for op in compiled.values()} == {"torch.compile"}, [op.detail for op in compiled.values()]
    compiled_fields = {field: op.make(REFERENCE_OPS) for field, op in compiled.items()}
    model_ops = ops.ModelOps(attention=attention, moe_experts=grouped_mm_experts(), **compiled_fields)
    model = random_model(cfg, SEED, "cuda", ops=model_ops, pack_qkv_gate=True)
    cache = KVCache(cfg, 1, 64, "cuda")
    model.prefill(cache, [list(range(20))])
    tokens_B = torch.tensor([3], device="cuda")
    snap = cache.snapshot()
    eager = model.decode(cache, tokens_B).clone()
    cache.restore(snap)
    graph, logits_BV = capture_decode_graph(model, cache, tokens_B)
    graph.replay()
    torch.testing.assert_close(logits_BV, eager, rtol=0, atol=0)
