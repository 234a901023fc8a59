# AOT ID: ['0_inference']
from ctypes import c_void_p, c_long, c_int
import torch
import math
import random
import os
import tempfile
from math import inf, nan
from cmath import nanj
from torch._inductor.hooks import run_intermediate_hooks
from torch._inductor.utils import maybe_profile
from torch._inductor.codegen.memory_planning import _align as align
from torch import device, empty_strided
from torch._inductor.async_compile import AsyncCompile
from torch._inductor.select_algorithm import extern_kernels
import triton
import triton.language as tl
from torch._inductor.runtime.triton_heuristics import start_graph, end_graph
from torch._C import _cuda_getCurrentRawStream as get_raw_stream

aten = torch.ops.aten
inductor_ops = torch.ops.inductor
_quantized = torch.ops._quantized
assert_size_stride = torch._C._dynamo.guards.assert_size_stride
assert_alignment = torch._C._dynamo.guards.assert_alignment
empty_strided_cpu = torch._C._dynamo.guards._empty_strided_cpu
empty_strided_cpu_pinned = torch._C._dynamo.guards._empty_strided_cpu_pinned
empty_strided_cuda = torch._C._dynamo.guards._empty_strided_cuda
empty_strided_xpu = torch._C._dynamo.guards._empty_strided_xpu
empty_strided_mtia = torch._C._dynamo.guards._empty_strided_mtia
reinterpret_tensor = torch._C._dynamo.guards._reinterpret_tensor
alloc_from_pool = torch.ops.inductor._alloc_from_pool
async_compile = AsyncCompile()
empty_strided_p2p = torch._C._distributed_c10d._SymmetricMemory.empty_strided_p2p


# kernel path: /tmp/torchinductor_root/ya/cya6hpexkm2etc6df7pruom5ha2eshtbcszxgp34jxspuobsczb6.py
# Topologically Sorted Source Nodes: [float_1, pow_1, mean], Original ATen: [aten._to_copy, aten.pow, aten.mean]
# Source node to ATen node mapping:
#   float_1 => convert_element_type
#   mean => mean
#   pow_1 => pow_1
# Graph fragment:
#   %arg1_1 : Tensor "bf16[16384, 48, 128][6144, 128, 1]cuda:0" = PlaceHolder[target=arg1_1]
#   %convert_element_type : Tensor "f32[16384, 48, 128][6144, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%arg1_1, torch.float32), kwargs = {})
#   %pow_1 : Tensor "f32[16384, 48, 128][6144, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type, 2), kwargs = {})
#   %mean : Tensor "f32[16384, 48, 1][48, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mean.dim](args = (%pow_1, [-1], True), kwargs = {})
#   return %buf0
triton_per_fused__to_copy_mean_pow_0 = async_compile.triton('triton_per_fused__to_copy_mean_pow_0', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.persistent_reduction(
    size_hints={'x': 1048576, 'r0_': 128},
    reduction_hint=ReductionHint.INNER,
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*bf16', 'out_ptr0': '*fp32', 'xnumel': 'i32', 'r0_numel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': False, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_per_fused__to_copy_mean_pow_0', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': None, 'atomic_add_found': False, 'num_load': 1, 'num_store': 1, 'num_reduction': 1, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': False, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 6291456, 'r0_': 201326592}}
)
@triton.jit
def triton_per_fused__to_copy_mean_pow_0(in_ptr0, out_ptr0, xnumel, r0_numel, XBLOCK : tl.constexpr):
    xnumel = 786432
    r0_numel = 128
    R0_BLOCK: tl.constexpr = 128
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = tl.full([XBLOCK], True, tl.int1)[:, None]
    r0_index = tl.arange(0, R0_BLOCK)[None, :]
    r0_offset = 0
    r0_mask = tl.full([R0_BLOCK], True, tl.int1)[None, :]
    roffset = r0_offset
    rindex = r0_index
    r0_1 = r0_index
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + (r0_1 + 128*x0), None).to(tl.float32)
    tmp1 = tmp0.to(tl.bfloat16)
    tmp2 = tmp1.to(tl.float32)
    tmp3 = tmp2.to(tl.float32)
    tmp4 = tmp3 * tmp3
    tmp5 = tl.broadcast_to(tmp4, [XBLOCK, R0_BLOCK])
    tmp7 = tl.sum(tmp5, 1)[:, None].to(tl.float32)
    tl.store(out_ptr0 + (x0), tmp7, None)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/5l/c5lukscezx7i32fjbif75fxoaduxlcgqevv7zvwuafzlafez5bl6.py
