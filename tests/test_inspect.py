"""`harness inspect`: a candidate's kernels compiled for sm_90a on the CPU (no GPU), in the sandbox."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness import inspect_child
from harness.inspect_kernels import INSPECTIONS_FILE, InspectionRecord
from harness.records import read_lines
from tests.test_cli import FIXTURES, harness


def test_residency_is_bound_by_registers_shared_memory_warps_or_programs():
    # fuse_norm/row_per_program at 4 warps: 120 registers per thread -> 3840 per warp -> 4 programs,
    # what Nsight Compute measured on the H200 (24% achieved of 25% theoretical occupancy)
    assert inspect_child.residency(120, 4, 128) == (4, 25.0, "registers")
    assert inspect_child.residency(77, 8, 128) == (3, 37.5, "registers")  # 80 allocated: 20480 per program
    assert inspect_child.residency(96, 4, 118_784) == (1, 6.25, "shared memory")
    assert inspect_child.residency(24, 16, 0) == (4, 100.0, "warps")
    assert inspect_child.residency(16, 1, 0) == (32, 50.0, "programs")


def test_ptxas_and_ptx_figures_are_read_exactly():
    ptxas = (
        "ptxas info    : Function properties for k\n"
        "    24 bytes stack frame, 24 bytes spill stores, 20 bytes spill loads\n"
        "ptxas info    : Used 96 registers, used 1 barriers, 128 bytes smem"
    )
    assert inspect_child.ptxas_figures(ptxas) == {
        "registers": 96, "spill_store_bytes": 24, "spill_load_bytes": 20, "stack_bytes": 24}  # fmt: skip
    with pytest.raises(ValueError, match="registers"):
        inspect_child.ptxas_figures("ptxas fatal: nothing")
    ptx = (
        "\t@%p1 ld.global.L1::evict_first.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];\n"
        "\tld.global.v4.b32 { %r5, %r6, %r7, %r8 }, [ %rd2 + 0 ];\n"
        "\t@!%p2 ld.global.b16 { %rs1 }, [ %rd3 + 0 ];\n"
        "\tst.global.v2.b32 [ %rd4 + 0 ], { %r9, %r10 };\n"
        "\tcp.async.cg.shared.global [ %r11 + 0 ], [ %rd5 + 0 ], 0x10, %r12;\n"
        "\tcp.async.commit_group;\n"
        "\tld.shared.b32 %r13, [ %r14 ];\n"
    )
    assert inspect_child.memory_instructions(ptx) == ({"16": 2, "2": 1, "cp.async": 1}, {"8": 1})


def test_the_sass_mix_counts_conversions_fp64_and_mufu_and_skips_the_padding():
    sass = (
        "        Function : _k\n"
        "        /*0000*/                   LDC R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */\n"
        "        /*0970*/                   @!UP6 SYNCS.EXCH.64 URZ, [UR40+0x4220], UR8 ;  /* 0x0042 */\n"
        "        /*0a00*/                   F2F.F64.F32 R4, R2 ;                    /* 0x0000 */\n"
        "        /*0a10*/               @P1 F2F.BF16.F32 R6, R3 ;                   /* 0x0000 */\n"
        "        /*0a20*/                   F2FP.BF16.F32.PACK_AB R7, R3, R2 ;      /* 0x0000 */\n"
        "        /*0a30*/                   DADD R8, R8, R4 ;                       /* 0x0000 */\n"
        "        /*0a40*/                   DFMA R8, R4, R4, R8 ;                   /* 0x0000 */\n"
        "        /*0a50*/                   MUFU.RSQ R9, R9 ;                       /* 0x0000 */\n"
        "        /*0a60*/                   EXIT ;                                  /* 0x0000 */\n"
        "        /*0a70*/                   BRA 0xa70;                              /* 0x0000 */\n"
        "        /*0a80*/                   NOP;                                    /* 0x0000 */\n"
    )
    assert inspect_child.sass_mix(sass) == {"instructions": 10, "conversions": 2, "fp64": 2, "mufu": 1,
                                            "load_round_trips": 0}  # fmt: skip
    with pytest.raises(ValueError, match="no SASS"):
        inspect_child.sass_mix("cuobjdump info    : File 'k.cubin' does not contain device code")


def _sass(*instructions: str) -> str:
    """A `cuobjdump -sass` listing of these instructions, one per line at consecutive addresses."""
    return "".join(f"        /*{16 * i:04x}*/       {ins} ;   /* 0x0000 */\n" for i, ins in enumerate(instructions))


def test_load_round_trips_count_the_loads_issued_after_a_use_of_a_loaded_value():
    trips = inspect_child.load_round_trips
    assert trips(_sass("S2R R8, SR_TID.X", "FFMA R2, R3, R4, RZ", "EXIT")) == 0  # no global load
    # lean_row's shape: loads of independent values, uses, then the rest of the loads: two trips
    independent = ("LDG.E.128 R4, desc[UR10][R20.64]", "LDG.E.64 R24, desc[UR10][R28.64+0x800]")
    assert trips(_sass(*independent, "FFMA R9, R4, R24, RZ", "STG.E desc[UR10][R2.64], R9")) == 1
    # R7: the last of the 128-bit load's four registers
    assert trips(_sass(*independent, "FFMA R9, R7, R8, RZ", "LDG.E.128 R12, desc[UR10][R20.64+0x1000]")) == 2
    assert trips(_sass(*independent, "LDG.E R12, desc[UR10][R24.64]")) == 2  # a gather: its address was loaded
    # R25: the upper register of the 64-bit load into R24, overwritten (which waits for the load too)
    assert trips(_sass(*independent, "IMAD.U32 R25, R0, 0x10, RZ", "LDG.E R12, desc[UR10][R30.64]")) == 2
    # uses of registers no load is filling, and uniform registers, are not waits
    assert trips(_sass(*independent, "@P0 FFMA R9, R8, R10.reuse, RZ", "UIADD3 UR4, UR4, UR6, URZ",
                       "@!P1 LDG.E.U16 R12, desc[UR4][R30.64]")) == 1  # fmt: skip
    # an address pair (R24.64) reads R25 too, here the upper half of a pointer that was loaded
    assert trips(_sass("LDG.E R25, desc[UR4][R10.64]", "LDG.E R12, desc[UR4][R24.64]")) == 2
    # a third trip waits on the second
    chain = ("LDG.E R2, desc[UR4][R10.64]", "FADD R3, R2, 1", "LDG.E R4, desc[UR4][R12.64]", "FADD R5, R4, R3",
             "LDG.E R6, desc[UR4][R14.64]")  # fmt: skip
    assert trips(_sass(*chain)) == 3
    # the two sides of a branch are two paths (addresses go up by 0x10): the else side's load does not wait on the
    # then side's use, which comes before it in the listing
    then_uses = ("LDG.E R2, desc[UR4][R10.64]", "ISETP.NE.AND P0, PT, R0, RZ, PT", "@P0 BRA 0x50",
                 "FADD R3, R2, 1", "EXIT", "LDG.E R6, desc[UR4][R16.64]", "FADD R7, R6, R2", "EXIT")  # fmt: skip
    assert trips(_sass(*then_uses)) == 1
    then_loads = (*then_uses[:2], "@P0 BRA 0x60", then_uses[3], "LDG.E R4, desc[UR4][R12.64]", "EXIT",
                  "LDG.E R6, desc[UR4][R16.64]", "EXIT")  # fmt: skip
    assert trips(_sass(*then_loads)) == 2  # the worst path counts: here the then side's
    # where the paths join, the worse of the two: after the join a load waits on what either side waited for
    join = ("LDG.E R2, desc[UR4][R10.64]", "@P0 BRA 0x30", "FADD R3, R2, 1", "LDG.E R4, desc[UR4][R12.64]")
    assert trips(_sass(*join)) == 2
    # a loop body is read once: its backward branch is not followed
    loop = ("LDG.E R4, desc[UR4][R12.64]", "FADD R5, R4, R5", "@P0 BRA 0x0", "LDG.E R8, desc[UR4][R14.64]")
    assert trips(_sass(*loop)) == 2


def _compiled(tmp_path, task: str, candidates: tuple[str, ...], shape: str) -> dict[str, list[InspectionRecord]]:
    """`harness inspect` of each candidate at one shape, their commands side by side (each compiles on
    one core): the records of what compiled, by candidate."""

    def inspect(candidate: str) -> list[InspectionRecord]:
        result = harness("inspect", f"task={task}", f"candidate={candidate}", f"shapes=['{shape}']",
                         f"results_dir={tmp_path / candidate}")  # fmt: skip
        assert result.returncode == 0, result.stderr
        return [r for r in _records(tmp_path / candidate, task) if r.status == "compiled"]

    with ThreadPoolExecutor(len(candidates)) as pool:
        return dict(zip(candidates, pool.map(inspect, candidates), strict=True))


def test_lean_rows_loads_take_two_round_trips_without_a_register_cap_and_upfront_rows_one(tmp_path):
    """router_gemm/upfront_row is lean_row launched with maxnreg: the reason it exists, as ptxas compiles it."""
    (lean,), (upfront,) = (
        [r for r in records if r.kernel == "_row_dot_kernel"]
        for records in _compiled(tmp_path, "router_gemm", ("lean_row", "upfront_row"), "T=1").values()
    )
    assert "maxnreg" not in lean.config and "maxnreg=128" in upfront.config
    assert lean.figures["loads"] == upfront.figures["loads"] == {"16": 5, "8": 5}  # the same ten loads per thread
    assert (lean.figures["registers"], lean.figures["sass"]["load_round_trips"]) == (32, 2)
    assert (upfront.figures["registers"], upfront.figures["sass"]["load_round_trips"]) == (40, 1)
    assert upfront.figures["spill_store_bytes"] == 0


def test_loads_first_programs_wait_for_memory_twice_where_pdl_token_rings_wait_three_to_five_times(tmp_path):
    """qk_norm_rope/loads_first issues every load its id determines before waiting for any: at sliding T = 1 each
    grid config makes two round trips (the second for the cos|sin row of the token's position), its parent's 3-5."""
    trips = {
        candidate: {r.config: r.figures["sass"]["load_round_trips"] for r in records}
        for candidate, records in _compiled(tmp_path, "qk_norm_rope", ("pdl_token_ring", "loads_first"),
                                            "sliding T=1").items()
    }  # fmt: skip
    assert trips["loads_first"].keys() == trips["pdl_token_ring"].keys() and len(trips["loads_first"]) == 6
    assert set(trips["loads_first"].values()) == {2}
    assert min(trips["pdl_token_ring"].values()) == 3 and max(trips["pdl_token_ring"].values()) == 5


def test_fuse_norm_loads_first_plain_programs_make_one_round_trip_where_mixed_squares_make_two(tmp_path):
    """fuse_norm/loads_first is mixed_squares with a barrier after a plain program's first loads: ptxas can no longer
    issue the weights' and h's loads after y's sum of squares. The rings (TMA) are the same code."""
    trips = {
        candidate: {r.config: (r.figures["sass"]["load_round_trips"], r.figures["spill_store_bytes"]) for r in records}
        for candidate, records in _compiled(tmp_path, "fuse_norm", ("mixed_squares", "loads_first"), "T=1").items()
    }  # fmt: skip
    plain = [c for c in trips["mixed_squares"] if "RING=False" in c]
    assert trips["loads_first"].keys() == trips["mixed_squares"].keys() and len(plain) == 6
    assert {trips["mixed_squares"][c] for c in plain} == {(2, 0)}  # (round trips, spilled bytes)
    assert {trips["loads_first"][c] for c in plain} == {(1, 0)}
    rings = [c for c in trips["loads_first"] if c not in plain]
    assert rings and all(trips["loads_first"][c] == trips["mixed_squares"][c] == (1, 0) for c in rings)


def test_a_compile_error_in_a_called_function_is_recorded_with_its_own_message_first(tmp_path):
    """Triton raises an error inside a @jit helper as a CompilationError at each call site, each the cause of the
    next; the outermost says only where the kernel calls the helper. The record leads with the helper's error."""
    result = harness("inspect", "task=fuse_norm", f"candidate={FIXTURES / 'inspect' / 'mixed_returns.py'}",
                     f"results_dir={tmp_path}")  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr  # nothing compiled
    (record,) = _records(tmp_path)
    assert record.status == "compile_error" and record.kernel == "_copy_kernel"
    assert record.detail.splitlines() == [
        "CompilationError: at 4:4: return x: TypeError(\"Inconsistent return types: <['1024'], fp32> and <['1024'], "
        'bf16>")',
        "raised through: at 3:8: x = _maybe_widened(tl.load(src_ptr + offs, mask=offs < n), True)",
    ]
    assert "Inconsistent return types" in result.stdout


def test_error_text_leads_with_a_compilation_errors_innermost_cause_and_bounds_its_length():
    """harness/child.error_text, the detail of a parity call's, an inspection's or a profile's failure: a chain of
    Triton CompilationErrors (one per call site) reads innermost first; any other exception as it is."""
    from harness.child import error_text

    class CompilationError(Exception):  # Triton's, matched by name (the parent never imports triton)
        pass

    def raise_chain(outer_type):
        try:
            try:
                raise CompilationError("at 5:4:\n    return w\n    ^\nTypeError('Inconsistent return types')")
            except CompilationError as inner:
                raise CompilationError("at 10:48:\n    post = _as_f32(w)\n           ^") from inner
        except CompilationError as middle:
            raise outer_type("at 55:12:\n    _fuse_row(y, h)\n    ^") from middle

    with pytest.raises(CompilationError) as caught:
        raise_chain(CompilationError)
    assert error_text(caught.value).splitlines() == [
        "CompilationError: at 5:4: return w: TypeError('Inconsistent return types')",
        "raised through: at 10:48: post = _as_f32(w); at 55:12: _fuse_row(y, h)",
    ]
    with pytest.raises(ValueError) as caught:  # not Triton's: its own message, not its cause's
        raise_chain(ValueError)
    assert error_text(caught.value) == "ValueError: at 55:12:\n    _fuse_row(y, h)\n    ^"
    assert error_text(TypeError("x" * 5000), limit=100) == "TypeError: " + "x" * 86 + "..."
    assert error_text(TypeError("alone")) == "TypeError: alone"


def test_launch_arguments_are_specialized_as_on_the_gpu():
    import torch
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    def body(x_ptr, y_ptr, n, stride, one, scale, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(y_ptr + offs * stride * one, tl.load(x_ptr + offs, mask=offs < n) * scale, mask=offs < n)

    kernel = JITFunction(body)  # what triton.jit makes off the interpreter (the tests run on it)

    x = torch.zeros(64, dtype=torch.bfloat16)
    y = torch.zeros(64, dtype=torch.float32)
    sig, consts, divisible = inspect_child.signature(kernel, (x, y[1:], 64, 3, 1, 0.5), {}, {"BLOCK": 64})
    assert sig == {"x_ptr": "*bf16", "y_ptr": "*fp32", "n": "i32", "stride": "i32", "one": "constexpr",
                   "scale": "fp32", "BLOCK": "constexpr"}  # fmt: skip
    assert consts == {"one": 1, "BLOCK": 64}
    assert divisible == ["x_ptr", "n"]  # y[1:] starts 4 bytes in; 3 is not a multiple of 16


def test_a_config_is_described_with_the_values_its_heuristics_derive():
    """router_gemm's BLOCK_T comes from triton.heuristics (the token bucket): without it two rows of the
    table at T=8 and T=64 read the same config while they compiled different tiles."""
    import triton
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    def body(x_ptr, t_bucket, USE_MMA: tl.constexpr, BLOCK_T: tl.constexpr):
        tl.store(x_ptr + tl.arange(0, BLOCK_T), 0.0)

    rules = {"BLOCK_T": lambda args: max(args["t_bucket"], 16) if args["USE_MMA"] else args["t_bucket"]}
    config = triton.Config({"USE_MMA": True}, num_warps=4, num_stages=3)
    launch = inspect_child.Launch("k", JITFunction(body), [config], (None, 8), {}, {}, [rules])
    assert launch.derived(config) == {"BLOCK_T": 16}
    assert inspect_child._describe(config, launch.derived(config)) == "USE_MMA=True, BLOCK_T=16, warps=4, stages=3"
    assert inspect_child._describe(config) == "USE_MMA=True, warps=4, stages=3"  # no heuristics: as before


def test_host_tma_descriptors_are_specialized_by_dtype_and_block_shape():
    import torch
    import triton.language as tl
    from triton.runtime.jit import JITFunction, mangle_type
    from triton.tools.tensor_descriptor import TensorDescriptor

    def body(x_desc, out_ptr, BLOCK: tl.constexpr):
        tl.store(out_ptr + tl.arange(0, BLOCK)[None, :], x_desc.load([0, 0]))

    x = torch.zeros(8, 96, dtype=torch.bfloat16)
    desc = TensorDescriptor(x, [8, 96], [96, 1], [1, 32])
    sig, _, _ = inspect_child.signature(JITFunction(body), (desc, x), {}, {"BLOCK": 32})
    assert sig == {"x_desc": "tensordesc<bf16[1, 32]>", "out_ptr": "*bf16", "BLOCK": "constexpr"}
    assert sig["x_desc"] == mangle_type(desc)  # Triton's own name for it at a launch


def _records(results_dir, task="fuse_norm") -> list[InspectionRecord]:
    lines = read_lines(results_dir / task / INSPECTIONS_FILE).rows
    return [InspectionRecord(**r) for r in lines]


def test_inspect_compiles_every_config_of_a_real_candidate_for_the_h200(tmp_path):
    """Three children share the seven compilations out (more than this machine's cores); the records come in the
    autotuner's order of configs, as from one child."""
    result = harness("inspect", "task=fuse_norm", "candidate=row_per_program", "jobs=3", f"results_dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    records = _records(tmp_path)
    assert all(r.status == "compiled" and r.shape_label == "T=1" for r in records)
    assert [r.config for r in records] == [f"warps={w}, stages=3" for w in (1, 2, 4, 8, 16)] + [
        "warps=4, stages=3, maxnreg=96", "warps=8, stages=3, maxnreg=64"]  # fmt: skip
    by_config = {r.config: r.figures for r in records}
    warps = [by_config[f"warps={w}, stages=3"]["registers"] for w in (2, 4, 8, 16)]
    assert warps == sorted(warps, reverse=True) and warps[-1] < 64  # fewer elements per thread, fewer registers
    capped = by_config["warps=4, stages=3, maxnreg=96"]
    assert capped["registers"] <= 96 and capped["spill_store_bytes"] > 0  # the cap spills (24 B with triton 3.6)
    four = by_config["warps=4, stages=3"]
    assert four["loads"]["16"] > 0 and set(four["stores"]) == {"16"}  # 128-bit vectors: the strides were specialized
    assert four["programs_per_sm"] == 4 and four["limited_by"] == "registers"
    # the SASS of Triton's own cubin: two exact FP64 row sums, so FP64 adds and F2F.F64.F32 conversions
    assert four["sass"]["instructions"] > 100 and four["sass"]["fp64"] > 0 and four["sass"]["conversions"] > 0
    assert "| _fuse_norm_kernel | warps=4, stages=3 | T=1 |" in result.stdout
    assert records[0].candidate_hash and records[0].environment["triton"]


def test_a_launcher_that_asks_the_device_for_its_sm_count_is_told_the_h200s(tmp_path):
    """qkv_gate_gemm/swap_ab sizes its grid from torch.cuda.get_device_properties: without the
    stand-in, inspect on a machine without CUDA recorded no_launch ('Torch not compiled with CUDA')."""
    result = harness("inspect", "task=fuse_norm", f"candidate={FIXTURES / 'inspect' / 'persistent_grid.py'}",
                     f"results_dir={tmp_path}")  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    (record,) = _records(tmp_path)
    assert record.status == "compiled" and record.kernel == "_copy_kernel"


def test_a_launcher_on_moe_experts_beam_weights_is_compiled_without_drawing_20_gb(tmp_path):
    """The expert weights at beam are 3 x 6.7 GB of BF16: drawn on the CPU, the child was killed
    (exit -9) before it compiled anything; made unfilled (tasks/inputs.py), they cost no memory."""
    result = harness("inspect", "task=moe_experts", f"candidate={FIXTURES / 'inspect' / 'expert_rows.py'}",
                     f"results_dir={tmp_path}")  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    (record,) = _records(tmp_path, task="moe_experts")
    assert (record.status, record.kernel, record.shape_label) == ("compiled", "_expert_row_kernel", "T=1")
    assert record.signature["w_ptr"] == "*bf16"


def test_a_launcher_that_raises_before_launching_is_recorded_and_exits_1(tmp_path):
    result = harness("inspect", "task=fuse_norm", f"candidate={FIXTURES / 'fuse_norm' / 'raises.py'}",
                     f"results_dir={tmp_path}")  # fmt: skip
    assert result.returncode == 1
    (record,) = _records(tmp_path)
    assert record.status == "no_launch" and "planted: this launcher always raises" in record.detail
    assert "no_launch" in result.stdout


def test_a_candidate_reading_secrets_is_a_sandbox_violation(tmp_path):
    result = harness("inspect", "task=fuse_norm", f"candidate={FIXTURES / 'fuse_norm' / 'reads_secret.py'}",
                     f"results_dir={tmp_path}")  # fmt: skip
    assert result.returncode == 1
    (record,) = _records(tmp_path)
    assert record.status == "sandbox_violation" and "secret" in record.detail


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("task=fuse_norm",), "task and candidate are required"),
        (("task=nope", "candidate=x"), "known"),
        (("task=fuse_norm", "candidate=missing_file"), "missing_file"),
        (("task=fuse_norm", "candidate=row_per_program", "shapes=['T=2']"), "has no GPU shapes ['T=2']"),
        (("task=fuse_norm", "candidate=row_per_program", "jobs=-1"), "jobs must be 0 (one child per core"),
    ],
)
def test_bad_input_is_a_clear_error(tmp_path, args, message):
    result = harness("inspect", *args, f"results_dir={tmp_path}")
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert not (tmp_path / "fuse_norm" / INSPECTIONS_FILE).exists()


