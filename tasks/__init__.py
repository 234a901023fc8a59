"""The task registry: every optimization target by name, in one explicit dict.

`harness run task=<name>` looks the name up here; each name is also the folder of its candidates
(candidate_kernels/<name>/) and of its results (results/<name>/).
"""

from __future__ import annotations

from tasks import fuse_norm
from tasks.task import Task

TASKS: dict[str, Task] = {
    "fuse_norm": fuse_norm.TASK,
}


def get_task(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"task {name!r} unknown; known: {sorted(TASKS)}") from None
