"""What an agent is told: system prompt, task statement, tools. One function builds it for every agent
kind and for `harness agent prompt`, so what a user reviews is what the agent gets.

    harness agent prompt task=fuse_norm                       the API agent's prompt (default kind)
    harness agent prompt task=fuse_norm agent=command         the prompt file a coding CLI reads
    harness agent prompt task=fuse_norm format=json           the same as JSON (system, statement, tools)

The system prompt is the same for every task; the statement is built from the task file (reference
source, signature, inputs, shapes, parity policy, cost), the machine (device, measured ceilings),
the candidates so far with their numbers, and the hot spots of the newest profile
(harness/agents/context.py). Only the closing "how to deliver" section differs between kinds.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from harness import runner
from harness.agents import context as task_context
from harness.agents.settings import AgentSettings
from harness.agents.tools import TOOLS
from harness.candidates import CANDIDATES_ROOT, parse_source
from harness.environment import REPO_ROOT
from tasks.task import Task

CONTRACT_FILE = CANDIDATES_ROOT / "README.md"

SYSTEM_PROMPT = """\
You are a GPU kernel engineer. You write Triton kernels for one op of Beam, a 501B-parameter
Mixture-of-Experts decoder, and a harness judges every file you submit.

The goal: a candidate file that computes exactly the function of the reference op (the same FP32
math and the same BF16 rounding points) and runs faster than every baseline (the PyTorch reference,
torch.compile of it, and the library kernels listed) beyond the timing noise, on every GPU shape of
the task. The best such candidate is promoted into the optimized model.

Rules (the harness enforces them; breaking one fails the candidate):
- You can only propose candidates. You cannot change the harness, the reference model, the tasks or
  the tests; anything written outside a candidate file is ignored, reverted and reported.
- A candidate imports only torch, triton, triton.language and the Python standard library. It never
  calls the reference or anything of the project (that is detected as a fallback).
- The launcher returns new tensors, writes no input except those the task lists as mutated, keeps
  no results between calls, and leaves no work running after it returns (side streams, threads).
- Candidates run in a sandbox: no network, no files outside a scratch directory, no secrets, no
  processes except the compilers Triton runs. Attempts are recorded as violations.
- Numerics (BEAM.md section 5): read BF16, compute in FP32, round to BF16 exactly where the reference
  rounds. Parity is bit for bit against the reference except 1-ulp differences on a small fraction
  of the elements (reductions in another order), and the error against an FP64 evaluation must not
  be materially worse than the reference's own. Skipping or adding a rounding point is a different
  function, however accurate.
- Without a GPU, candidates run through the Triton interpreter (TRITON_INTERPRET=1): it has no
  libdevice, runs a single autotune config, multiplies BF16 tl.dot operands wrongly (upcast to FP32
  before tl.dot), and an unmasked out-of-bounds store corrupts memory. Branch on
  os.environ.get("TRITON_INTERPRET") == "1" at import time where the GPU path needs something else.

How to work: read the reference and the current best candidate first; say in one line what each
candidate changes and why it should be faster; name the candidate it derives from. A verdict gives,
per shape: status (passed, mismatch, compile_error, runtime_error, timeout, crash, cheat_detected,
sandbox_violation, ...), parity figures (max ulp, elements off, FP64 error ratio), and on a GPU the
p50 time, the speedup over every baseline and the fraction of the roofline floor reached. Fix what a
verdict shows before trying something new; do not resubmit a file unchanged.
"""


@dataclass(frozen=True)
class AgentPrompt:
    system: str
    statement: str
    tools: tuple[dict[str, Any], ...]  # empty for the command agent (it reads a file, not a tool list)

    def render(self) -> str:
        """Plain text: the prompt file of the command agent, and `harness agent prompt`'s output."""
        parts = ["=== SYSTEM PROMPT ===", self.system.rstrip(), "", "=== TASK STATEMENT ===", self.statement.rstrip()]
        if self.tools:
            parts += ["", f"=== TOOLS ({len(self.tools)}) ===", json.dumps(list(self.tools), indent=2)]
        return "\n".join(parts) + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {"system": self.system, "statement": self.statement, "tools": list(self.tools)}