# Topologically Sorted Source Nodes: [float_1, pow_1, mean, add, inv_rms, mul, float_2, mul_1, x1, cos_sin_TD, cos, mul_4, x2, sin, mul_5, sub, mul_6, mul_7, add_2], Original ATen: [aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.mul, aten.slice, aten.index, aten.unsqueeze, aten.sub]
# Source node to ATen node mapping:
#   add => add
#   add_2 => add_2
#   cos => slice_1, unsqueeze
#   cos_sin_TD => index
#   float_1 => convert_element_type
#   float_2 => convert_element_type_1
#   inv_rms => rsqrt
#   mean => mean
#   mul => mul
#   mul_1 => mul_1
#   mul_4 => mul_4
#   mul_5 => mul_5
#   mul_6 => mul_6
#   mul_7 => mul_7
#   pow_1 => pow_1
#   sin => slice_2, unsqueeze_1
#   sub => sub
#   x1 => slice_3
#   x2 => slice_4
# Graph fragment:
#   %arg1_1 : Tensor "bf16[16384, 48, 128][6144, 128, 1]cuda:0" = PlaceHolder[target=arg1_1]
#   %buf0 : Tensor "f32[16384, 48, 1][48, 1, 786432]cuda:0" = PlaceHolder[target=buf0]
#   %arg2_1 : Tensor "bf16[128][1]cuda:0" = PlaceHolder[target=arg2_1]
#   %arg5_1 : Tensor "i64[16384][1]cuda:0" = PlaceHolder[target=arg5_1]
#   %arg0_1 : Tensor "f32[131072, 128][128, 1]cuda:0" = PlaceHolder[target=arg0_1]
#   %convert_element_type : Tensor "f32[16384, 48, 128][6144, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%arg1_1, torch.float32), kwargs = {})
#   %pow_1 : Tensor "f32[16384, 48, 128][6144, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type, 2), kwargs = {})
#   %mean : Tensor "f32[16384, 48, 1][48, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mean.dim](args = (%pow_1, [-1], True), kwargs = {})
#   %add : Tensor "f32[16384, 48, 1][48, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mean, 1e-06), kwargs = {})
#   %rsqrt : Tensor "f32[16384, 48, 1][48, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.rsqrt.default](args = (%add,), kwargs = {})
#   %mul : Tensor "f32[16384, 48, 128][6144, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type, %rsqrt), kwargs = {})
#   %convert_element_type_1 : Tensor "f32[128][1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%arg2_1, torch.float32), kwargs = {})
#   %mul_1 : Tensor "f32[16384, 48, 128][6144, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.mul.Tensor](args = (%mul, %convert_element_type_1), kwargs = {})
#   %slice_3 : Tensor "f32[16384, 48, 64][6144, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.slice.Tensor](args = (%mul_1, 2, 0, 64), kwargs = {})
#   %index : Tensor "f32[16384, 128][128, 1]cuda:0"[num_users=4] = call_function[target=torch.ops.aten.index.Tensor](args = (%arg0_1, [%arg5_1]), kwargs = {})
#   %unsqueeze : Tensor "f32[16384, 1, 128][128, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%index, 1), kwargs = {})
#   %slice_1 : Tensor "f32[16384, 1, 64][128, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.slice.Tensor](args = (%unsqueeze, 2, 0, 64), kwargs = {})
#   %mul_4 : Tensor "f32[16384, 48, 64][3072, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%slice_3, %slice_1), kwargs = {})
#   %slice_4 : Tensor "f32[16384, 48, 64][6144, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.slice.Tensor](args = (%mul_1, 2, 64, 9223372036854775807), kwargs = {})
#   %unsqueeze_1 : Tensor "f32[16384, 1, 128][128, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%index, 1), kwargs = {})
#   %slice_2 : Tensor "f32[16384, 1, 64][128, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.slice.Tensor](args = (%unsqueeze_1, 2, 64, 9223372036854775807), kwargs = {})
#   %mul_5 : Tensor "f32[16384, 48, 64][3072, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%slice_4, %slice_2), kwargs = {})
#   %sub : Tensor "f32[16384, 48, 64][3072, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sub.Tensor](args = (%mul_4, %mul_5), kwargs = {})
#   %mul_6 : Tensor "f32[16384, 48, 64][3072, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%slice_4, %slice_1), kwargs = {})
#   %mul_7 : Tensor "f32[16384, 48, 64][3072, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%slice_3, %slice_2), kwargs = {})
#   %add_2 : Tensor "f32[16384, 48, 64][3072, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mul_6, %mul_7), kwargs = {})
#   return %sub,%add_2
triton_poi_fused__to_copy_add_index_mean_mul_pow_rsqrt_slice_sub_unsqueeze_1 = async_compile.triton('triton_poi_fused__to_copy_add_index_mean_mul_pow_rsqrt_slice_sub_unsqueeze_1', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'x': 67108864}, 
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*bf16', 'in_ptr1': '*fp32', 'in_ptr2': '*bf16', 'in_ptr3': '*i64', 'in_ptr4': '*fp32', 'out_ptr0': '*fp32', 'out_ptr1': '*fp32', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': False, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (5,): [['tt.divisibility', 16]], (6,): [['tt.divisibility', 16]], (7,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_poi_fused__to_copy_add_index_mean_mul_pow_rsqrt_slice_sub_unsqueeze_1', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 6, 'num_store': 2, 'num_reduction': 0, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': False, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 1006633216}},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused__to_copy_add_index_mean_mul_pow_rsqrt_slice_sub_unsqueeze_1(in_ptr0, in_ptr1, in_ptr2, in_ptr3, in_ptr4, out_ptr0, out_ptr1, xnumel, XBLOCK : tl.constexpr):
    xnumel = 50331648
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = tl.full([XBLOCK], True, tl.int1)[:]
    x0 = (xindex % 64)
    x3 = xindex // 64
    x2 = xindex // 3072
    tmp0 = tl.load(in_ptr0 + (x0 + 128*x3), None).to(tl.float32)
    tmp4 = tl.load(in_ptr1 + (x3), None, eviction_policy='evict_last')
    tmp11 = tl.load(in_ptr2 + (x0), None, eviction_policy='evict_last').to(tl.float32)
    tmp16 = tl.load(in_ptr3 + (x2), None, eviction_policy='evict_last')
    tmp24 = tl.load(in_ptr0 + (64 + x0 + 128*x3), None).to(tl.float32)
    tmp29 = tl.load(in_ptr2 + (64 + x0), None, eviction_policy='evict_last').to(tl.float32)
    tmp1 = tmp0.to(tl.bfloat16)
    tmp2 = tmp1.to(tl.float32)
    tmp3 = tmp2.to(tl.float32)
    tmp5 = tl.full([1], 128.0, tl.float32)
    tmp6 = (tmp4 / tmp5)
    tmp7 = tl.full([1], 1e-06, tl.float32)
    tmp8 = tmp6 + tmp7
    tmp9 = libdevice.rsqrt(tmp8)
    tmp10 = tmp3 * tmp9
    tmp12 = tmp11.to(tl.bfloat16)
    tmp13 = tmp12.to(tl.float32)
    tmp14 = tmp13.to(tl.float32)
    tmp15 = tmp10 * tmp14
    tmp17 = tl.full([XBLOCK], 131072, tl.int32)
    tmp18 = tmp16 + tmp17
    tmp19 = tmp16 < 0
    tmp20 = tl.where(tmp19, tmp18, tmp16)
    tl.device_assert((0 <= tmp20) & (tmp20 < 131072), "index out of bounds: 0 <= tmp20 < 131072")
    tmp22 = tl.load(in_ptr4 + (x0 + 128*tmp20), None)
    tmp23 = tmp15 * tmp22
    tmp25 = tmp24.to(tl.bfloat16)
    tmp26 = tmp25.to(tl.float32)
    tmp27 = tmp26.to(tl.float32)
    tmp28 = tmp27 * tmp9
    tmp30 = tmp29.to(tl.bfloat16)
    tmp31 = tmp30.to(tl.float32)
    tmp32 = tmp31.to(tl.float32)
    tmp33 = tmp28 * tmp32
    tmp34 = tl.load(in_ptr4 + (64 + x0 + 128*tmp20), None)
    tmp35 = tmp33 * tmp34
    tmp36 = tmp23 - tmp35
    tmp37 = tmp33 * tmp22
    tmp38 = tmp15 * tmp34
    tmp39 = tmp37 + tmp38
    tl.store(out_ptr0 + (x0 + 128*x3), tmp36, None)
    tl.store(out_ptr1 + (x0 + 128*x3), tmp39, None)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/si/csi3fyduyxsyhzbhs4tqxezfp6bgj72c3ciz6turmpdaoq6uyh5x.py
