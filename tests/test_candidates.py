"""Every committed candidate passes parity through the harness on the CPU shapes (Triton interpreter).

One runner call per task evaluates every file under candidate_kernels/<task>/, sandboxed, over two
seeds, with every config its GPU autotuners may choose forced in turn (configs=auto); a candidate
that breaks the file contract fails here as bad input.
"""

from __future__ import annotations

import pytest

from harness import candidates, runner
from harness.environment import REPO_ROOT
from harness.records import Status
from tasks import TASKS

WITH_CANDIDATES = sorted(name for name in TASKS if candidates.discover(name, TASKS[name].op_name))


def test_some_task_has_candidates():
    assert WITH_CANDIDATES, "no candidate files under candidate_kernels/<task>/"


@pytest.mark.parametrize("task_name", WITH_CANDIDATES)
def test_every_candidate_passes_parity(task_name, tmp_path):
    task = TASKS[task_name]
    found = candidates.discover(task_name, task.op_name)
    settings = runner.EvaluationSettings(device="cpu", seeds=(1, 2), results_dir=str(tmp_path / "results"),
                                         cache_dir=str(tmp_path / "cache"), progress=False)  # fmt: skip
    result = runner.evaluate(task, found, settings, echo=lambda _: None)
    failures = [
        f"{r.implementation} on {r.shape_label}: {r.status.value}: {r.detail}\n{r.log_tail[-1500:]}"
        for r in result.records
        if r.status is not Status.PASSED
    ]
    assert not failures, "\n\n".join(failures)
    assert {r.implementation for r in result.records} == {c.name for c in found}
    assert len(result.records) == len(found) * len(task.cpu_shapes)
    # configs=auto: every config a GPU autotuner of the file may choose was forced too, or the record says why not
    for r in result.records:
        if "triton.autotune" in (REPO_ROOT / r.candidate_path).read_text():
            assert r.configs_checked or r.configs_idle or r.configs_unchecked, (r.implementation, r.shape_label)


def _gpu_configs_by_kernel(task, path, tmp_path) -> list[tuple[str, dict]]:
    """(kernel, kwargs) of every config the candidate file's GPU autotuners may choose, as the runner lists them."""
    settings = runner.EvaluationSettings(device="cpu", results_dir=str(tmp_path), cache_dir=str(tmp_path))
    with runner._Evaluation(task, [candidates.load(path, task.name, task.op_name)], settings) as ev:
        return [(f["kernel"], f["config"]["kwargs"]) for f in ev._list_configs(ev.units[0])]


def _gpu_configs(task, path, tmp_path) -> list[dict]:
    """The kwargs of every config the candidate file's GPU autotuners may choose, as the runner lists them."""
    return [kwargs for _, kwargs in _gpu_configs_by_kernel(task, path, tmp_path)]