def test_the_parts_reports_are_merged_in_config_order_and_a_dead_part_names_the_shapes_it_left():
    """The first of two parts reports configs 0 and 2 of T=1 and the no_launch of T=8; the second reports config 1
    of T=1, then dies with config 3 of T=64 unreported. T=64 gets a crash record saying so; T=1 and T=8 lost
    nothing."""
    from types import SimpleNamespace

    from harness.inspect_kernels import _records as merged

    def compiled(shape, index):
        return {"event": "compiled", "shape": shape, "index": index, "kernel": "k", "config": f"c{index}",
                "figures": {"registers": index}, "signature": {}}  # fmt: skip

    part0 = [{"event": "isolation"}, {"event": "owned", "shape": "T=1", "indices": [0, 2]}, compiled("T=1", 0),
             compiled("T=1", 2), {"event": "owned", "shape": "T=8", "indices": []},
             {"event": "no_launch", "shape": "T=8", "index": 3, "message": "none"},
             {"event": "owned", "shape": "T=64", "indices": []}, {"event": "done", "violations": []}]  # fmt: skip
    part1 = [{"event": "isolation"}, {"event": "owned", "shape": "T=1", "indices": [1]}, compiled("T=1", 1),
             {"event": "owned", "shape": "T=8", "indices": []},
             {"event": "owned", "shape": "T=64", "indices": [3]}]  # fmt: skip
    base = {"run_id": "r", "task": "fuse_norm", "candidate": "c", "candidate_hash": "h" * 64, "candidate_path": "p"}
    shapes = ("T=1", "T=8", "T=64")
    ok = SimpleNamespace(events=part0, timed_out=False, returncode=0, log_tail="")
    died = SimpleNamespace(events=part1, timed_out=False, returncode=-11, log_tail="Segmentation fault")
    records = merged([ok, died], base, shapes)
    assert [(r.shape_label, r.status, r.config) for r in records] == [
        ("T=1", "compiled", "c0"), ("T=1", "compiled", "c1"), ("T=1", "compiled", "c2"),
        ("T=8", "no_launch", None), ("T=64", "crash", None)]  # fmt: skip
    assert records[-1].detail.startswith("the child of part 2 of 2 died (exit -11) with configs of this shape "
                                         "unreported; its log ends: Segmentation fault")  # fmt: skip
    # A part that times out compiling config 1: T=1 has records from the other part and still lost one; the
    # shapes the part never reached are unreported too.
    early = [{"event": "isolation"}, {"event": "owned", "shape": "T=1", "indices": [1]}]
    timed_out = SimpleNamespace(events=early, timed_out=True, returncode=None, log_tail="")
    records = merged([ok, timed_out], base, shapes)
    assert [(r.shape_label, r.status) for r in records] == [
        ("T=1", "compiled"), ("T=1", "compiled"), ("T=1", "timeout"), ("T=8", "no_launch"), ("T=8", "timeout"),
        ("T=64", "timeout")]  # fmt: skip
    assert records[2].detail.startswith("the child of part 2 of 2 ran past its time limit")


def test_records_round_trip_and_refuse_figures_without_compilation():
    base = {"run_id": "r", "task": "fuse_norm", "candidate": "c", "candidate_hash": "h" * 64,
            "candidate_path": "p", "shape_label": "T=1"}  # fmt: skip
    with pytest.raises(ValueError, match="figures come with status compiled only"):
        InspectionRecord(**base, status="no_launch", figures={"registers": 1})
    with pytest.raises(ValueError, match="status must be one of"):
        InspectionRecord(**base, status="fast")
    r = InspectionRecord(**base, status="crash", detail="exit -11")
    assert InspectionRecord(**json.loads(json.dumps(r.to_dict()))) == r