# Topologically Sorted Source Nodes: [q_out], Original ATen: [aten._to_copy]
# Source node to ATen node mapping:
#   q_out => convert_element_type_7
# Graph fragment:
#   %cat : Tensor "f32[16384, 48, 128][6144, 128, 1]cuda:0" = PlaceHolder[target=cat]
#   %convert_element_type_7 : Tensor "bf16[16384, 48, 128][6144, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%cat, torch.bfloat16), kwargs = {})
#   return %convert_element_type_7
triton_poi_fused__to_copy_2 = async_compile.triton('triton_poi_fused__to_copy_2', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'x': 134217728}, 
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*fp32', 'out_ptr0': '*bf16', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': False, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_poi_fused__to_copy_2', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 1, 'num_store': 1, 'num_reduction': 0, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': False, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 805306368}},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused__to_copy_2(in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xnumel = 100663296
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = tl.full([XBLOCK], True, tl.int1)[:]
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + (x0), None)
    tmp1 = tmp0.to(tl.float32)
    tmp2 = tmp1.to(tl.bfloat16)
    tmp3 = tmp2.to(tl.float32)
    tl.store(out_ptr0 + (x0), tmp3, None)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/vd/cvdirlb7jg2wybun7zxgpuorikrj4a5v2ywcygi563gfdw2awhmm.py