def _load_module(path):
    """A candidate file imported on its own (under the interpreter, as the tests run)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{path.stem}_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- router_gemm: its interpreter launcher passes the config itself, which the runner cannot force -------
@pytest.mark.parametrize(
    "candidate",
    (
        "splitk_bf16x3 row_vector swap_ab_bf16x3 narrow_tiles vector_width red_fixup pdl_red_fixup pdl_stream_words "
        "lean_row"
    ).split(),
)
def test_router_gemm_computes_the_task_function_with_every_gpu_config(candidate, tmp_path):
    """The runner records its GPU configs as unchecked (its interpreter kernel is no autotuner); here
    each one it lists goes through the launcher's own hook for the interpreter's config instead
    (row_vector: its 1-D FMA path at T = 1, the 2-D one at T = 5 and 8, BF16x3 everywhere)."""
    import torch

    from harness import interpreter_patches, parity

    task = TASKS["router_gemm"]
    path = REPO_ROOT / "candidate_kernels" / "router_gemm" / f"{candidate}.py"
    gpu_configs = _gpu_configs(task, path, tmp_path)
    module = _load_module(path)
    interpreter_patches.apply()
    shipped, failures = module._interpreter_config, []
    try:
        for kwargs in gpu_configs:
            module._interpreter_config = lambda *_, kw=kwargs: dict(kw)
            for shape in task.cpu_shapes:
                inputs = task.make_inputs(shape, 1, torch.device("cpu"))
                got = parity.output_tensors(task, module.router_logits(**parity.clone_inputs(inputs)), inputs)
                refs = parity.admissible_references(task, inputs, emulate_truncation=False)
                verdict = parity.judge(task, got, refs, parity.fp64_evaluation(task, inputs))
                if not verdict.passed:
                    failures.append(f"{kwargs} on {shape.label}: {verdict.reason}")
    finally:
        module._interpreter_config = shipped
    assert len(gpu_configs) > 1 and not failures, "\n".join(failures)


@pytest.mark.parametrize("candidate", ["red_fixup", "pdl_stream_words"])
def test_red_fixup_recovers_from_a_launch_that_stops_part_way(candidate, tmp_path, monkeypatch):
    """red_fixup's split-K words count arrivals across launches and are never reset. A launch that stops
    between one split's arrival and the generation it raises (here: the first arriver's raise fails)
    would leave every later launch waiting forever on that tile; the launcher zeroes the words instead,
    and the next launch computes the task function. pdl_stream_words lays its words out otherwise."""
    import numpy as np
    import torch
    from triton.runtime import interpreter

    from harness import interpreter_patches, parity

    task = TASKS["router_gemm"]
    module = _load_module(REPO_ROOT / "candidate_kernels" / "router_gemm" / f"{candidate}.py")
    interpreter_patches.apply()
    shape = next(s for s in task.cpu_shapes if s["T"] == 8)  # BF16x3 with a 2-way split under the interpreter
    inputs = task.make_inputs(shape, 1, torch.device("cpu"))
    words = module._tile_words(torch.device("cpu"), 1)
    before = words.clone()
    module.router_logits(**parity.clone_inputs(inputs))
    tiles = words != before
    assert tiles.any() and (words[tiles] - before[tiles] == int(module.GENERATION_ONE) + 64).all()

    rmw = interpreter.InterpreterBuilder.create_atomic_rmw

    def failing_raise(self, op, ptr, val, mask, sem, scope):
        if np.any(np.asarray(val.data) == int(module.GENERATION_ONE)):
            raise RuntimeError("stopped before raising the generation")
        return rmw(self, op, ptr, val, mask, sem, scope)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_atomic_rmw", failing_raise)
    with pytest.raises(Exception, match="stopped before raising the generation"):
        module.router_logits(**parity.clone_inputs(inputs))
    assert not words.any(), "a launch that stopped part-way must leave the words zeroed"
    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_atomic_rmw", rmw)

    got = parity.output_tensors(task, module.router_logits(**parity.clone_inputs(inputs)), inputs)
    refs = parity.admissible_references(task, inputs, emulate_truncation=False)
    verdict = parity.judge(task, got, refs, parity.fp64_evaluation(task, inputs))
    assert verdict.passed, verdict.reason
    assert (words[tiles] == int(module.GENERATION_ONE) + 64).all()


# ---- qk_norm_rope/token_ring: the plain-load path for inputs TMA cannot read ------------------------------
def _qk_inputs(T, H, K, Dh, sliding, gen, q_offset=0, packed_kv=False, discard_every=0):
    """Random qk_norm_rope inputs with a few layouts the task's own shapes never give: q at an odd
    element offset (TMA needs 16-byte aligned bases), k and v as views of one packed [T, 2K, Dh]
    tensor (strided, still readable by TMA), tokens the cache does not keep (slot -1)."""
    import torch

    from reference_model import ops

    q = torch.randn(T * H * Dh + q_offset, generator=gen).to(torch.bfloat16)[q_offset:].view(T, H, Dh)
    if packed_kv:
        kv = torch.randn(T, 2 * K, Dh, generator=gen).to(torch.bfloat16)
        k, v = kv[:, :K], kv[:, K:]
    else:
        k, v = (torch.randn(T, K, Dh, generator=gen).to(torch.bfloat16) for _ in range(2))
    P, S = 64, 3 * T + 1
    slots = torch.randperm(S - 1, generator=gen)[:T]
    if discard_every:
        slots[::discard_every] = -1
    return {
        "q_THD": q,
        "k_TKD": k,
        "v_TKD": v,
        "q_norm_weight": (1 + 0.1 * torch.randn(Dh, generator=gen)).to(torch.bfloat16),
        "k_norm_weight": (1 + 0.1 * torch.randn(Dh, generator=gen)).to(torch.bfloat16),
        "positions_T": torch.randint(0, P, (T,), generator=gen),
        "slot_mapping_T": slots,
        "k_cache_SKD": torch.randn(S, K, Dh, generator=gen).to(torch.bfloat16),
        "v_cache_SKD": torch.randn(S, K, Dh, generator=gen).to(torch.bfloat16),
        "rope_cos_sin_PD": ops.rope_table(P, Dh, 10000.0) if sliding else None,
        "ssmax_scale_P": None if sliding else ops.ssmax_table(P, 2048, 0.1),
        "eps": 1e-6,
    }


@pytest.mark.parametrize("candidate", ["token_ring", "pdl_token_ring", "loads_first"])
def test_token_ring_matches_head_groups_where_tma_cannot_read(candidate, tmp_path):
    """token_ring's ring reads TMA tiles; inputs TMA cannot read (Dh/2 not a power of two, a misaligned
    base) take its plain loads. With every GPU config of each kernel forced in turn, both paths, odd head
    counts (groups of 2 and 1 heads), strided k/v views and discarded tokens give head_groups' outputs and
    caches bit for bit (pdl_token_ring: its ring kernel from T = 4 on here, its grid kernel below; loads_first:
    pdl_token_ring with its plain-load programs' loads reordered, v read for discarded tokens too)."""
    import torch

    from harness import interpreter_patches

    task = TASKS["qk_norm_rope"]
    folder = REPO_ROOT / "candidate_kernels" / "qk_norm_rope"
    gpu_configs = _gpu_configs_by_kernel(task, folder / f"{candidate}.py", tmp_path)
    modules = {name: _load_module(folder / f"{name}.py") for name in (candidate, "head_groups")}
    interpreter_patches.apply()
    ring = modules[candidate]
    kernels = {name: getattr(ring, name) for name, _ in gpu_configs}

    class Forced:  # the launcher's kernel[grid](...) with one config's constexprs, as the autotuner would
        def __init__(self, autotuned):
            self.autotuned, self.kwargs = autotuned, None

        def __getitem__(self, grid):
            if self.kwargs is None:  # another kernel's config is forced: this one as the file has it
                return self.autotuned[grid]

            def launch(*args, **kw):
                kw.pop("enable_fp_fusion")
                return self.autotuned.fn[grid({**kw, **self.kwargs})](*args, **kw, **self.kwargs)

            return launch

    cases = {
        "Dh=24 (plain)": dict(T=3, H=6, K=3, Dh=24, sliding=True),
        "q misaligned (plain)": dict(T=4, H=4, K=2, Dh=16, sliding=True, q_offset=1),
        "packed k/v, discards (TMA)": dict(T=5, H=12, K=4, Dh=16, sliding=True, packed_kv=True, discard_every=2),
        "global, discards (TMA)": dict(T=5, H=8, K=2, Dh=32, sliding=False, discard_every=3),
    }
    failures, paths = [], set()
    forced = {name: Forced(autotuned) for name, autotuned in kernels.items()}
    for name in kernels:
        setattr(ring, name, forced[name])
    try:
        for kernel, kwargs in gpu_configs:
            for f in forced.values():
                f.kwargs = kwargs if f is forced[kernel] else None
            for label, case in cases.items():
                inputs = _qk_inputs(**case, gen=torch.Generator().manual_seed(7))
                table = inputs["rope_cos_sin_PD"] if case["sliding"] else torch.empty(1, case["Dh"])
                paths.add(ring._tma_ok(case["Dh"] // 2, inputs["q_THD"], inputs["k_TKD"], inputs["v_TKD"], table))
                outs = {}
                for name, module in modules.items():
                    run = {k: v.clone() if k.endswith("cache_SKD") else v for k, v in inputs.items()}
                    outs[name] = (*module.qk_norm_rope(**run), run["k_cache_SKD"], run["v_cache_SKD"])
                if not all(torch.equal(a, b) for a, b in zip(outs[candidate], outs["head_groups"], strict=True)):
                    failures.append(f"{kernel} {kwargs} on {label}")
    finally:
        for name, autotuned in kernels.items():
            setattr(ring, name, autotuned)
    assert paths == {True, False}, "the cases must take both the TMA and the plain path"
    assert len(gpu_configs) > 1 and not failures, "\n".join(failures)


# ---- qkv_gate_gemm/flat_gemv: the one-token GEMV on rows and widths the task never gives --------------
@pytest.mark.parametrize("candidate", ["flat_gemv", "pdl_flat_gemv"])
def test_flat_gemv_rounds_every_row_once_at_any_width(candidate, tmp_path):
    """At T = 1 flat_gemv runs its GEMV, not swap_ab's MMAs. With each of its GPU configs forced, a row
    count that leaves a masked row (7, 5, 3 against ROWS = 2) and widths with no tail (64), a masked
    tail (100: 64 + 36 of 64) and a 2-wide one (130: 128 + 2), every output is the exact FP64 product
    rounded once to BF16, give or take the FP32 sum's own error. pdl_flat_gemv, the same kernel launched
    with PDL (its configs carry launch_pdl), too."""
    import torch
    import triton

    from harness import interpreter_patches

    path = REPO_ROOT / "candidate_kernels" / "qkv_gate_gemm" / f"{candidate}.py"
    gemv_configs = [kw for kw in _gpu_configs(TASKS["qkv_gate_gemm"], path, tmp_path) if "ROWS" in kw]
    assert all(kw.get("launch_pdl", False) == (candidate == "pdl_flat_gemv") for kw in gemv_configs), gemv_configs
    module = _load_module(path)
    interpreter_patches.apply()
    shipped, failures = module._gemv_kernel.configs, []
    gen = torch.Generator().manual_seed(3)
    try:
        for kwargs in gemv_configs:
            module._gemv_kernel.configs = [triton.Config(kwargs)]
            for N, D in ((7, 64), (5, 100), (3, 130)):
                x = torch.randn(1, D, generator=gen).to(torch.bfloat16)
                w = (torch.randn(N, D, generator=gen) / D**0.5).to(torch.bfloat16)
                exact = x.double() @ w.double().T
                got = module.qkv_gate_proj(x, w).double()
                # half a BF16 ulp of the exact value, plus the FP32 sum's error bound over D products
                ulp = torch.exp2(torch.floor(torch.log2(exact.abs())) - 7)
                bound = ulp / 2 + D * 2**-24 * (x.double().abs() @ w.double().abs().T)
                if got.shape != (1, N) or not bool(((got - exact).abs() <= bound).all()):
                    failures.append(f"{kwargs} N={N} D={D}: {got.tolist()} against {exact.tolist()}")
    finally:
        module._gemv_kernel.configs = shipped
    assert len(gemv_configs) > 1 and not failures, "\n".join(failures)


# ---- router_gemm/lean_row and upfront_row: one token through their own row kernel ------------------------
@pytest.mark.parametrize("candidate", ["lean_row", "upfront_row"])
def test_lean_row_runs_its_row_kernel_for_one_token_where_its_preconditions_hold(candidate, monkeypatch):
    """lean_row computes one token with _row_dot_kernel (no masks: D a few power-of-two blocks, plain strides),
    everything else with its parent's kernel; both give the task function. upfront_row, its child, launches the
    same kernel with a register cap on the GPU (tests/test_inspect.py checks what the cap changes)."""
    import torch

    from harness import interpreter_patches, parity

    task = TASKS["router_gemm"]
    module = _load_module(REPO_ROOT / "candidate_kernels" / "router_gemm" / f"{candidate}.py")
    interpreter_patches.apply()  # as the runner's children do: the parent's BF16x3 path at T = 5 and 8 uses tl.dot
    x1, w = torch.zeros(1, 5120, dtype=torch.bfloat16), torch.zeros(256, 5120)
    assert module._lean_block_k(x1, w) == 1024  # Beam: 5 blocks of 1024
    assert module._lean_block_k(torch.zeros(8, 5120, dtype=torch.bfloat16), w) == 0  # more than one token
    assert module._lean_block_k(x1, torch.zeros(5120, 256).t()) == 0  # W's rows not contiguous
    assert module._lean_block_k(torch.zeros(1, 100, dtype=torch.bfloat16), torch.zeros(8, 100)) == 0  # 25 blocks of 4
    x_meta = torch.empty(1, 1024, dtype=torch.bfloat16, device="meta")  # shapes and strides only, no memory
    assert module._lean_block_k(x_meta, torch.empty(2**21 - 1, 1024, device="meta")) == 1024
    assert module._lean_block_k(x_meta, torch.empty(2**21, 1024, device="meta")) == 0  # 2^31: beyond 32-bit offsets
    parent_kernel, launches = module._router_kernel, []

    def parent_launch(grid):
        launches.append(grid)
        return parent_kernel[grid]

    monkeypatch.setattr(module, "_router_kernel", _Indexable(parent_launch, parent_kernel))
    for shape in task.cpu_shapes:
        inputs = task.make_inputs(shape, 2, torch.device("cpu"))
        launches.clear()
        got = parity.output_tensors(task, module.router_logits(**parity.clone_inputs(inputs)), inputs)
        refs = parity.admissible_references(task, inputs, emulate_truncation=False)
        verdict = parity.judge(task, got, refs, parity.fp64_evaluation(task, inputs))
        assert verdict.passed, (shape.label, verdict.reason)
        assert bool(launches) == (shape["T"] > 1), (shape.label, "the parent's kernel launched" if launches else "")


class _Indexable:
    """Stands in for a Triton kernel: `kernel[grid]` calls `launch(grid)`; other attributes are the kernel's."""

    def __init__(self, launch, kernel):
        self._launch, self._kernel = launch, kernel

    def __getitem__(self, grid):
        return self._launch(grid)

    def __getattr__(self, name):
        return getattr(self._kernel, name)


# ---- fuse_norm/mixed_squares: squares built from their bits, on rows the task never draws ----------------
@pytest.mark.parametrize("candidate", ["mixed_squares", "loads_first"])
def test_mixed_squares_gives_its_parents_bits_on_zero_tiny_infinite_and_nan_rows(candidate, tmp_path):
    """mixed_squares builds most squares' FP64 values from their bits: zero squares and FP32-subnormal ones
    come out as junk near 2^-127 (its header says why no result sees it), inf and NaN stay so. With each GPU
    config forced, as shipped and with 6 of every 8 columns the integer way, rows of zeros, a tie only the
    exact sum resolves (1 + 2^-24), squares below FP32's normal range, an inf and a NaN give pdl_row_warps'
    outputs (every square converted) bit for bit, NaN where it gives NaN; at eps = 0, where the junk would
    reach the zero row's result (0 instead of NaN), the launcher converts every square. loads_first, its child (and
    replay_tuned's kernel), only adds a barrier: the same bits."""
    import torch
    import triton

    folder = REPO_ROOT / "candidate_kernels" / "fuse_norm"
    path = folder / f"{candidate}.py"
    configs = _gpu_configs(TASKS["fuse_norm"], path, tmp_path)
    module, parent = _load_module(path), _load_module(folder / "pdl_row_warps.py")
    gen = torch.Generator().manual_seed(5)
    T, D = 7, 96
    y = torch.randn(T, D, generator=gen)
    y[1] = 0.0
    y[2] = 0.0
    y[2, 0], y[2, 1] = 1.0, 2.0**-12  # a sum of squares of 1 + 2^-24, half an FP32 ulp above 1
    y[3] = 2.0**-70 * torch.randn(D, generator=gen).sign()  # squares of 2^-140: FP32 subnormals
    y[4, 5] = float("inf")
    y[5, 9] = float("nan")
    y[6, : D // 2] = 0.0
    y = y.to(torch.bfloat16)
    h = torch.randn(T, D, generator=gen).to(torch.bfloat16)
    w_post, w_pre = (1 + 0.1 * torch.randn(2, D, generator=gen)).to(torch.bfloat16)
    shipped, failures, tried = module._fuse_norm_ring_kernel.configs, [], 0
    try:
        for kwargs in configs:
            for mixed in sorted({kwargs["MIXED"], 6}):
                module._fuse_norm_ring_kernel.configs = [triton.Config({**kwargs, "MIXED": mixed})]
                for eps in (1e-6, 0.0):
                    got = module.norm_residual_norm(y, h, w_post, w_pre, 3, eps)
                    want = parent.norm_residual_norm(y, h, w_post, w_pre, 3, eps)
                    tried += 1
                    for name, g, w in zip(("h'", "x"), got, want, strict=True):
                        same = (g.view(torch.int16) == w.view(torch.int16)) | (g.isnan() & w.isnan())
                        if not bool(same.all()):
                            rows = sorted({int(r) for r in (~same).nonzero()[:, 0]})
                            failures.append(f"{kwargs} MIXED={mixed} eps={eps}: {name} differs in rows {rows}")
    finally:
        module._fuse_norm_ring_kernel.configs = shipped
    assert tried >= 2 * len(configs) > 2 and not failures, "\n".join(failures)
    want = parent.norm_residual_norm(y, h, w_post, w_pre, 3, 0.0)
    assert bool(want[1][1].isnan().all())  # the zero row at eps = 0: 0 * rsqrt(0); the junk would give 0


# ---- fuse_norm/replay_tuned: loads_first but for how its autotuner times a config ---------------------------
def test_replay_tuned_times_up_to_1024_rows_as_graph_replays(monkeypatch):
    """replay_tuned's autotuner times a config with triton.testing.do_bench_cudagraph up to 1024 rows (loads_first:
    up to 64) and with Triton's default timer above, as the launcher sets the rows bucket being tuned."""
    import triton

    folder = REPO_ROOT / "candidate_kernels" / "fuse_norm"
    timers = []
    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", lambda fn, quantiles: timers.append("graph"))
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, quantiles: timers.append("default"))
    for name in ("replay_tuned", "loads_first"):
        module = _load_module(folder / f"{name}.py")
        for T in (1, 64, 65, 1000, 1024, 1025, 16384):
            module._tuning_rows[0] = module._rows_bucket(T)
            module._time_config(lambda: None, (0.5, 0.2, 0.8))
    graph, default = ["graph"], ["default"]
    assert timers == graph * 5 + default * 2 + graph * 2 + default * 5


@pytest.mark.gpu
@pytest.mark.parametrize("candidate", ["pdl_stream_words", "lean_row"])
def test_router_split_k_words_compute_the_task_function_on_two_streams_at_once(candidate):
    """pdl_stream_words' split-K words are per stream: 40 calls queued on each of two streams behind a spin,
    so that the two queues run at once, all with a 32-way split at T = 64, every output the task function.
    Its parents keep one set of words per device, which two such queues would count their arrivals on.
    lean_row runs pdl_stream_words' kernel at T = 64."""
    import torch

    from harness import parity

    task = TASKS["router_gemm"]
    module = _load_module(REPO_ROOT / "candidate_kernels" / "router_gemm" / f"{candidate}.py")
    split = [c for c in module._router_kernel.configs if c.kwargs["USE_MMA"] and c.kwargs["SPLIT_K"] == 32
             and c.kwargs["BLOCK_E"] == 16 and c.num_warps == 2]  # fmt: skip
    module._router_kernel.configs = split[:1]
    device = torch.device("cuda")
    shape = task.shape("T=64", device)
    inputs = [task.make_inputs(shape, seed, device) for seed in (1, 2)]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    outs: list[list[torch.Tensor]] = [[], []]
    torch.cuda.synchronize()
    for stream in streams:
        with torch.cuda.stream(stream):
            torch.cuda._sleep(50_000_000)  # ~25 ms: both queues fill before either runs
    for _ in range(40):
        for s, stream in enumerate(streams):
            with torch.cuda.stream(stream):
                outs[s].append(module.router_logits(**inputs[s]))
    torch.cuda.synchronize()
    assert len({key for key in module._TILE_WORDS if key[0].type == "cuda"}) == 2
    for s in range(2):
        refs = parity.admissible_references(task, inputs[s], emulate_truncation=False)
        exact = parity.fp64_evaluation(task, inputs[s])
        for got in outs[s]:
            verdict = parity.judge(task, parity.output_tensors(task, got, inputs[s]), refs, exact)
            assert verdict.passed, verdict.reason
