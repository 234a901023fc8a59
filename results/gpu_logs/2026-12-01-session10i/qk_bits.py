"""qk_norm_rope sliding T=16384, seed 1: q' of head_groups and early_gather with each config forced,
compared bit for bit with each other (count of differing elements). Usage: qk_bits.py"""
import importlib.util
import torch, triton
from tasks import TASKS

def load(name):
    spec = importlib.util.spec_from_file_location(name, f"candidate_kernels/qk_norm_rope/{name}.py")
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    return m

task = TASKS["qk_norm_rope"]
dev = torch.device("cuda")
inputs = task.make_inputs(task.shape("sliding T=16384", dev), 1, dev)
outs = {}
for name in ("head_groups", "early_gather"):
    m = load(name)
    for heads, warps in ((16, 2), (32, 8), (8, 2), (64, 8)):
        m._qk_norm_rope_kernel.configs = [triton.Config({"Q_HEADS": heads}, num_warps=warps)]
        args = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
        outs[(name, heads, warps)] = m.qk_norm_rope(**args)[0]
base = outs[("head_groups", 16, 2)]
for key, q in outs.items():
    print(key, "elements differing from head_groups (16, 2):", int((q.view(torch.int16) != base.view(torch.int16)).sum()), flush=True)