# Topologically Sorted Source Nodes: [float_3, pow_2, mean_1], Original ATen: [aten._to_copy, aten.pow, aten.mean]
# Source node to ATen node mapping:
#   float_3 => convert_element_type_3
#   mean_1 => mean_1
#   pow_2 => pow_2
# Graph fragment:
#   %arg3_1 : Tensor "bf16[16384, 8, 128][1024, 128, 1]cuda:0" = PlaceHolder[target=arg3_1]
#   %convert_element_type_3 : Tensor "f32[16384, 8, 128][1024, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%arg3_1, torch.float32), kwargs = {})
#   %pow_2 : Tensor "f32[16384, 8, 128][1024, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type_3, 2), kwargs = {})
#   %mean_1 : Tensor "f32[16384, 8, 1][8, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mean.dim](args = (%pow_2, [-1], True), kwargs = {})
#   return %buf5
triton_per_fused__to_copy_mean_pow_3 = async_compile.triton('triton_per_fused__to_copy_mean_pow_3', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.persistent_reduction(
    size_hints={'x': 131072, 'r0_': 128},
    reduction_hint=ReductionHint.INNER,
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*bf16', 'out_ptr0': '*fp32', 'xnumel': 'i32', 'r0_numel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': False, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_per_fused__to_copy_mean_pow_3', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': None, 'atomic_add_found': False, 'num_load': 1, 'num_store': 1, 'num_reduction': 1, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': False, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 1048576, 'r0_': 33554432}}
)
@triton.jit
def triton_per_fused__to_copy_mean_pow_3(in_ptr0, out_ptr0, xnumel, r0_numel, XBLOCK : tl.constexpr):
    xnumel = 131072
    r0_numel = 128
    R0_BLOCK: tl.constexpr = 128
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:, None]
    xmask = tl.full([XBLOCK], True, tl.int1)[:, None]
    r0_index = tl.arange(0, R0_BLOCK)[None, :]
    r0_offset = 0
    r0_mask = tl.full([R0_BLOCK], True, tl.int1)[None, :]
    roffset = r0_offset
    rindex = r0_index
    r0_1 = r0_index
    x0 = xindex
    tmp0 = tl.load(in_ptr0 + (r0_1 + 128*x0), None).to(tl.float32)
    tmp1 = tmp0.to(tl.bfloat16)
    tmp2 = tmp1.to(tl.float32)
    tmp3 = tmp2.to(tl.float32)
    tmp4 = tmp3 * tmp3
    tmp5 = tl.broadcast_to(tmp4, [XBLOCK, R0_BLOCK])
    tmp7 = tl.sum(tmp5, 1)[:, None].to(tl.float32)
    tl.store(out_ptr0 + (x0), tmp7, None)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/4a/c4abcnweej7ze7jnssifnfzjueh62cdog47rokse7d4vs5txocq3.py
