"""Why torch 2.11's CPU profiles on the GPU machine named L4.moe ".moe" (sixty-third session), looked at.

    CUDA_VISIBLE_DEVICES= python results/gpu_logs/2026-12-07-session64/demangle_probe.py

torch's profiler passes every event name through torch._C._demangle (profiler_util.StringTable), which is
the C++ runtime's abi::__cxa_demangle. In the Itanium grammar "L4.moe" reads as an internal-linkage
<source-name> of length 4, ".moe"; this machine's libstdc++ 6.0.30 (GCC 12) refuses it as a bare type and
leaves it, a newer one may not. Prints the runtime in use, what it and torch make of the range names, and
the names a CPU-only profile gives through prof.events() and through its exported chrome trace.
"""

import ctypes
import json
import os
import tempfile

import torch

from reference_model.cache import KVCache
from reference_model.config import get_config
from reference_model.weights import random_model

print("torch", torch.__version__)
with open("/proc/self/maps") as maps:
    print("C++ runtime:", sorted({line.split()[-1] for line in maps if "libstdc++" in line}))
names = ["L3.moe", "L4.moe", "L5.moe", "L4.mlp", "L4.attention", "L10.attention", "L0.mlp", "lm_head"]
cxa = ctypes.CDLL("libstdc++.so.6").__cxa_demangle
cxa.restype = ctypes.c_char_p
for name in names:
    status = ctypes.c_int()
    got = cxa(name.encode(), None, None, ctypes.byref(status))
    print(f"{name!r}: torch._C._demangle {torch._C._demangle(name)!r}, __cxa_demangle {got!r} (status {status.value})")

tiny = get_config("beam-tiny")
model = random_model("beam-tiny", seed=0)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    model.decode(KVCache(tiny, 1, 64, "cpu"), torch.tensor([1]))
layers = sorted({e.name for e in prof.events() if e.name.endswith((".attention", ".mlp", ".moe"))})
print(f"prof.events(): {len(layers)} layer ranges: {layers}")
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)
layers = sorted({e["name"] for e in trace["traceEvents"] if e.get("cat") == "user_annotation"
                 and e["name"].endswith((".attention", ".mlp", ".moe"))})
print(f"chrome trace: {len(layers)} layer ranges: {layers}")
