"""`harness profile`: where the model spends its time, and what one candidate does on the chip.

    harness profile model=beam-slice scenario=decode          every op of a decode step (PyTorch profiler)
    harness profile model=beam-slice scenario=prefill         8 x 2048 new tokens at ~100K context
    harness profile model=beam-tiny device=cpu                the same on CPU (CI)
    harness profile task=fuse_norm candidate=row_per_program  Nsight Compute on the GPU, per shape

Two profiles behind one command, chosen by which of `model` and `task` is given:
  model  harness/profile_model.py runs the model with every ModelOps op wrapped in a named
         profiler range, and writes tables, a Chrome trace, a chart and a summary to
         <out>/<name>/ (harness/profile_analysis.py, harness/profile_summary.py).
  task   harness/profile_kernel.py profiles the candidate in a sandboxed child through nsight-python
         (which re-runs that child under `ncu`, once per shape) and appends
         one KernelProfileRecord per shape to results/<task>/kernel_profiles.jsonl. Without a GPU
         or without Nsight Compute it says so and exits 0, writing nothing.
Exit status: 0 when the profile was taken (or skipped for want of a GPU or ncu), 1 for bad input
or when the candidate could not be profiled on any shape.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

DEVICES = ("auto", "cuda", "cpu")
WHERE_FILES_GO = ("out", "name", "results_dir", "cache_dir", "keep_scratch")  # left out of `command()`


@dataclass(frozen=True)
class ProfileSettings:
    # What to profile: give exactly one of `model` and `task` (with `candidate`).
    model: str | None = None  # a preset (beam-slice, beam-tiny): the model profile
    task: str | None = None  # a task name: the kernel profile of `candidate`
    candidate: str | None = None  # a file stem in candidate_kernels/<task>/, or a path
    # The model profile. None: the scenario's value for the device (profile_model.SCENARIOS).
    scenario: str = "decode"  # decode | prefill (BEAM.md §7)
    ops: str = "reference"  # reference | optimized (promoted kernels, harness/optimized_model.py)
    context: int | None = None  # cached tokens per sequence before the profiled step
    seqs: int | None = None  # sequences per step
    new_tokens: int | None = None  # new tokens per sequence (prefill; decode is 1)
    device: str = "auto"  # auto (cuda when available) | cuda | cpu
    warmup: int | None = None  # unprofiled steps first
    steps: int | None = None  # profiled steps (tables are per step: their mean)
    out: str = "profiles"  # model profiles go to <out>/<name>/
    name: str | None = None  # None: <preset>-<scenario>-<ops>-<device>-<UTC time>
    top: int = 12  # ops in the chart and the summary's ranking
    # Both profiles.
    seed: int = 0  # the model's weights and the task's inputs are drawn from it
    # The kernel profile.
    shapes: tuple[str, ...] = ()  # the task's GPU shape labels; empty: every GPU shape
    kernel_warmup: int = 3  # calls before the profiled one (Triton compiles and autotunes here)
    ncu: str | None = None  # path of the ncu binary; None: PATH, then the usual install folders
    timeout_s: float = 900.0  # the profiled child, ncu included
    results_dir: str | None = None  # default: <repo>/results
    cache_dir: str | None = None  # default: the runner's (~/.cache/beam-harness)
    keep_scratch: bool = False  # keep the child's job directory (request, log, raw report)

    def __post_init__(self) -> None:
        problems = []
        if (self.model is None) == (self.task is None):
            problems.append(
                "give exactly one of model=<preset> (the model profile) and task=<name> candidate=<name> "
                f"(a candidate's kernels); got model={self.model!r}, task={self.task!r}"
            )
        if self.task is not None and not self.candidate:
            problems.append(f"task={self.task!r} needs candidate=<name> (a file in candidate_kernels/{self.task}/)")
        if self.model is not None and self.candidate is not None:
            problems.append(f"candidate={self.candidate!r} belongs to a kernel profile (task=...), not model=")
        if self.device not in DEVICES:
            problems.append(f"device must be one of {list(DEVICES)}; got {self.device!r}")
        for name in ("context", "seqs", "new_tokens", "steps"):
            value = getattr(self, name)
            if value is not None and value < 1:
                problems.append(f"{name} must be >= 1; got {value}")
        if self.warmup is not None and self.warmup < 0:
            problems.append(f"warmup must be >= 0; got {self.warmup}")
        if self.top < 1 or self.kernel_warmup < 0 or self.seed < 0 or self.timeout_s <= 0:
            problems.append(
                f"need top >= 1, kernel_warmup >= 0, seed >= 0, timeout_s > 0; got top={self.top}, "
                f"kernel_warmup={self.kernel_warmup}, seed={self.seed}, timeout_s={self.timeout_s}"
            )
        if problems:
            raise ValueError("invalid profile settings: " + "; ".join(problems))

    def command(self) -> str:
        """The command line that reproduces this profile: the settings that differ from the defaults (except
        those that only say where files go), quoted for a POSIX shell and Hydra's override grammar."""
        import json
        import shlex
        from dataclasses import fields

        args = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value == f.default or f.name in WHERE_FILES_GO:
                continue
            if isinstance(value, tuple):
                args.append(shlex.quote(f"{f.name}=[{','.join(json.dumps(v) for v in value)}]"))
            else:
                args.append(shlex.quote(f"{f.name}={json.dumps(value) if value is None else value}"))
        return "python -m harness profile " + " ".join(args)


def main(settings: ProfileSettings) -> int:
    """Validate (bad input: a message naming the choices, exit 1), then profile. Failures of the harness
    itself past validation are not caught here: they crash with their traceback."""
    if settings.model is not None:
        from harness import profile_model as mode
    else:
        from harness import profile_kernel as mode
    try:
        prepared = mode.prepare(settings)
    except ValueError as e:  # unknown preset, scenario, task, candidate or shape; sizes that cannot fit
        print(f"error: harness profile: {e}", file=sys.stderr)
        return 1
    return mode.execute(prepared)