# Topologically Sorted Source Nodes: [cos_sin_TD, float_3, pow_2, mean_1, add_1, inv_rms_1, mul_2, float_4, mul_3, x1_1, cos_1, mul_8, x2_1, sin_1, mul_9, sub_1, mul_10, mul_11, add_3], Original ATen: [aten.index, aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.mul, aten.slice, aten.unsqueeze, aten.sub]
# Source node to ATen node mapping:
#   add_1 => add_1
#   add_3 => add_3
#   cos_1 => slice_5, unsqueeze_2
#   cos_sin_TD => index
#   float_3 => convert_element_type_3
#   float_4 => convert_element_type_4
#   inv_rms_1 => rsqrt_1
#   mean_1 => mean_1
#   mul_10 => mul_10
#   mul_11 => mul_11
#   mul_2 => mul_2
#   mul_3 => mul_3
#   mul_8 => mul_8
#   mul_9 => mul_9
#   pow_2 => pow_2
#   sin_1 => slice_6, unsqueeze_3
#   sub_1 => sub_1
#   x1_1 => slice_7
#   x2_1 => slice_8
# Graph fragment:
#   %arg3_1 : Tensor "bf16[16384, 8, 128][1024, 128, 1]cuda:0" = PlaceHolder[target=arg3_1]
#   %buf5 : Tensor "f32[16384, 8, 1][8, 1, 131072]cuda:0" = PlaceHolder[target=buf5]
#   %arg4_1 : Tensor "bf16[128][1]cuda:0" = PlaceHolder[target=arg4_1]
#   %arg5_1 : Tensor "i64[16384][1]cuda:0" = PlaceHolder[target=arg5_1]
#   %arg0_1 : Tensor "f32[131072, 128][128, 1]cuda:0" = PlaceHolder[target=arg0_1]
#   %index : Tensor "f32[16384, 128][128, 1]cuda:0"[num_users=4] = call_function[target=torch.ops.aten.index.Tensor](args = (%arg0_1, [%arg5_1]), kwargs = {})
#   %convert_element_type_3 : Tensor "f32[16384, 8, 128][1024, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%arg3_1, torch.float32), kwargs = {})
#   %pow_2 : Tensor "f32[16384, 8, 128][1024, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.pow.Tensor_Scalar](args = (%convert_element_type_3, 2), kwargs = {})
#   %mean_1 : Tensor "f32[16384, 8, 1][8, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mean.dim](args = (%pow_2, [-1], True), kwargs = {})
#   %add_1 : Tensor "f32[16384, 8, 1][8, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mean_1, 1e-06), kwargs = {})
#   %rsqrt_1 : Tensor "f32[16384, 8, 1][8, 1, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.rsqrt.default](args = (%add_1,), kwargs = {})
#   %mul_2 : Tensor "f32[16384, 8, 128][1024, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%convert_element_type_3, %rsqrt_1), kwargs = {})
#   %convert_element_type_4 : Tensor "f32[128][1]cuda:0"[num_users=1] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%arg4_1, torch.float32), kwargs = {})
#   %mul_3 : Tensor "f32[16384, 8, 128][1024, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.mul.Tensor](args = (%mul_2, %convert_element_type_4), kwargs = {})
#   %slice_7 : Tensor "f32[16384, 8, 64][1024, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.slice.Tensor](args = (%mul_3, 2, 0, 64), kwargs = {})
#   %unsqueeze_2 : Tensor "f32[16384, 1, 128][128, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%index, 1), kwargs = {})
#   %slice_5 : Tensor "f32[16384, 1, 64][128, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.slice.Tensor](args = (%unsqueeze_2, 2, 0, 64), kwargs = {})
#   %mul_8 : Tensor "f32[16384, 8, 64][512, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%slice_7, %slice_5), kwargs = {})
#   %slice_8 : Tensor "f32[16384, 8, 64][1024, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.slice.Tensor](args = (%mul_3, 2, 64, 9223372036854775807), kwargs = {})
#   %unsqueeze_3 : Tensor "f32[16384, 1, 128][128, 128, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.unsqueeze.default](args = (%index, 1), kwargs = {})
#   %slice_6 : Tensor "f32[16384, 1, 64][128, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.aten.slice.Tensor](args = (%unsqueeze_3, 2, 64, 9223372036854775807), kwargs = {})
#   %mul_9 : Tensor "f32[16384, 8, 64][512, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%slice_8, %slice_6), kwargs = {})
#   %sub_1 : Tensor "f32[16384, 8, 64][512, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.sub.Tensor](args = (%mul_8, %mul_9), kwargs = {})
#   %mul_10 : Tensor "f32[16384, 8, 64][512, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%slice_8, %slice_5), kwargs = {})
#   %mul_11 : Tensor "f32[16384, 8, 64][512, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%slice_7, %slice_6), kwargs = {})
#   %add_3 : Tensor "f32[16384, 8, 64][512, 64, 1]cuda:0"[num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%mul_10, %mul_11), kwargs = {})
#   return %sub_1,%add_3
triton_poi_fused__to_copy_add_index_mean_mul_pow_rsqrt_slice_sub_unsqueeze_4 = async_compile.triton('triton_poi_fused__to_copy_add_index_mean_mul_pow_rsqrt_slice_sub_unsqueeze_4', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'x': 8388608}, 
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*bf16', 'in_ptr1': '*fp32', 'in_ptr2': '*bf16', 'in_ptr3': '*i64', 'in_ptr4': '*fp32', 'out_ptr0': '*fp32', 'out_ptr1': '*fp32', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': False, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (5,): [['tt.divisibility', 16]], (6,): [['tt.divisibility', 16]], (7,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_poi_fused__to_copy_add_index_mean_mul_pow_rsqrt_slice_sub_unsqueeze_4', 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 6, 'num_store': 2, 'num_reduction': 0, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': False, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 167772416}},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused__to_copy_add_index_mean_mul_pow_rsqrt_slice_sub_unsqueeze_4(in_ptr0, in_ptr1, in_ptr2, in_ptr3, in_ptr4, out_ptr0, out_ptr1, xnumel, XBLOCK : tl.constexpr):
    xnumel = 8388608
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = tl.full([XBLOCK], True, tl.int1)[:]
    x0 = (xindex % 64)
    x3 = xindex // 64
    x2 = xindex // 512
    tmp0 = tl.load(in_ptr0 + (x0 + 128*x3), None).to(tl.float32)
    tmp4 = tl.load(in_ptr1 + (x3), None, eviction_policy='evict_last')
    tmp11 = tl.load(in_ptr2 + (x0), None, eviction_policy='evict_last').to(tl.float32)
    tmp16 = tl.load(in_ptr3 + (x2), None, eviction_policy='evict_last')
    tmp24 = tl.load(in_ptr0 + (64 + x0 + 128*x3), None).to(tl.float32)
    tmp29 = tl.load(in_ptr2 + (64 + x0), None, eviction_policy='evict_last').to(tl.float32)
    tmp1 = tmp0.to(tl.bfloat16)
    tmp2 = tmp1.to(tl.float32)
    tmp3 = tmp2.to(tl.float32)
    tmp5 = tl.full([1], 128.0, tl.float32)
    tmp6 = (tmp4 / tmp5)
    tmp7 = tl.full([1], 1e-06, tl.float32)
    tmp8 = tmp6 + tmp7
    tmp9 = libdevice.rsqrt(tmp8)
    tmp10 = tmp3 * tmp9
    tmp12 = tmp11.to(tl.bfloat16)
    tmp13 = tmp12.to(tl.float32)
    tmp14 = tmp13.to(tl.float32)
    tmp15 = tmp10 * tmp14
    tmp17 = tl.full([XBLOCK], 131072, tl.int32)
    tmp18 = tmp16 + tmp17
    tmp19 = tmp16 < 0
    tmp20 = tl.where(tmp19, tmp18, tmp16)
    tl.device_assert((0 <= tmp20) & (tmp20 < 131072), "index out of bounds: 0 <= tmp20 < 131072")
    tmp22 = tl.load(in_ptr4 + (x0 + 128*tmp20), None)
    tmp23 = tmp15 * tmp22
    tmp25 = tmp24.to(tl.bfloat16)
    tmp26 = tmp25.to(tl.float32)
    tmp27 = tmp26.to(tl.float32)
    tmp28 = tmp27 * tmp9
    tmp30 = tmp29.to(tl.bfloat16)
    tmp31 = tmp30.to(tl.float32)
    tmp32 = tmp31.to(tl.float32)
    tmp33 = tmp28 * tmp32
    tmp34 = tl.load(in_ptr4 + (64 + x0 + 128*tmp20), None)
    tmp35 = tmp33 * tmp34
    tmp36 = tmp23 - tmp35
    tmp37 = tmp33 * tmp22
    tmp38 = tmp15 * tmp34
    tmp39 = tmp37 + tmp38
    tl.store(out_ptr0 + (x0 + 128*x3), tmp36, None)
    tl.store(out_ptr1 + (x0 + 128*x3), tmp39, None)
