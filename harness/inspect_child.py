"""The sandboxed child of `harness inspect`: a candidate's Triton kernels compiled for the H200, on the CPU.

    python -m harness.inspect_child <request.json>     (started by harness/inspect_kernels.py)

The child enters the sandbox (harness/sandbox.py), imports the candidate, and calls its launcher on
each requested GPU shape's inputs, made on the CPU with the model weights' values not drawn
(tasks/inputs.py unfilled_weights: moe_experts' are 20 GB at beam). No kernel runs: `Autotuner.run` and
`JITFunction.run` are replaced by a recorder of the launch (the kernel, its arguments), and a
launcher that asks torch.cuda.get_device_properties (to size a persistent grid) is told the H200's
figures (H200_PROPERTIES). Each
recorded launch is then compiled, for every config its autotuner could choose, with
`triton.compile` for sm_90a (the H100 / H200), specialized as a launch on the GPU would be (see
`signature`), and `ptxas -v` reports its registers and spills. What comes out per
(kernel, config, shape): registers per thread, spilled bytes, shared memory, barriers, the global
loads and stores by bytes per instruction (16: 128-bit vectors), the programs per SM that
registers, shared memory and warps allow (`residency`), and the SASS instruction mix (`sass_mix`:
how many instructions, and how many of them are conversions, FP64 arithmetic and MUFU, and the global
load round trips a thread makes on its worst path: `load_round_trips`).

Several children may share one inspection (request "part" of "parts"): each records the same launches and
compiles only the distinct specializations that fall to it, saying first which configs of a shape it owns.

These are the compiler's figures, not the chip's: they say whether a config spills, how many
programs an SM can hold and whether loads were vectorized, before any GPU time is spent.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness import sandbox
from harness.child import Reporter, error_text, import_candidate, library_roots_of
from harness.child import main as child_main

# sm_90 (H100 / H200), per SM: CUDA C Programming Guide, "Technical Specifications per Compute Capability".
ARCH = "sm_90a"
CAPABILITY = 90
SM_REGISTERS = 65536
SM_MAX_WARPS = 64
SM_MAX_PROGRAMS = 32
SM_SHARED_BYTES = 233472  # 228 KB
SHARED_RESERVED_PER_PROGRAM = 1024  # the driver's share of every block
REGISTER_ALLOCATION_UNIT = 256  # registers, per warp
TENSOR_BASE_ALIGNMENT = 16  # Triton's divisibility specialization (tt.divisibility = 16)
# What a launcher sizing its grid from the device is told here (no GPU): the lent H200's figures
# (../shared/TOOLCHAIN.md: 132 SMs, 60 MB L2; sm_90's 227 KB of shared memory per block).
H200_PROPERTIES = {"name": "NVIDIA H200 (inspect stand-in)", "major": 9, "minor": 0, "multi_processor_count": 132,
                   "L2_cache_size": 60 * 1024 * 1024, "shared_memory_per_block_optin": 232448,
                   "total_memory": 141 * 10**9}  # fmt: skip

# PTX global memory instructions: the access size of one instruction, in bytes.
_ACCESS_BYTES = {"b8": 1, "u8": 1, "s8": 1, "b16": 2, "u16": 2, "s16": 2, "f16": 2, "b32": 4, "u32": 4, "s32": 4,
                 "f32": 4, "b64": 8, "u64": 8, "s64": 8, "f64": 8}  # fmt: skip
_GLOBAL_ACCESS = re.compile(r"^\s*(?:@!?%p\d+\s+)?(ld|st)\.global\S*?(?:\.v(\d))?\.([bfsu]\d+)\s", re.MULTILINE)
# Global-to-shared copies (cp.async, and the bulk tensor copies of TMA): loads that skip registers.
_ASYNC_COPY = re.compile(r"^\s*(?:@!?%p\d+\s+)?cp\.async\.(?:ca|cg|bulk)\S*", re.MULTILINE)
ASYNC_COPY = "cp.async"
# A SASS instruction of `cuobjdump -sass`: its address, guard predicate, opcode with its modifiers and operands,
# as in "/*0130*/  @!P0 LDG.E.128 R4, desc[UR10][R20.64+0x10] ;" (the opcode proper: LDG).
_SASS_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);", re.MULTILINE)
# Opcode classes that can hold an elementwise kernel on sm_90 when DRAM does not: the type conversions
# (F2F, F2I, I2F, I2I; Hopper's conversion throughput is low, triton-lang/triton#4563), FP64
# arithmetic, and MUFU (rsqrt, exp, ...). F2FP, which packs two FP32 into BF16x2 or FP16x2, is not
# counted as a conversion.
SASS_CLASSES = {"conversions": ("F2F", "F2I", "I2F", "I2I"), "fp64": ("DADD", "DMUL", "DFMA"), "mufu": ("MUFU",)}


@dataclass(frozen=True)
class Figures:
    """One compiled (kernel, config): what ptxas and the PTX say, and what an SM can hold."""

    registers: int  # per thread
    spill_store_bytes: int
    spill_load_bytes: int
    stack_bytes: int
    shared_bytes: int  # static + what Triton asks for dynamically
    barriers: int  # bar.sync in the PTX (static count)
    loads: dict[str, int]  # bytes per instruction -> global load instructions (static count)
    stores: dict[str, int]
    programs_per_sm: int
    occupancy_pct: float  # programs_per_sm x warps / 64
    limited_by: str  # registers | shared memory | warps | programs
    sass: dict[str, int] = field(default_factory=dict)  # sass_mix: static instruction counts


def residency(registers: int, warps: int, shared_bytes: int) -> tuple[int, float, str]:
    """(programs per SM, occupancy %, the binding limit) of a program of `warps` warps on sm_90."""
    per_warp = -(-registers * 32 // REGISTER_ALLOCATION_UNIT) * REGISTER_ALLOCATION_UNIT
    limits = {
        "registers": (SM_REGISTERS // per_warp) // warps if per_warp else SM_MAX_PROGRAMS,
        "shared memory": SM_SHARED_BYTES // (shared_bytes + SHARED_RESERVED_PER_PROGRAM),
        "warps": SM_MAX_WARPS // warps,
        "programs": SM_MAX_PROGRAMS,
    }
    binding = min(limits, key=lambda k: limits[k])
    programs = limits[binding]
    return programs, 100.0 * programs * warps / SM_MAX_WARPS, binding


def ptxas_figures(ptxas_output: str) -> dict[str, int]:
    """Registers, spills and stack from `ptxas -v` (its 'Used N registers' and '... spill' lines)."""

    def number(pattern: str) -> int:
        m = re.search(pattern, ptxas_output)
        if m is None:
            raise ValueError(f"ptxas -v printed no {pattern!r}; got:\n{ptxas_output[-2000:]}")
        return int(m.group(1))

    return {
        "registers": number(r"Used (\d+) registers"),
        "spill_store_bytes": number(r"(\d+) bytes spill stores"),
        "spill_load_bytes": number(r"(\d+) bytes spill loads"),
        "stack_bytes": number(r"(\d+) bytes stack frame"),
    }


def memory_instructions(ptx: str) -> tuple[dict[str, int], dict[str, int]]:
    """Global loads and stores of the PTX by bytes per instruction: {"16": n, "2": m, ...}; the loads
    that copy global memory to shared memory without registers counted under ASYNC_COPY."""
    loads: dict[str, int] = {}
    stores: dict[str, int] = {}
    for op, vector, kind in _GLOBAL_ACCESS.findall(ptx):
        size = str(_ACCESS_BYTES.get(kind, 0) * int(vector or 1))
        counts = loads if op == "ld" else stores
        counts[size] = counts.get(size, 0) + 1
    if copies := len(_ASYNC_COPY.findall(ptx)):
        loads[ASYNC_COPY] = copies
    return loads, stores


def sass_mix(sass: str) -> dict[str, int]:
    """Static SASS instruction counts of `cuobjdump -sass` output: every instruction but the NOP
    padding, and those of each SASS_CLASSES class; and the global load round trips on the worst path
    (`load_round_trips`). Static: a loop body counts once."""
    opcodes = [op.split(".")[0] for _, _, op, _ in _SASS_INSTRUCTION.findall(sass)]
    opcodes = [op for op in opcodes if op != "NOP"]
    if not opcodes:
        raise ValueError(f"no SASS instructions in cuobjdump's output:\n{sass[-2000:]}")
    counts = {"instructions": len(opcodes)}
    counts.update({name: sum(op in ops for op in opcodes) for name, ops in SASS_CLASSES.items()})
    counts["load_round_trips"] = load_round_trips(sass)
    return counts


# A general register operand, with an optional pair or reuse suffix (R12.64, R2.reuse); not URn or RZ.
_SASS_REGISTER = re.compile(r"(?<![A-Z0-9_])R(\d+)(\.64)?")
_LOAD_WIDTHS = {"128": 4, "64": 2}  # registers an LDG writes, by its width modifier (else one)
_SASS_TARGET = re.compile(r"0x([0-9a-f]+)\s*$")  # a branch's target address, its last operand


@dataclass
class _Trips:
    """What a thread is waiting for at one point of a kernel: the round trip of each register a load has not
    yet filled, and the latest trip an instruction has waited for."""

    pending: dict[int, int] = field(default_factory=dict)
    waited: int = 0

    def merge(self, other: _Trips) -> None:
        """Where paths join: the worse of the two for every register and for the trips waited."""
        for register, trip in other.pending.items():
            self.pending[register] = max(trip, self.pending.get(register, 0))
        self.waited = max(self.waited, other.waited)


def load_round_trips(sass: str) -> int:
    """How many global load round trips a thread makes (0: no global load), on the kernel's worst path: a
    load is one trip after the latest load whose value an earlier instruction on its path needed (one that
    reads or overwrites a register a load has not yet filled waits for it: SASS issues in order). Loads of
    independent values issued before any is used are one trip; a load issued after a use of an earlier
    load's value is a second, although it reads an unrelated address: the compiler chose that order, for
    instance to fit the registers it allowed itself. Paths follow the branches forward (two sides of an
    `if` are two paths: the loads of one do not wait on the uses of the other); a backward branch is not
    followed, so a loop body is read once: this is the trips of straight-line code, with its branches (a
    decode kernel's, or a program that loops over one token), not of a ring's steady state. Loads into
    registers (LDG) only: copies to shared memory (cp.async, TMA) are not followed, so a kernel that reads
    only through them counts 0."""
    code = [(int(addr, 16), bool(guard) and guard.strip() != "@PT", op, operands)
            for addr, guard, op, operands in _SASS_INSTRUCTION.findall(sass)]  # fmt: skip
    entry: dict[int, _Trips] = {code[0][0]: _Trips()} if code else {}  # state on arrival, by address
    trips = 0
    state: _Trips | None = None
    for addr, guarded, opcode, operands in code:
        if addr in entry:  # a block's start: what its predecessors left, falling through or branching here
            if state is not None:
                entry[addr].merge(state)
            state = entry.pop(addr)
        if state is None:  # no forward path reaches here (after an EXIT, before a loop's backward branch)
            continue
        registers = set()
        for number, pair in _SASS_REGISTER.findall(operands):
            registers.update(range(int(number), int(number) + (2 if pair else 1)))
        needed = [state.pending.pop(r) for r in registers if r in state.pending]
        state.waited = max([state.waited, *needed])
        name, *modifiers = opcode.split(".")
        if name == "LDG":
            dest = _SASS_REGISTER.search(operands)
            if dest:
                width = next((n for mod, n in _LOAD_WIDTHS.items() if mod in modifiers), 1)
                first = int(dest.group(1))
                state.pending.update(dict.fromkeys(range(first, first + width), state.waited + 1))
            trips = max(trips, state.waited + 1)
        elif name == "BRA" and (target := _SASS_TARGET.search(operands)):
            if int(target.group(1), 16) > addr:  # forward: the target starts with (at worst) this state
                entry.setdefault(int(target.group(1), 16), _Trips()).merge(state)
            if not guarded:
                state = None
        elif name in ("EXIT", "RET") and not guarded:
            state = None
    return trips


def signature(fn: Any, args: tuple, kwargs: dict[str, Any], config_kwargs: dict[str, Any]) -> tuple[dict, dict, list]:
    """(signature, constexprs, names divisible by 16) of a launch, as Triton specializes it on the GPU:
    a tensor is a pointer to its dtype, divisible by 16 when its address is; a host TMA descriptor is
    a tensordesc of its dtype and block shape; an int equal to 1 is the constant 1, one divisible by
    16 is marked so (unless the parameter opts out); floats are fp32."""
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    names = list(inspect.signature(fn.fn).parameters)
    values = {**dict(zip(names, args, strict=False)), **kwargs, **config_kwargs}
    sig: dict[str, str] = {}
    consts: dict[str, Any] = {}
    divisible: list[str] = []
    for name, param in zip(names, fn.params, strict=True):
        if name not in values and param.default is not inspect.Parameter.empty:
            values[name] = param.default
        v = values.get(name)
        if param.is_constexpr or v is None:
            sig[name], consts[name] = "constexpr", v
        elif isinstance(v, TensorDescriptor):
            sig[name] = f"tensordesc<{_triton_dtype(v.base.dtype)}{list(v.block_shape)}>"
        elif isinstance(v, torch.Tensor):
            sig[name] = "*" + _triton_dtype(v.dtype)
            if v.data_ptr() % TENSOR_BASE_ALIGNMENT == 0:
                divisible.append(name)
        elif isinstance(v, bool):
            sig[name] = "i1"
        elif isinstance(v, int):
            if v == 1 and not param.do_not_specialize:
                sig[name], consts[name] = "constexpr", 1
            else:
                sig[name] = "i32" if -(2**31) <= v < 2**31 else "i64"
                if v % 16 == 0 and not (param.do_not_specialize or param.do_not_specialize_on_alignment):
                    divisible.append(name)
        elif isinstance(v, float):
            sig[name] = "fp32"
        else:
            raise TypeError(f"argument {name!r} of {fn.__name__}: cannot specialize a {type(v).__name__}")
    return sig, consts, divisible


def _triton_dtype(dtype: Any) -> str:
    import torch

    names = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
             torch.int8: "i8", torch.uint8: "u8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
             torch.bool: "i1"}  # fmt: skip
    if dtype not in names:
        raise TypeError(f"no Triton pointer type for {dtype}")
    return names[dtype]


def _run_on(artifact: str | bytes, suffix: str, tool: str, *flags: str) -> subprocess.CompletedProcess:
    """Run a CUDA tool (ptxas, cuobjdump) on a compiled artifact written to a scratch file: its output,
    or RuntimeError with its error output when it fails."""
    mode = "wb" if isinstance(artifact, bytes) else "w"
    with tempfile.NamedTemporaryFile(mode, suffix=suffix, dir=os.getcwd(), delete=False) as f:
        f.write(artifact)
    try:
        out = subprocess.run([tool, *flags, f.name], capture_output=True, text=True, timeout=300)
    finally:
        os.unlink(f.name)
    if out.returncode != 0:
        raise RuntimeError(f"{os.path.basename(tool)} failed: {out.stderr[-2000:]}")
    return out


def compile_figures(fn: Any, sig: dict, consts: dict, divisible: list[str], options: dict[str, Any]) -> Figures:
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget

    names = list(sig)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    source = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", CAPABILITY, 32), options=options)
    ptx = compiled.asm["ptx"]
    counts = ptxas_figures(_run_on(ptx, ".ptx", knobs.nvidia.ptxas.path, "-v", f"--gpu-name={ARCH}", "-o",
                                   os.devnull).stderr)  # fmt: skip
    sass = _run_on(compiled.asm["cubin"], ".cubin", knobs.nvidia.cuobjdump.path, "-sass").stdout
    loads, stores = memory_instructions(ptx)
    warps = options.get("num_warps", 4)
    programs, occupancy, binding = residency(counts["registers"], warps, compiled.metadata.shared)
    return Figures(**counts, shared_bytes=compiled.metadata.shared, barriers=ptx.count("bar.sync"), loads=loads,
                   stores=stores, programs_per_sm=programs, occupancy_pct=occupancy, limited_by=binding,
                   sass=sass_mix(sass))  # fmt: skip


# ---- launches -------------------------------------------------------------------------------------
@dataclass
class Launch:
    kernel: str
    fn: Any  # the JITFunction
    configs: list[Any]  # triton.Config: the autotuner's, or one made of the launch's own options
    args: tuple
    kwargs: dict[str, Any]  # everything but the options
    options: dict[str, Any]  # compile options given at the launch (enable_fp_fusion, num_warps, ...)
    heuristics: list[dict[str, Any]] = field(default_factory=list)  # triton.heuristics between autotuner and kernel

    def derived(self, config: Any) -> dict[str, Any]:
        """The values the heuristics compute for this config (not the config's own)."""
        meta = self.meta(config)
        return {name: meta[name] for rules in self.heuristics for name in rules if name not in config.kwargs}

    def meta(self, config: Any) -> dict[str, Any]:
        """The config's meta-parameters, then the heuristics' values computed from everything given."""
        names = list(inspect.signature(self.fn.fn).parameters)
        meta = dict(config.kwargs)
        for rules in self.heuristics:
            given = {**dict(zip(names, self.args, strict=False)), **self.kwargs, **meta}
            meta.update({name: rule(given) for name, rule in rules.items()})
        return meta


_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion", "launch_pdl", "debug")


def record_launches(launches: list[Launch]) -> None:
    """Replace Triton's launch paths by a recorder: nothing runs, every launch is kept."""
    import triton
    from triton.runtime.autotuner import Autotuner, Heuristics
    from triton.runtime.jit import JITFunction

    def split(kwargs: dict[str, Any]) -> tuple[dict, dict]:
        return ({k: v for k, v in kwargs.items() if k not in _OPTIONS},
                {k: v for k, v in kwargs.items() if k in _OPTIONS})  # fmt: skip

    def base(fn: Any) -> tuple[Any, list[dict[str, Any]]]:
        """The JITFunction under the autotuner, and the heuristics met on the way (outermost first)."""
        rules = []
        while not isinstance(fn, JITFunction):
            if isinstance(fn, Heuristics):
                rules.append(fn.values)
            fn = fn.fn
        return fn, rules

    def autotuner_run(self, *args, **kwargs):
        rest, options = split(kwargs)
        fn, rules = base(self.fn)
        launches.append(Launch(fn.__name__, fn, list(self.configs), args, rest, options, rules))

    def jit_run(self, *args, grid, warmup, **kwargs):
        rest, options = split(kwargs)
        config = triton.Config({}, num_warps=options.pop("num_warps", 4), num_stages=options.pop("num_stages", 3),
                               maxnreg=options.pop("maxnreg", None))  # fmt: skip
        launches.append(Launch(self.__name__, self, [config], args, rest, options))

    Autotuner.run = autotuner_run  # triton.heuristics computes its values, then reaches one of these
    JITFunction.run = jit_run


def config_options(config: Any, launch_options: dict[str, Any]) -> dict[str, Any]:
    options = {**launch_options, "num_warps": config.num_warps, "num_stages": config.num_stages}
    if config.maxnreg:
        options["maxnreg"] = config.maxnreg
    return options


def _describe(config: Any, derived: dict[str, Any] | None = None) -> str:
    """The config as the tables show it: Q_HEADS=16, warps=4, stages=3[, maxnreg=96]; the values
    triton.heuristics derived at the launch follow its own meta-parameters (BLOCK_T=64, ...)."""
    parts = [f"{k}={v}" for k, v in {**config.kwargs, **(derived or {})}.items()]
    parts += [f"warps={config.num_warps}", f"stages={config.num_stages}"]
    return ", ".join(parts + ([f"maxnreg={config.maxnreg}"] if config.maxnreg else []))


def stand_in_device_properties(torch: Any) -> None:
    """torch.cuda.get_device_properties answers with H200_PROPERTIES: a launcher that sizes its grid
    from the SM count (a persistent kernel) launches as it would on the H200, and no CUDA is needed."""
    from types import SimpleNamespace

    torch.cuda.get_device_properties = lambda device=None: SimpleNamespace(**H200_PROPERTIES)


def run(request: dict[str, Any], report: Reporter, layers: dict[str, str]) -> None:
    import torch

    from tasks import get_task
    from tasks.inputs import unfilled_weights

    stand_in_device_properties(torch)

    task = get_task(request["task"])
    monitor = sandbox.Monitor(writable=(os.path.realpath(request["scratch"]),),
                              own=os.path.realpath(Path(request["scratch"]).parent),
                              library_roots=library_roots_of(torch))  # fmt: skip
    monitor.install()
    layers.update(audit_hook="active", secret_env="active")
    report.emit("isolation", layers=layers)
    launches: list[Launch] = []
    record_launches(launches)
    candidate = request["candidate"]
    try:
        launcher = import_candidate(candidate["copy"], candidate["hash"], task.op_name)
    except BaseException as e:  # the candidate's failure is data
        report.emit("import_error", message=f"{type(e).__name__}: {e}"[:2000], violations=list(monitor.violations))
        return
    # Part `part` of `parts` children: every part records the same launches and lays out the same configs, and
    # compiles the distinct specializations whose order of first appearance is `part` modulo `parts`. Events
    # carry each config's place in that layout, so the parent lists them as one child would.
    part, parts = request.get("part", 0), request.get("parts", 1)
    owners: dict[tuple[str, str], int] = {}
    done: dict[tuple[str, str], Figures] = {}  # one compilation per distinct specialization
    index = 0
    for label in request["shapes"]:
        shape = task.shape(label, torch.device("cuda"))  # the GPU shape; its inputs are made on the CPU
        with unfilled_weights():  # values never reach a compiler; moe_experts' weights would be 20 GB
            inputs = task.make_inputs(shape, request["seed"], torch.device("cpu"))
        launches.clear()
        try:
            launcher(**inputs)
            after = None
        except Exception as e:  # nothing ran: a launcher reading its outputs back may trip; what was recorded stands
            after = f"{type(e).__name__}: {e}"[:500]
        mine = []
        for launch in launches:
            for config in launch.configs:
                options = config_options(config, launch.options)
                planned = {"index": index, "launch": launch, "options": options, "described": _describe(config)}
                index += 1
                try:
                    planned["described"] = _describe(config, launch.derived(config))
                    planned["specialized"] = signature(launch.fn, launch.args, launch.kwargs, launch.meta(config))
                    sig, consts, divisible = planned["specialized"]
                    planned["key"] = (launch.kernel, json.dumps([sig, {k: repr(v) for k, v in consts.items()},
                                                                 divisible, options], sort_keys=True))  # fmt: skip
                    owner = owners.setdefault(planned["key"], len(owners) % parts)
                except Exception as e:  # a config that cannot be specialized is a finding, the others go on
                    planned["error"] = error_text(e)
                    owner = planned["index"] % parts
                if owner == part:
                    mine.append(planned)
        # Before compiling: a part that dies leaves these unreported, and the parent says so.
        report.emit("owned", shape=label, indices=[p["index"] for p in mine])
        if not launches and part == 0:
            report.emit("no_launch", shape=label, index=index,
                        message=after or "the launcher launched no Triton kernel")  # fmt: skip
        for planned in mine:
            where = {"shape": label, "index": planned["index"], "kernel": planned["launch"].kernel,
                     "config": planned["described"]}  # fmt: skip
            if "error" in planned:
                report.emit("compile_error", **where, message=planned["error"])
                continue
            try:
                key = planned["key"]
                if key not in done:
                    done[key] = compile_figures(planned["launch"].fn, *planned["specialized"], planned["options"])
                report.emit("compiled", **where, figures=asdict(done[key]), signature=planned["specialized"][0],
                            after_launch=after)  # fmt: skip
            except Exception as e:  # a config that does not compile is a finding, the others go on
                report.emit("compile_error", **where, message=error_text(e))
    report.emit("done", violations=list(monitor.violations))


if __name__ == "__main__":
    child_main(sys.argv, run)
