"""The task registry: every optimization target by name, in one explicit dict.

`harness run task=<name>` looks the name up here; each name is also the folder of its candidates
(candidate_kernels/<name>/) and of its results (results/<name>/).
"""

from __future__ import annotations

from tasks import dense_act, fuse_norm, moe_experts, moe_route, output_gate, qk_norm_rope, qkv_gate_gemm, router_gemm
from tasks.task import Task

TASKS: dict[str, Task] = {
    "fuse_norm": fuse_norm.TASK,
    "qk_norm_rope": qk_norm_rope.TASK,
    "output_gate": output_gate.TASK,
    "router_gemm": router_gemm.TASK,
    "qkv_gate_gemm": qkv_gate_gemm.TASK,
    "dense_act": dense_act.TASK,
    "moe_route": moe_route.TASK,
    "moe_experts": moe_experts.TASK,
}


def get_task(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"task {name!r} unknown; known: {sorted(TASKS)}") from None