''', device_str='cuda')


# kernel path: /tmp/torchinductor_root/47/c47yaszx7xlz7rp3afmubtsvoll3o3ezhm3h3hc3jrzjjtw4izgy.py
# Topologically Sorted Source Nodes: [k_out, setitem, setitem_1], Original ATen: [aten._to_copy, aten.index_put]
# Source node to ATen node mapping:
#   k_out => convert_element_type_9
#   setitem => index_put
#   setitem_1 => index_put_1
# Graph fragment:
#   %cat_1 : Tensor "f32[16384, 8, 128][1024, 128, 1]cuda:0" = PlaceHolder[target=cat_1]
#   %arg7_1 : Tensor "i64[16384][1]cuda:0" = PlaceHolder[target=arg7_1]
#   %convert_element_type_9 : Tensor "bf16[16384, 8, 128][1024, 128, 1]cuda:0" = PlaceHolder[target=convert_element_type_9]
#   %index_put : Tensor "bf16[16385, 8, 128][1024, 128, 1]cuda:0" = PlaceHolder[target=index_put]
#   %arg9_1 : Tensor "bf16[16384, 8, 128][1024, 128, 1]cuda:0" = PlaceHolder[target=arg9_1]
#   %index_put_1 : Tensor "bf16[16385, 8, 128][1024, 128, 1]cuda:0" = PlaceHolder[target=index_put_1]
#   %convert_element_type_9 : Tensor "bf16[16384, 8, 128][1024, 128, 1]cuda:0"[num_users=2] = call_function[target=torch.ops.prims.convert_element_type.default](args = (%cat_1, torch.bfloat16), kwargs = {})
#   %index_put : Tensor "bf16[16385, 8, 128][1024, 128, 1]cuda:0"[num_users=0] = call_function[target=torch.ops.aten.index_put_.default](args = (%arg6_1, [%arg7_1], %convert_element_type_9), kwargs = {})
#   %index_put_1 : Tensor "bf16[16385, 8, 128][1024, 128, 1]cuda:0"[num_users=0] = call_function[target=torch.ops.aten.index_put_.default](args = (%arg8_1, [%arg7_1], %arg9_1), kwargs = {})
#   return %convert_element_type_9,%buf10,%buf11
triton_poi_fused__to_copy_index_put_5 = async_compile.triton('triton_poi_fused__to_copy_index_put_5', '''
import triton
import triton.language as tl

from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math
from torch._inductor.runtime.hints import AutotuneHint, ReductionHint, TileHint, DeviceProperties
triton_helpers.set_driver_to_gpu()

