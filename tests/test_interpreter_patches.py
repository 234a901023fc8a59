"""The interpreter, patched, computes what the GPU computes: tl.dot decodes BF16/FP16 operands and
multiplies in FP32, rounds FP32 operands to TF32 unless input_precision is "ieee" (or "tf32x3");
FP32 -> BF16 casts round to nearest even (truncate with rtz); loops over a runtime bound run under
numpy 2.4's scalar rule."""

import os

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from harness import interpreter_patches

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="patches the Triton interpreter (TRITON_INTERPRET=1)"
)

# M x K @ K x N, not powers of two where masks allow, small enough for the interpreter.
M, N, K = 5, 24, 40
BM, BN, BK = 16, 32, 16  # K loop of 3 steps, last one masked: the accumulator is carried


@triton.jit
def _matmul_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K, PRECISION: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):
    # a [M, K] row-major, b [N, K] row-major (a weight), c [M, N] FP32 = a @ b^T.
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + rn[None, :] * K + rk[:, None], mask=(rn[None, :] < N) & (rk[:, None] < K), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _matmul_f16_acc_kernel(a_ptr, b_ptr, c_ptr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    # One tile, FP16 accumulator (out_dtype=float16): the result must still be the FP16 product.
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a = tl.load(a_ptr + rm[:, None] * BK + rk[None, :])
    b = tl.load(b_ptr + rn[None, :] * BK + rk[:, None])
    c = tl.dot(a, b, out_dtype=tl.float16)
    tl.store(c_ptr + rm[:, None] * BN + rn[None, :], c)


def _matmul(a_MK: torch.Tensor, b_NK: torch.Tensor, precision: str) -> torch.Tensor:
    c_MN = torch.empty(M, N, dtype=torch.float32)
    _matmul_kernel[(1,)](a_MK, b_NK, c_MN, M, N, K, PRECISION=precision, BM=BM, BN=BN, BK=BK)
    return c_MN


@pytest.fixture(scope="module", autouse=True)
def patched():
    interpreter_patches.apply()
    yield


def _operands(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(M, K, generator=g).to(dtype), torch.randn(N, K, generator=g).to(dtype)


def test_apply_is_idempotent():
    from triton.runtime import interpreter

    assert interpreter_patches.is_applied()
    replaced = [getattr(owner, attr) for owner, attr, _, _ in interpreter_patches._replacements(interpreter)]
    assert len(replaced) == 8  # the builder's dot and two casts, _patch_builtin, the nested call, restore, np dtypes,
    # the tensor's __index__
    options = interpreter.interpreter_builder.options
    interpreter_patches.apply()
    assert [getattr(owner, attr) for owner, attr, _, _ in interpreter_patches._replacements(interpreter)] == replaced
    assert interpreter.interpreter_builder.options is options


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_dot_matches_fp32_matmul_of_upcast_operands(dtype):
    a_MK, b_NK = _operands(dtype)
    c_MN = _matmul(a_MK, b_NK, "ieee")
    expected_MN = a_MK.double() @ b_NK.double().t()
    # Products of 8/11-bit mantissas are exact in FP32; only the FP32 sum over K=40 rounds.
    torch.testing.assert_close(c_MN.double(), expected_MN, rtol=1e-6, atol=1e-5)


def test_fp16_accumulator():
    a_MK, b_NK = (t.to(torch.float16) for t in _operands(torch.float32))
    a_MK, b_NK = a_MK[:, :BK].contiguous(), b_NK[:, :BK].contiguous()
    a_pad = torch.zeros(BM, BK, dtype=torch.float16)
    a_pad[:M] = a_MK
    b_pad = torch.zeros(BN, BK, dtype=torch.float16)
    b_pad[:N] = b_NK
    c = torch.empty(BM, BN, dtype=torch.float16)
    _matmul_f16_acc_kernel[(1,)](a_pad, b_pad, c, BM=BM, BN=BN, BK=BK)
    expected = (a_pad.double() @ b_pad.double().t()).to(torch.float16)
    torch.testing.assert_close(c, expected, rtol=2e-3, atol=2e-3)


def test_fp32_ieee_is_exact_and_tf32_is_not():
    a_MK, b_NK = _operands(torch.float32)
    expected_MN = a_MK.double() @ b_NK.double().t()
    scale = expected_MN.abs().max().item()
    err_ieee = (_matmul(a_MK, b_NK, "ieee").double() - expected_MN).abs().max().item() / scale
    err_tf32 = (_matmul(a_MK, b_NK, "tf32").double() - expected_MN).abs().max().item() / scale
    err_tf32x3 = (_matmul(a_MK, b_NK, "tf32x3").double() - expected_MN).abs().max().item() / scale
    assert err_ieee < 1e-6 and err_tf32x3 < 1e-6
    # TF32 keeps 10 mantissa bits: per-operand relative error up to 2^-11, far above FP32's.
    assert 1e-5 < err_tf32 < 1e-2


def test_tf32_of_upcast_bf16_is_exact():
    # BF16 values have 7 mantissa bits: TF32 represents them exactly, so upcast-then-dot is unaffected.
    a_MK, b_NK = (t.float() for t in _operands(torch.bfloat16))
    expected_MN = a_MK.double() @ b_NK.double().t()
    torch.testing.assert_close(_matmul(a_MK, b_NK, "tf32").double(), expected_MN, rtol=1e-6, atol=1e-5)


def test_tf32_rounding_is_to_nearest():
    x = torch.tensor([1.0 + 2.0**-11, 1.0 + 2.0**-12, -(1.0 + 3 * 2.0**-12), float("inf"), float("nan")])
    got = torch.from_numpy(interpreter_patches._round_to_tf32(x.numpy()))
    expected = torch.tensor([1.0 + 2.0**-10, 1.0, -(1.0 + 2.0**-10), float("inf"), float("nan")])
    torch.testing.assert_close(got, expected, equal_nan=True, rtol=0, atol=0)


@triton.jit
def _to_bf16_kernel(x_ptr, rne_ptr, rtz_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(rne_ptr + offs, x.to(tl.bfloat16), mask=offs < n)
    tl.store(rtz_ptr + offs, x.to(tl.bfloat16, fp_downcast_rounding="rtz"), mask=offs < n)


def test_fp32_to_bf16_cast_rounds_to_nearest_even():
    g = torch.Generator().manual_seed(1)
    one_ulp = 2.0**-7
    specials = [
        1.0 + one_ulp / 2,  # tie, even neighbour below: stays 1.0
        1.0 + 3 * one_ulp / 2,  # tie, even neighbour above
        -(1.0 + one_ulp * 0.75),  # rounds away from truncation
        3.3895e38,  # rounds up to inf
        1e-40,  # subnormal
        float("inf"),
        -float("inf"),
        0.0,
        -0.0,
    ]
    x = torch.cat([torch.tensor(specials), torch.randn(100, generator=g) * 10.0 ** torch.randint(-30, 30, (100,))])
    rne = torch.empty(x.numel(), dtype=torch.bfloat16)
    rtz = torch.empty(x.numel(), dtype=torch.bfloat16)
    _to_bf16_kernel[(1,)](x, rne, rtz, x.numel(), BLOCK=128)
    assert torch.equal(rne.view(torch.int16), x.to(torch.bfloat16).view(torch.int16))
    truncated = (x.view(torch.int32) >> 16).to(torch.int16)
    assert torch.equal(rtz.view(torch.int16), truncated)


def test_fp32_to_bf16_keeps_nan():
    x = torch.tensor([float("nan"), 1.0])
    rne = torch.empty(2, dtype=torch.bfloat16)
    rtz = torch.empty(2, dtype=torch.bfloat16)
    _to_bf16_kernel[(1,)](x, rne, rtz, 2, BLOCK=2)
    assert rne[0].isnan() and rne[1] == 1.0


def test_builtins_are_patched_as_the_original_patches_them():
    """The faster `_patch_builtin` swaps the same attributes, with the same builtins, in the same order, as
    Triton's own, on a fresh package and on one already patched (a nested @triton.jit call: nothing more)."""
    from triton.runtime import interpreter

    fast = interpreter._patch_builtin
    assert fast.__wrapped__ is not fast and interpreter._patch_builtin is fast
    for pkg in (tl, tl.tensor, tl.math, tl.core.tensor_descriptor_base):
        swapped = []
        for patch in (fast.__wrapped__, fast):
            outer, nested = interpreter._LangPatchScope(), interpreter._LangPatchScope()
            patch(pkg, interpreter.interpreter_builder, outer)
            patch(pkg, interpreter.interpreter_builder, nested)
            swapped.append(([(name, original) for _, name, original in outer._changes], len(nested._changes)))
            outer.restore()
        assert swapped[0] == swapped[1] and swapped[0][1] == 0, pkg
        assert len(swapped[0][0]) > 5 and all(tl.core.is_builtin(getattr(pkg, n)) for n, _ in swapped[0][0])


# ---- the patches for speed compute what the originals compute -------------------------------------------
@triton.jit
def _row_total(x):
    return tl.sum(x, axis=0)


@triton.jit
def _nested_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    # Two calls of a helper of this module, and the combine functions of tl.sum and tl.max (another module's).
    x = tl.load(x_ptr + tl.arange(0, BLOCK))
    tl.store(out_ptr, _row_total(x) + _row_total(x * 2) + tl.max(x, axis=0))


def test_a_launch_patches_each_module_of_its_nested_calls_once(monkeypatch):
    """Triton patches the languages again on every nested call; the patched call does it once per module and
    launch (the kernel's, then this module's helper and triton.language.standard's combine functions), and
    again after a launch's end has restored them."""
    from triton.runtime import interpreter

    patched_for = []
    original = interpreter._patch_lang
    monkeypatch.setattr(interpreter, "_patch_lang", lambda fn: patched_for.append(fn.__module__) or original(fn))
    x = torch.arange(8, dtype=torch.float32)
    for launch in (1, 2):
        out = torch.empty(1, dtype=torch.float32)
        _nested_kernel[(2,)](x, out, BLOCK=8)
        assert out.item() == 28 + 56 + 7
        assert sorted(patched_for) == sorted([__name__, __name__, "triton.language.standard"] * launch)
        assert not interpreter_patches._PATCHED_SINCE_RESTORE  # the launch's end forgot them


def test_np_dtype_answers_as_the_original():
    from triton.runtime import interpreter

    fast = interpreter._get_np_dtype
    original = fast.__wrapped__
    scalars = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32, tl.int64, tl.uint64,
               tl.float16, tl.bfloat16, tl.float32, tl.float64, tl.float8e5, tl.float8e4nv]  # fmt: skip
    pointers = [tl.pointer_type(tl.float32), tl.pointer_type(tl.bfloat16)]
    blocks = [tl.block_type(t, [4, 2]) for t in scalars + pointers]
    for t in scalars + pointers + blocks + scalars:  # the scalars twice: the second answers are the kept ones
        assert fast(t) == original(t), t
    with pytest.raises(KeyError):
        fast(tl.void)


def test_a_reimplemented_body_that_changed_is_refused():
    def __call__(self, *args, **kwargs):  # the signature of InterpretedFunction.__call__, another body
        return None

    with pytest.raises(RuntimeError, match="source has sha256 .* re-check it against this Triton"):
        interpreter_patches._check_original(__call__, "InterpretedFunction.__call__", "InterpretedFunction.__call__")


@triton.jit
def _int32_products_kernel(a_ptr, b_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(a_ptr + offs) * tl.load(b_ptr + offs) + 1)


def test_the_overflow_check_is_off_only_where_its_assert_would_not_look(monkeypatch):
    """With debug off, sanitize_overflow's int64 check goes to a device_assert that returns without looking: a
    kernel whose int32 products overflow stores the same wrapped values, and raises nothing, with it on and off."""
    import dataclasses

    from triton.runtime import interpreter

    options = interpreter.interpreter_builder.options
    assert not options.sanitize_overflow and not options.debug
    a = torch.tensor([3, 65536, -70000, 2**31 - 1], dtype=torch.int32)
    b = torch.tensor([5, 65536, 70000, 2], dtype=torch.int32)
    outs = []
    for sanitize in (False, True):
        monkeypatch.setattr(
            interpreter.interpreter_builder, "options", dataclasses.replace(options, sanitize_overflow=sanitize)
        )
        out = torch.empty(4, dtype=torch.int32)
        _int32_products_kernel[(1,)](a, b, out, BLOCK=4)
        outs.append(out)
    wrapped = ((a.long() * b.long() + 1 + 2**31) % 2**32 - 2**31).int()
    assert torch.equal(outs[0], wrapped) and torch.equal(outs[1], wrapped)


@triton.jit
def _runtime_bound_sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n, BLOCK):  # a runtime bound: Python's range asks the scalar tensor for __index__
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr, tl.sum(acc))