# ---- the task statement, section by section ------------------------------------------------------
def _called_names(fn) -> set[str]:
    tree = parse_source(textwrap.dedent(inspect.getsource(fn)))
    return {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def reference_sources(fn) -> str:
    """The reference function and the helpers of its own module that it calls (transitively)."""
    module = sys.modules[fn.__module__]
    order, todo = [], [fn]
    while todo:
        f = todo.pop()
        if f in order:
            continue
        order.append(f)
        for name in sorted(_called_names(f)):
            g = getattr(module, name, None)
            if inspect.isfunction(g) and g.__module__ == fn.__module__ and g not in order:
                todo.append(g)
    return "\n\n".join(inspect.getsource(f).rstrip() for f in reversed(order))


def _describe_value(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} {list(value.shape)}"
    if value is None:
        return "None"
    return f"{type(value).__name__} = {value!r}"


def _shape_lines(task: Task, labels: list[str], device: str) -> list[str]:
    lines = []
    for shape in task.shapes_for(device):
        if shape.label not in labels:
            continue
        cost = task.cost(shape)
        params = ", ".join(f"{k}={v}" for k, v in shape.params.items())
        lines.append(f"- `{shape.label}`: {params}; floor cost {cost.bytes:,} bytes, {cost.flops:,} FLOPs")
    return lines


def _parity_lines(task: Task, device: str) -> list[str]:
    lines = []
    for check in task.outputs:
        if check.kind == "bf16" and check.bit_exact:
            rule = (f"BF16, bit for bit except 1-ulp differences on at most {check.max_ulp_fraction:.1%} of the "
                    f"elements; FP64 error at most {1 + check.fp64_margin:.2f}x the reference's")  # fmt: skip
        elif check.kind == "bf16":
            rule = f"BF16 (accumulation order free): FP64 error at most {1 + check.fp64_margin:.2f}x the reference's"
        elif check.kind == "fp32":
            rule = (f"FP32: relative error against FP64 at most {check.rel_tol} and at most "
                    f"{1 + check.fp64_margin:.2f}x the reference's")  # fmt: skip
        else:
            rule = "integer ids per row, equal to the reference's as sets (order within a row is free)"
        paired = f" (rows sorted by `{check.paired_with}` first)" if check.paired_with else ""
        lines.append(f"- `{check.name}`: {rule}{paired}")
    if task.mutated:
        lines.append(f"- Written in place (judged like outputs, every other row untouched): {list(task.mutated)}")
    policy = ("GPU policy: against the reference as written, round to nearest even at every rounding point."
              if device == "cuda" else
              "Interpreter policy (no GPU here): the same bounds; the harness makes the interpreter's FP32->BF16 "
              "casts round to nearest like a GPU, so the reference as written is the one to match.")  # fmt: skip
    return [*lines, f"- {policy} Every shape runs with fresh inputs per seed; all must pass."]


def statement(task: Task, ctx: task_context.TaskContext, agent: AgentSettings, delivery: str) -> str:
    ref = task.reference
    example_shape = task.cpu_shapes[0]
    example = task.make_inputs(example_shape, 0, torch.device("cpu"))
    task_doc = inspect.getdoc(importlib.import_module(f"tasks.{task.name}")) or task.description
    gpu_labels = [s.label for s in task.shapes]
    signature = str(inspect.signature(ref)).replace("'", "")  # postponed annotations are strings
    sections = [
        f"# Task `{task.name}`: {task.description}",
        f"## What the op is (tasks/{task.name}.py)\n\n{task_doc}",
        f"## The reference ({ref.__module__}.{ref.__name__}): compute exactly this\n\n"
        f"```python\n{reference_sources(ref)}\n```",
        f"## The launcher your file must define\n\n```python\ndef {ref.__name__}{signature}\n```\n"
        f"Inputs by name, e.g. at `{example_shape.label}`: "
        + "; ".join(f"`{k}`: {_describe_value(v)}" for k, v in example.items()),
        f"## Shapes evaluated in this session ({ctx.device}, seeds {list(ctx.seeds)})\n\n"
        + "\n".join(_shape_lines(task, list(ctx.shapes), ctx.device))
        + ("" if ctx.device == "cuda" else f"\n\nOn the GPU (promotion needs every one): {gpu_labels}"),
        "## Parity policy\n\n" + "\n".join(_parity_lines(task, ctx.device)),
        f"## The machine\n\n- Device: {ctx.device_name}\n- Ceilings: {ctx.ceilings}",
        f"## Candidates so far\n\n{ctx.candidates}",
        "## Goals (reported by every GPU run; promotion needs only to beat every baseline)\n\n" + ctx.goals,
        f"## Hot spots\n\n{ctx.hot_spots}",
        f"## The candidate file contract ({CONTRACT_FILE.relative_to(REPO_ROOT)})\n\n{CONTRACT_FILE.read_text()}",
        delivery,
    ]
    return "\n\n".join(s.rstrip() for s in sections) + "\n"


def api_delivery(agent: AgentSettings) -> str:
    return (f"## How to deliver\n\nUse the tools. You have {agent.rounds} rounds: each submit_candidate call is one "
            "round, evaluated at once, its verdict returned as the tool result. check_parity and inspect_kernels "
            "(what the compiler makes of each config for the H200: registers, spills, vector widths) cost no round. "
            "When you are done, or see nothing more to try, reply without a tool call.")  # fmt: skip


def command_delivery(task: str, agent: AgentSettings, candidate_path: str, workdir: str, round_: int | str,
                     history: str = "") -> str:  # fmt: skip
    text = (
        f"## How to deliver\n\nThis is round {round_} of {agent.rounds}. Write ONE complete candidate file to\n"
        f"    {candidate_path}\nbefore you exit. The harness then adds the CANDIDATE metadata (keeping the `idea` and "
        "`parent` of a CANDIDATE dict if your file has one), copies it into the candidate folder under a unique "
        f"name and evaluates it. Your working directory {workdir} is yours for notes and experiments and is kept "
        "between rounds. The repository is read-only for you: any change to it is reverted and reported. To check "
        f"parity yourself: `python -m harness run task={task} candidates=[{candidate_path}] promote=false "
        f"results_dir={workdir}/results` from the repository root; to see what the compiler makes of each config "
        f"for the H200 (registers, spills, vector widths; no GPU needed): `python -m harness inspect task={task} "
        f"candidate={candidate_path} results_dir={workdir}/results`. (Their records go to your working directory: "
        "results/ is part of the repository.)"
    )
    if history:
        text += f"\n\n## Verdicts of your earlier rounds\n\n{history}"
    return text


def build(task: Task, settings: runner.EvaluationSettings, agent: AgentSettings, kind: str,
          delivery: str | None = None) -> AgentPrompt:  # fmt: skip
    """The prompt for `task` under `settings` (device, shapes, seeds, results_dir); `kind` "anthropic" gets
    the tools, "command" a file protocol (`delivery`, default: with placeholder paths)."""
    device = runner.resolve_device(settings.device)
    shapes = tuple(s.label for s in runner.select_shapes(task, device, settings.shapes))
    folder = Path(agent.candidates_dir) if agent.candidates_dir else CANDIDATES_ROOT / task.name
    ctx = task_context.gather(task, device, shapes, tuple(settings.seeds), settings.results_path, folder)
    if kind == "command":
        delivery = delivery or command_delivery(task.name, agent, "<candidate_path>", "<workdir>", "<round>")
        return AgentPrompt(SYSTEM_PROMPT, statement(task, ctx, agent, delivery), ())
    return AgentPrompt(SYSTEM_PROMPT, statement(task, ctx, agent, delivery or api_delivery(agent)), TOOLS)


# ---- `harness agent prompt` -------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class PromptSettings(runner.EvaluationSettings):
    task: str = ""  # required
    format: str = "text"  # text | json
    agent: AgentSettings = field(default_factory=AgentSettings)  # agent=command shows the prompt file


def show(settings: PromptSettings) -> int:
    from tasks import TASKS, get_task

    if settings.format not in ("text", "json"):
        print(f"error: format must be text or json; got {settings.format!r}", file=sys.stderr)
        return 1
    try:
        if not settings.task:
            raise ValueError(f"task is required, e.g. `harness agent prompt task=fuse_norm`; known: {sorted(TASKS)}")
        task = get_task(settings.task)
        kind = "command" if settings.agent.kind == "command" else "anthropic"
        prompt = build(task, settings, settings.agent, kind)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(prompt.to_dict(), indent=2) if settings.format == "json" else prompt.render(), end="")
    return 0