@triton_heuristics.pointwise(
    size_hints={'x': 16777216}, 
    filename=__file__,
    triton_meta={'signature': {'in_ptr0': '*fp32', 'in_ptr1': '*i64', 'in_ptr2': '*bf16', 'out_ptr0': '*bf16', 'out_ptr1': '*bf16', 'out_ptr2': '*bf16', 'xnumel': 'i32', 'XBLOCK': 'constexpr'}, 'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90, major=9, regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048, max_threads_per_block=1024, warp_size=32), 'constants': {}, 'native_matmul': False, 'enable_fp_fusion': False, 'launch_pdl': False, 'disable_ftz': False, 'configs': [{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]], (2,): [['tt.divisibility', 16]], (3,): [['tt.divisibility', 16]], (4,): [['tt.divisibility', 16]], (5,): [['tt.divisibility', 16]], (6,): [['tt.divisibility', 16]]}]},
    inductor_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_poi_fused__to_copy_index_put_5', 'mutated_arg_names': ['out_ptr1', 'out_ptr2'], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_load': 3, 'num_store': 3, 'num_reduction': 0, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': False, 'autotune_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': False, 'dynamic_scale_rblock': True, 'max_autotune': False, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 'spill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs': False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': False, 'tiling_scores': {'x': 167772160}},
    min_elem_per_thread=0
)
@triton.jit
def triton_poi_fused__to_copy_index_put_5(in_ptr0, in_ptr1, in_ptr2, out_ptr0, out_ptr1, out_ptr2, xnumel, XBLOCK : tl.constexpr):
    xnumel = 16777216
    xoffset = tl.program_id(0) * XBLOCK
    xindex = xoffset + tl.arange(0, XBLOCK)[:]
    xmask = tl.full([XBLOCK], True, tl.int1)[:]
    x0 = xindex
    x2 = xindex // 1024
    x1 = (xindex % 1024)
    tmp0 = tl.load(in_ptr0 + (x0), None)
    tmp4 = tl.load(in_ptr1 + (x2), None, eviction_policy='evict_last')
    tmp10 = tl.load(in_ptr2 + (x0), None).to(tl.float32)
    tmp1 = tmp0.to(tl.float32)
    tmp2 = tmp1.to(tl.bfloat16)
    tmp3 = tmp2.to(tl.float32)
    tmp5 = tl.full([XBLOCK], 16385, tl.int32)
    tmp6 = tmp4 + tmp5
    tmp7 = tmp4 < 0
    tmp8 = tl.where(tmp7, tmp6, tmp4)
    tl.device_assert((0 <= tmp8) & (tmp8 < 16385), "index out of bounds: 0 <= tmp8 < 16385")
    tl.store(out_ptr0 + (x0), tmp3, None)
    tl.store(out_ptr1 + (x1 + 1024*tmp8), tmp3, None)
    tl.store(out_ptr2 + (x1 + 1024*tmp8), tmp10, None)