class _OneDimensionalScalar(np.ndarray):
    """numpy 2.4's rule on any numpy: int() of an array with a dimension raises, even of one element."""

    def __int__(self):
        raise TypeError("only 0-dimensional arrays can be converted to Python scalars")


def test_a_loop_over_a_runtime_bound_runs_under_numpy_2_4s_scalar_rule(monkeypatch):
    """The interpreter keeps a scalar as a 1-element array, and Triton's tensor __index__ is int() of it, which
    numpy 2.4 and later refuse (TOOLCHAIN.md: loops over a runtime bound fail; the GPU machine has numpy 2.5).
    Here every 1-element array the interpreter wraps follows that rule: the patched __index__ (.item()) runs the
    loop, Triton's own raises, and after each launch tl.tensor has no __index__ again."""
    from triton.runtime import interpreter

    post_init = interpreter.TensorHandle.__post_init__

    def strict(handle):
        if isinstance(handle.data, np.ndarray) and handle.data.shape == (1,):
            handle.data = handle.data.view(_OneDimensionalScalar)
        post_init(handle)

    monkeypatch.setattr(interpreter.TensorHandle, "__post_init__", strict)
    x = torch.arange(37, dtype=torch.float32)
    out = torch.empty(1, dtype=torch.float32)
    _runtime_bound_sum_kernel[(1,)](x, out, 37, BLOCK=8)
    assert out.item() == 36 * 37 / 2
    assert not hasattr(tl.tensor, "__index__")
    monkeypatch.setattr(interpreter, "_patch_lang_tensor", interpreter._patch_lang_tensor.__wrapped__)
    with pytest.raises(interpreter.InterpreterError, match="only 0-dimensional arrays"):
        _runtime_bound_sum_kernel[(1,)](x, out, 37, BLOCK=8)
    assert not hasattr(tl.tensor, "__index__")
