"""Make the Triton 3.6.0 interpreter's `tl.dot` and FP32 -> BF16 casts compute what the GPU computes, run it under
numpy 2.4 and later, and run it faster.

Under TRITON_INTERPRET=1, `InterpreterBuilder.create_dot` hands the operands' numpy storage to
`np.matmul`. The interpreter stores BF16 as uint16 bit patterns, so a BF16 dot multiplies the
integers behind the bits and returns garbage; FP32 dots ignore `input_precision`, so a kernel that
forgets `input_precision="ieee"` looks exact on CPU while the GPU runs it in TF32 (10 mantissa
bits). `apply()` replaces `create_dot` with a version that:

  - decodes BF16 operands exactly (the bits shifted into the high half of an FP32 word),
    FP16 and FP8 operands through their own formats, and multiplies in FP32 (numpy's sgemm:
    FP32 products and FP32 accumulation, as the tensor cores' FP32 accumulator);
  - for FP32 operands with input_precision "tf32", rounds each operand to TF32 first
    (round to nearest, ties away from zero, as `cvt.rna.tf32.f32`; hardware that truncates
    instead differs in the last TF32 bit, still ~1e-3 relative error). "tf32x3" and "ieee"
    stay exact FP32. BF16 values upcast to FP32 are exact in TF32, so kernels that upcast BF16
    operands before an FP32 dot see no change;
  - leaves integer (int8) and FP64 dots as the interpreter computes them.

It also replaces the FP32 -> BF16 cast (`x.to(tl.bfloat16)`, default rounding): the interpreter
truncates, the GPU rounds to nearest even (cvt.rn.bf16.f32), so without the patch about half of a
kernel's BF16 outputs are 1 ulp off on CPU and its error against FP64 doubles. Explicit
`fp_downcast_rounding="rtz"` truncates, as on the GPU (the interpreter's own path mangles FP32
subnormals there; the patch truncates the bits directly).

It replaces a tensor's `__index__` during a launch (`_patch_lang_tensor`): Triton's is `int()` of the 1-element
array the interpreter keeps a scalar in, which numpy 2.4 and later refuse for an array with a dimension, so every
`range` over a runtime bound raised TypeError there (the GPU machine has numpy 2.5). `.item()` is the same int on
every numpy.

Four more changes are for speed alone; with each, a kernel computes and raises exactly what it did without:
  - `_patch_builtin`, which swaps `tl`'s builtins for interpreted ones and runs four times on every nested
    `@triton.jit` call, lists each package with `inspect.getmembers` each time. Listing its names once instead
    (`dir`, then the same values in the same order) took the optimized tiny model's CPU test from 95 to 83 s
    and a qk_norm_rope parity child from about 17 to 16 s (one run each, on a 2-core CPU machine).
  - A nested `@triton.jit` call (`InterpretedFunction.__call__`: a helper, or the combine function of every
    `tl.sum` and `tl.max`) patches the languages in its module's globals again each time, and never restores
    them. Within one launch nothing restores them either (only a launch's end does, `_LangPatchScope.restore`),
    so from the second such call on, the patch swaps closures for identical closures. It now runs once per
    module between two restores.
  - `_get_np_dtype` built its table of eighteen types on every call (one per tensor the interpreter makes);
    its answer for each scalar type is now kept (a block's is its element's).
  - `sanitize_overflow`, on in the interpreter's options, makes every integer add, subtract and multiply of fewer
    than 64 bits also compute itself in int64 and compare the result with the type's range, for a
    `device_assert` that returns without looking unless `debug` is on. The interpreter's options never turn it on
    (Triton 3.6.0 builds them once, with `debug=False`), so where `debug` is off the check is turned off too.
The last three, against the first alone (fifty-ninth session, this 2-core machine): a GEMV launch of 96 programs
(qkv_gate_gemm/flat_gemv at beam-tiny) 0.60 -> 0.34 s; the optimized tiny model of mapping 0 in the every-candidate
test, prefill and 12 decode steps on one core, 86 -> 43 s; that test alone on two cores 180 -> 117 s.

The patches change only the interpreter (its builder, `_patch_builtin`, `_get_np_dtype`, the nested call and the
patch scope's restore): compiled GPU kernels never use it, so `apply()` is harmless on the GPU machine. It is
idempotent, and checks that each function it replaces has the signature it was written against (and, where it
re-implements a body, that body's source), so that a Triton upgrade fails loudly instead of silently computing
something else.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import textwrap
from collections.abc import Callable

import numpy as np

# The methods replaced, with the parameters they had in triton 3.6.0.
_EXPECTED_PARAMS = {
    "create_dot": ("self", "a", "b", "d", "input_precision", "max_num_imprecise_acc"),
    "cast_impl": ("self", "src", "dst_type"),
    "create_fp_to_fp": ("self", "src", "dst_type", "rounding_mode"),
    "_patch_builtin": ("pkg", "builder", "scope"),
    "InterpretedFunction.__call__": ("self", "args", "kwargs"),
    "_LangPatchScope.restore": ("self",),
    "_get_np_dtype": ("tt_dtype",),
    "_patch_lang_tensor": ("tensor", "scope"),
}
_PATCH_MARKER = "_beam_interpreter_patch"


def _interpreter_module():
    # Imported lazily: importing triton's interpreter is cheap, but keep harness imports free of it.
    from triton.runtime import interpreter

    return interpreter


def _bf16_bits_to_fp32(bits: np.ndarray) -> np.ndarray:
    """BF16 is the high half of an FP32 word: shifting the bits back is an exact decode."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _fp32_to_bf16_bits(x32: np.ndarray) -> np.ndarray:
    """FP32 rounded to BF16 bits, to nearest even, as cvt.rn.bf16.f32 (overflow to inf, NaN stays NaN)."""
    bits = np.ascontiguousarray(x32, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    quiet_nan = (bits >> np.uint32(16)) | np.uint32(0x0040)
    return np.where(np.isnan(x32), quiet_nan, rounded).astype(np.uint16)


def _round_to_tf32(x32: np.ndarray) -> np.ndarray:
    """FP32 rounded to TF32's 10 mantissa bits (ties away from zero); inf and NaN unchanged."""
    bits = np.ascontiguousarray(x32, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
    return np.where(np.isfinite(x32), rounded.view(np.float32), x32)


def _operand_as_fp32(interpreter, handle, tf32: bool) -> np.ndarray:
    tl = interpreter.tl
    dtype = handle.dtype  # the element type: the interpreter keeps shapes in the numpy data
    data = handle.data
    if dtype == tl.bfloat16:
        return _bf16_bits_to_fp32(data)
    if dtype.is_floating() and dtype.primitive_bitwidth == 8:
        # FP8 formats: the interpreter's own decoder to FP16 is exact for every FP8 value.
        return interpreter._convert_float(data, dtype, tl.float16, None).view(np.float16).astype(np.float32)
    if dtype == tl.float16:
        return data.astype(np.float32)
    if dtype == tl.float32:
        return _round_to_tf32(data) if tf32 else data.astype(np.float32)
    raise TypeError(f"interpreter dot patch: unexpected floating operand dtype {dtype}")


def _make_create_dot(interpreter, original_create_dot):
    tl = interpreter.tl
    tf32_precision = interpreter._ir.INPUT_PRECISION.TF32

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        a_dtype, b_dtype = a.dtype, b.dtype
        if a_dtype.is_int() or b_dtype.is_int() or a_dtype == tl.float64 or b_dtype == tl.float64:
            return original_create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        tf32 = input_precision == tf32_precision
        a32 = _operand_as_fp32(interpreter, a, tf32)
        b32 = _operand_as_fp32(interpreter, b, tf32)
        # The accumulator is FP32, or FP16 for an FP16 dot with out_dtype=float16 (Triton refuses a
        # BF16 accumulator). An FP16 accumulator is summed in FP32 here and rounded once.
        out32 = np.matmul(a32, b32, dtype=np.float32) + d.data.astype(np.float32)
        return interpreter.TensorHandle(out32.astype(d.data.dtype), d.dtype)

    setattr(create_dot, _PATCH_MARKER, True)
    return create_dot


def _make_cast_impl(interpreter, original_cast_impl):
    tl = interpreter.tl

    def cast_impl(self, src, dst_type):
        if src.dtype == tl.float32 and dst_type.scalar == tl.bfloat16:
            return interpreter.TensorHandle(_fp32_to_bf16_bits(src.data), tl.bfloat16)
        return original_cast_impl(self, src, dst_type)

    setattr(cast_impl, _PATCH_MARKER, True)
    return cast_impl


def _make_fp_to_fp(interpreter, original_fp_to_fp):
    tl = interpreter.tl
    rtz = interpreter._ir.ROUNDING_MODE.RTZ

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if src.dtype == tl.float32 and dst_type.scalar == tl.bfloat16:
            if rounding_mode == rtz:  # the interpreter's own decoder mangles FP32 subnormals here
                bits = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32)
                return interpreter.TensorHandle((bits >> np.uint32(16)).astype(np.uint16), tl.bfloat16)
            return interpreter.TensorHandle(_fp32_to_bf16_bits(src.data), tl.bfloat16)
        return original_fp_to_fp(self, src, dst_type, rounding_mode)

    setattr(create_fp_to_fp, _PATCH_MARKER, True)
    return create_fp_to_fp


_FACTORIES = {"create_dot": _make_create_dot, "cast_impl": _make_cast_impl, "create_fp_to_fp": _make_fp_to_fp}


def _make_patch_builtin(interpreter, original_patch_builtin):
    """`_patch_builtin` as Triton 3.6.0 runs it, without `inspect.getmembers` (see the module docstring). The
    attribute names come from `dir` once per package; each call then does what getmembers did: every name's
    value, in dir's (sorted) order, patched where it is a builtin."""
    is_builtin, patch_attr = interpreter.tl.core.is_builtin, interpreter._patch_attr
    names: dict[int, tuple[object, list[str]]] = {}  # id(pkg) -> (pkg, dir(pkg)): modules and classes live on

    def _patch_builtin(pkg, builder, scope):
        known = names.get(id(pkg))
        if known is None or known[0] is not pkg:
            known = names[id(pkg)] = (pkg, dir(pkg))
        for name in known[1]:
            member = getattr(pkg, name, None)
            if is_builtin(member):
                patch_attr(pkg, name, member, builder, scope)

    _patch_builtin.__wrapped__ = original_patch_builtin
    setattr(_patch_builtin, _PATCH_MARKER, True)
    return _patch_builtin


# ids of the module globals whose languages a nested `@triton.jit` call has patched since a patch scope last restored
# anything. Only `_LangPatchScope.restore` (a launch's end) ever puts an original back; until it runs, a module's
# languages patched once stay patched (and its globals, which the launch's kernels use, stay alive).
_PATCHED_SINCE_RESTORE: set[int] = set()


def _make_nested_call(interpreter, original_call):
    """`InterpretedFunction.__call__` (a device function called from a kernel), patching the languages of its
    module only where nothing has restored them since it last did (see the module docstring)."""

    def __call__(self, *args, **kwargs):
        if id(self.fn.__globals__) not in _PATCHED_SINCE_RESTORE:
            interpreter._patch_lang(self.fn)
            _PATCHED_SINCE_RESTORE.add(id(self.fn.__globals__))
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    __call__.__wrapped__ = original_call
    setattr(__call__, _PATCH_MARKER, True)
    return __call__


def _make_scope_restore(interpreter, original_restore):
    """`_LangPatchScope.restore`, which also forgets which modules nested calls have patched."""

    def restore(self):
        _PATCHED_SINCE_RESTORE.clear()
        original_restore(self)

    restore.__wrapped__ = original_restore
    setattr(restore, _PATCH_MARKER, True)
    return restore


def _make_np_dtype(interpreter, original_np_dtype):
    """`_get_np_dtype`, its answers for scalar types kept. A block's numpy type is its element's (a block of
    pointers too: uint64, as a pointer's); pointer types, unhashable, go to the original, which answers them
    before building its table."""
    tl = interpreter.tl
    known: dict[object, object] = {}

    def _get_np_dtype(tt_dtype):
        scalar = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if isinstance(scalar, tl.pointer_type):
            return original_np_dtype(scalar)
        found = known.get(scalar)
        if found is None:
            found = known[scalar] = original_np_dtype(scalar)
        return found

    _get_np_dtype.__wrapped__ = original_np_dtype
    setattr(_get_np_dtype, _PATCH_MARKER, True)
    return _get_np_dtype


def _make_patch_lang_tensor(interpreter, original_patch_lang_tensor):
    """`_patch_lang_tensor`, then a tensor `__index__` that numpy 2.4 and later allow (the module docstring). The
    scope records it like Triton's own attributes, and a launch's end restores the original."""

    def _patch_lang_tensor(tensor, scope):
        original_patch_lang_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", _scalar_index)

    _patch_lang_tensor.__wrapped__ = original_patch_lang_tensor
    setattr(_patch_lang_tensor, _PATCH_MARKER, True)
    return _patch_lang_tensor


def _scalar_index(tensor) -> int:
    return int(tensor.handle.data.item())


# Replacements that re-implement a body rather than wrap it: the sha256 of the original's dedented source (triton
# 3.6.0), so that a Triton whose body changed fails loudly even where the signature did not.
_EXPECTED_SOURCE_SHA256 = {
    "InterpretedFunction.__call__": "c4349b1c6ee998f5767de0e74abd15cdcd8eef1163ce64f0f9c9bd10bc9f8659",
}


def _replacements(interpreter) -> list[tuple[object, str, str, Callable]]:
    """(owner, attribute, name in _EXPECTED_PARAMS, factory) of every replacement."""
    builder = interpreter.InterpreterBuilder
    return [
        *((builder, name, name, factory) for name, factory in _FACTORIES.items()),
        (interpreter, "_patch_builtin", "_patch_builtin", _make_patch_builtin),
        (interpreter.InterpretedFunction, "__call__", "InterpretedFunction.__call__", _make_nested_call),
        (interpreter._LangPatchScope, "restore", "_LangPatchScope.restore", _make_scope_restore),
        (interpreter, "_get_np_dtype", "_get_np_dtype", _make_np_dtype),
        (interpreter, "_patch_lang_tensor", "_patch_lang_tensor", _make_patch_lang_tensor),
    ]


def is_applied() -> bool:
    """Whether every patch is in place (for records and test preconditions)."""
    interpreter = _interpreter_module()
    replacements = _replacements(interpreter)
    replaced = all(getattr(getattr(owner, attr), _PATCH_MARKER, False) for owner, attr, _, _ in replacements)
    options = interpreter.interpreter_builder.options
    return replaced and not (options.sanitize_overflow and not options.debug)


def _check_original(current, name: str, where: str) -> None:
    params = tuple(inspect.signature(current).parameters)
    if params != _EXPECTED_PARAMS[name]:
        raise RuntimeError(
            f"{where} has parameters {params}; the patch was written for {_EXPECTED_PARAMS[name]} (triton 3.6.0): "
            "re-check it against this Triton"
        )
    if name in _EXPECTED_SOURCE_SHA256:
        found = hashlib.sha256(textwrap.dedent(inspect.getsource(current)).encode()).hexdigest()
        if found != _EXPECTED_SOURCE_SHA256[name]:
            raise RuntimeError(
                f"{where}'s source has sha256 {found}; the patch re-implements the body with sha256 "
                f"{_EXPECTED_SOURCE_SHA256[name]} (triton 3.6.0): re-check it against this Triton"
            )


def apply() -> None:
    """Patch the Triton interpreter's dot and FP32 -> BF16 cast, and the parts of it made faster (idempotent; inert
    for compiled GPU kernels)."""
    interpreter = _interpreter_module()
    for owner, attr, name, factory in _replacements(interpreter):
        current = getattr(owner, attr)
        if getattr(current, _PATCH_MARKER, False):
            continue
        where = f"{owner.__qualname__}.{attr}" if isinstance(owner, type) else attr
        _check_original(current, name, f"triton.runtime.interpreter.{where}")
        setattr(owner, attr, factory(interpreter, current))
    options = interpreter.interpreter_builder.options
    if options.sanitize_overflow and not options.debug:
        # The overflow check's only consumer, device_assert, returns at once without debug (see the module docstring).
        interpreter.interpreter_builder.options = dataclasses.replace(options, sanitize_overflow=False)