''', device_str='cuda')


async_compile.wait(globals())
del async_compile

class Runner:
    def __init__(self, partitions):
        self.partitions = partitions

    def recursively_apply_fns(self, fns):
        new_callables = []
        for fn, c in zip(fns, self.partitions):
            new_callables.append(fn(c))
        self.partitions = new_callables

    def call(self, args):
        arg0_1, arg1_1, arg2_1, arg3_1, arg4_1, arg5_1, arg6_1, arg7_1, arg8_1, arg9_1 = args
        args.clear()
        assert_size_stride(arg0_1, (131072, 128), (128, 1))
        assert_size_stride(arg1_1, (16384, 48, 128), (6144, 128, 1))
        assert_size_stride(arg2_1, (128, ), (1, ))
        assert_size_stride(arg3_1, (16384, 8, 128), (1024, 128, 1))
        assert_size_stride(arg4_1, (128, ), (1, ))
        assert_size_stride(arg5_1, (16384, ), (1, ))
        assert_size_stride(arg6_1, (16385, 8, 128), (1024, 128, 1))
        assert_size_stride(arg7_1, (16384, ), (1, ))
        assert_size_stride(arg8_1, (16385, 8, 128), (1024, 128, 1))
        assert_size_stride(arg9_1, (16384, 8, 128), (1024, 128, 1))
        with torch.cuda._DeviceGuard(0):
            torch.cuda.set_device(0)
            buf0 = empty_strided_cuda((16384, 48, 1), (48, 1, 786432), torch.float32)
            # Topologically Sorted Source Nodes: [float_1, pow_1, mean], Original ATen: [aten._to_copy, aten.pow, aten.mean]
            stream0 = get_raw_stream(0)
            triton_per_fused__to_copy_mean_pow_0.run(arg1_1, buf0, 786432, 128, stream=stream0)
            buf3 = empty_strided_cuda((16384, 48, 128), (6144, 128, 1), torch.float32)
            buf1 = reinterpret_tensor(buf3, (16384, 48, 64), (6144, 128, 1), 0)  # alias
            buf2 = reinterpret_tensor(buf3, (16384, 48, 64), (6144, 128, 1), 64)  # alias
            # Topologically Sorted Source Nodes: [float_1, pow_1, mean, add, inv_rms, mul, float_2, mul_1, x1, cos_sin_TD, cos, mul_4, x2, sin, mul_5, sub, mul_6, mul_7, add_2], Original ATen: [aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.mul, aten.slice, aten.index, aten.unsqueeze, aten.sub]
            stream0 = get_raw_stream(0)
            triton_poi_fused__to_copy_add_index_mean_mul_pow_rsqrt_slice_sub_unsqueeze_1.run(arg1_1, buf0, arg2_1, arg5_1, arg0_1, buf1, buf2, 50331648, stream=stream0)
            del arg1_1
            del arg2_1
            del buf0
            buf4 = empty_strided_cuda((16384, 48, 128), (6144, 128, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [q_out], Original ATen: [aten._to_copy]
            stream0 = get_raw_stream(0)
            triton_poi_fused__to_copy_2.run(buf3, buf4, 100663296, stream=stream0)
            del buf1
            del buf2
            del buf3
            buf5 = empty_strided_cuda((16384, 8, 1), (8, 1, 131072), torch.float32)
            # Topologically Sorted Source Nodes: [float_3, pow_2, mean_1], Original ATen: [aten._to_copy, aten.pow, aten.mean]
            stream0 = get_raw_stream(0)
            triton_per_fused__to_copy_mean_pow_3.run(arg3_1, buf5, 131072, 128, stream=stream0)
            buf8 = empty_strided_cuda((16384, 8, 128), (1024, 128, 1), torch.float32)
            buf6 = reinterpret_tensor(buf8, (16384, 8, 64), (1024, 128, 1), 0)  # alias
            buf7 = reinterpret_tensor(buf8, (16384, 8, 64), (1024, 128, 1), 64)  # alias
            # Topologically Sorted Source Nodes: [cos_sin_TD, float_3, pow_2, mean_1, add_1, inv_rms_1, mul_2, float_4, mul_3, x1_1, cos_1, mul_8, x2_1, sin_1, mul_9, sub_1, mul_10, mul_11, add_3], Original ATen: [aten.index, aten._to_copy, aten.pow, aten.mean, aten.add, aten.rsqrt, aten.mul, aten.slice, aten.unsqueeze, aten.sub]
            stream0 = get_raw_stream(0)
            triton_poi_fused__to_copy_add_index_mean_mul_pow_rsqrt_slice_sub_unsqueeze_4.run(arg3_1, buf5, arg4_1, arg5_1, arg0_1, buf6, buf7, 8388608, stream=stream0)
            del arg0_1
            del arg3_1
            del arg4_1
            del arg5_1
            del buf5
            buf9 = empty_strided_cuda((16384, 8, 128), (1024, 128, 1), torch.bfloat16)
            # Topologically Sorted Source Nodes: [k_out, setitem, setitem_1], Original ATen: [aten._to_copy, aten.index_put]
            stream0 = get_raw_stream(0)
            triton_poi_fused__to_copy_index_put_5.run(buf8, arg7_1, arg9_1, buf9, arg6_1, arg8_1, 16777216, stream=stream0)
            del arg6_1
            del arg7_1
            del arg8_1
            del arg9_1
            del buf6
            del buf7
            del buf8
        return (buf4, buf9, )

runner = Runner(partitions=[])
call = runner.call
recursively_apply_fns = runner.recursively_apply_fns


def get_args():
    from torch._dynamo.testing import rand_strided
    arg0_1 = rand_strided((131072, 128), (128, 1), device='cuda:0', dtype=torch.float32)
    arg1_1 = rand_strided((16384, 48, 128), (6144, 128, 1), device='cuda:0', dtype=torch.bfloat16)
    arg2_1 = rand_strided((128, ), (1, ), device='cuda:0', dtype=torch.bfloat16)
    arg3_1 = rand_strided((16384, 8, 128), (1024, 128, 1), device='cuda:0', dtype=torch.bfloat16)
    arg4_1 = rand_strided((128, ), (1, ), device='cuda:0', dtype=torch.bfloat16)
    arg5_1 = rand_strided((16384, ), (1, ), device='cuda:0', dtype=torch.int64)
    arg6_1 = rand_strided((16385, 8, 128), (1024, 128, 1), device='cuda:0', dtype=torch.bfloat16)
    arg7_1 = rand_strided((16384, ), (1, ), device='cuda:0', dtype=torch.int64)
    arg8_1 = rand_strided((16385, 8, 128), (1024, 128, 1), device='cuda:0', dtype=torch.bfloat16)
    arg9_1 = rand_strided((16384, 8, 128), (1024, 128, 1), device='cuda:0', dtype=torch.bfloat16)
    return [arg0_1, arg1_1, arg2_1, arg3_1, arg4_1, arg5_1, arg6_1, arg7_1, arg8_1, arg9_1]


def benchmark_compiled_module(args, times=10, repeat=10):
    from torch._inductor.utils import print_performance
    fn = lambda: call(list(args))
    return print_performance(fn, times=times, repeat=repeat)


if __name__ == "__main__":
    from torch._inductor.wrapper_benchmark import compiled_module_main
    args = get_args()
    compiled_module_main('None', lambda times, repeat: benchmark_compiled_module(args, times=times, repeat=repeat))
