"""`harness <command> key=value ...`: the command line. The only module that imports Hydra.

The first word(s) name the command (`COMMANDS`); the rest goes to Hydra, so overrides, `+key=value`, `-m`
(multirun) and `--cfg job` work. Two mistakes that Hydra words unhelpfully are refused first, naming what the
command takes (`override_problem`: a key the settings lack, a list item holding '=' unquoted), and a text value
that Hydra's grammar cannot read unquoted (`base=HEAD~1`) is quoted for it, and one value given to a list setting
(`candidates=lean_row`) is made a list (`as_hydra_reads`); everything else reaches Hydra as typed. `--help` is
answered here, from the settings dataclass (every field, its default and the comment beside it in the source).
Each command is a module exposing a frozen `...Settings` dataclass (its fields and defaults ARE the command's
configuration: no YAML repeats them) and a `main(settings) -> int` function (the exit status). Hydra composes the
config once, from harness/conf/command.yaml over the dataclass's schema; `_to_settings` converts it
once into the dataclass; nothing below this module sees a DictConfig.

To add a command, add a row to COMMANDS. Modules are imported lazily: a command whose module is
missing or broken fails alone, with a message, and `harness --help` still lists everything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib
import inspect
import re
import signal
import sys
import threading
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG_DIR = str(Path(__file__).resolve().parent / "conf")  # absolute: works as a script and with -m
COMMAND_CONFIG = "command"  # harness/conf/command.yaml
SCHEMA_NAME = "settings_schema"


@dataclass(frozen=True)
class Command:
    words: tuple[str, ...]  # ("model", "info") is `harness model info`
    module: str
    settings: str  # the frozen dataclass in `module`
    main: str  # the function in `module`: (settings) -> exit status
    help: str

    @property
    def name(self) -> str:
        return " ".join(self.words)


COMMANDS: tuple[Command, ...] = (
    Command(("run",), "harness.run_cmd", "RunSettings", "run",
            "evaluate a task's candidates: sandboxed parity, benchmark on GPU, records, promotion"),
    Command(("results",), "harness.run_cmd", "ResultsSettings", "results",
            "a task's recorded runs, latest results, promotion in force on each GPU and goals; no task: every"
            " task's promotions and goals"),
    Command(("model", "info"), "harness.model_cmd", "ModelInfoSettings", "info",
            "parameter counts, shapes and KV-cache arithmetic of a Beam preset"),
    Command(("model", "check"), "harness.model_cmd", "ModelCheckSettings", "check",
            "run the reference model on a preset and check it end to end"),
    Command(("bench", "model"), "harness.bench_model", "BenchModelSettings", "bench",
            "whole model: reference, compiled peer, optimized and its waterfall; floor, kernels per layer"),
    Command(("agent", "prompt"), "harness.agents.prompt", "PromptSettings", "show",
            "print exactly what an agent is told for a task: system prompt, task statement, tools"),
    Command(("profile",), "harness.profile", "ProfileSettings", "main",
            "model=<preset>: time per op and kernels per layer (PyTorch profiler); "
            "task=<t> candidate=<c>: Nsight Compute"),
    Command(("inspect",), "harness.inspect_kernels", "InspectSettings", "main",
            "task=<t> candidate=<c>: every config of its Triton kernels compiled for the H200 here "
            "(registers, spills, vector widths, programs per SM); no GPU needed"),
    Command(("review",), "harness.review", "ReviewSettings", "main",
            "base=<rev> head=<rev> or candidates=[...]: evaluate changed candidates, PR report, CI gate"),
    Command(("nightly",), "harness.nightly", "NightlySettings", "main",
            "every task again: promoted kernels re-validated against history, dated summary, resumable"),
    Command(("rehash",), "harness.rehash", "RehashSettings", "main",
            "task=<t>: keep the promotion through an edit of the promoted kernel's docstrings or comments only"),
)  # fmt: skip


def usage() -> str:
    width = max(len(c.name) for c in COMMANDS)
    rows = "\n".join(f"  {c.name:<{width}}  {c.help}" for c in COMMANDS)
    return (
        "usage: harness <command> [key=value ...] [-m] [--cfg job] [--help]\n\n"
        f"commands:\n{rows}\n\n"
        "Each command takes Hydra overrides; `harness <command> --help` lists its settings, defaults, meanings.\n"
        "Example: harness run task=fuse_norm seeds=[1,2] \"shapes=['T=1','T=8']\""
    )


# ---- `harness <command> --help`: the settings, their defaults and what they mean -------------------
HELP_FLAGS = ("-h", "--help")
_FIELD_LINE = re.compile(r"^\s+(\w+)\s*:[^#]*?(?:#\s*(.*))?$")
_COMMENT_LINE = re.compile(r"^\s+#\s?(.*)$")


def field_comments(cls: type) -> dict[str, str]:
    """Each field's comment in the source of the dataclass (or of the dataclass it extends): the one on
    the field's line, else the comment block right above it; formatter pragmas left out. The source
    is the documentation: written once, there."""
    names = {f.name for f in dataclasses.fields(cls)}
    comments: dict[str, str] = {}
    for klass in (k for k in cls.__mro__ if dataclasses.is_dataclass(k)):
        above: list[str] = []
        for line in inspect.getsource(klass).splitlines()[1:]:
            field, comment = _FIELD_LINE.match(line), _COMMENT_LINE.match(line)
            if comment:
                above.append(comment.group(1).strip())
                continue
            if field and field.group(1) in names and field.group(1) not in comments:
                text = (field.group(2) or "").strip()
                text = "" if text.startswith(("fmt:", "noqa", "type:")) else text
                comments[field.group(1)] = text or " ".join(above)
            above = []
    return {name: text for name, text in comments.items() if text}


def _value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return "''" if value == "" else str(value)


def settings_lines(cls: type, indent: str = "") -> list[tuple[str, str]]:
    """(`key: default` with nesting indentation, its comment) for every field of a settings dataclass."""
    comments, rows = field_comments(cls), []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = "???"  # mandatory
        if dataclasses.is_dataclass(default):
            rows.append((f"{indent}{f.name}:", comments.get(f.name, "")))
            rows += settings_lines(type(default), indent + "  ")
        else:
            rows.append((f"{indent}{f.name}: {_value(default)}", comments.get(f.name, "")))
    return rows


def command_help(command: Command, settings_cls: type) -> str:
    rows = settings_lines(settings_cls)
    width = max(len(key) for key, _ in rows)
    body = "\n".join(f"{key:<{width}}  # {text}" if text else key for key, text in rows)
    return (f"harness {command.name}: {command.help}\n\n== Settings (key: default  # meaning) ==\n{body}\n\n"
            "Override any of them with key=value (lists: key=[a,b]); sweep with -m key=a,b; --cfg job prints\n"
            "the composed configuration. Use --hydra-help for Hydra's own options.")  # fmt: skip


def find_command(argv: list[str]) -> tuple[Command, list[str]] | None:
    """The command whose words start argv (the longest match), and the remaining arguments."""
    matches = [c for c in COMMANDS if tuple(argv[: len(c.words)]) == c.words]
    if not matches:
        return None
    best = max(matches, key=lambda c: len(c.words))
    return best, argv[len(best.words) :]


# ---- DictConfig -> frozen dataclass, once ----------------------------------------------------------
def _convert(tp: Any, value: Any) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value)
    if origin is tuple:
        (item, *_rest) = typing.get_args(tp)
        return tuple(_convert(item, v) for v in value)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if value is None else _convert(args[0], value)
    return value


def _build(cls: type, values: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs = {f.name: _convert(hints[f.name], values[f.name]) for f in dataclasses.fields(cls) if f.name in values}
    return cls(**kwargs)


def _to_settings(cls: type, cfg: Any) -> Any:
    from omegaconf import OmegaConf

    return _build(cls, OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True))


def _schema_node(cls: type):
    """The dataclass as a typed OmegaConf node, writable (Hydra applies overrides to it)."""
    from omegaconf import DictConfig, OmegaConf

    node = OmegaConf.structured(cls)

    def unfreeze(n: DictConfig) -> None:
        n._set_flag("readonly", None)  # frozen dataclasses make read-only nodes, at every level
        for key in n:
            child = n._get_node(key)
            if isinstance(child, DictConfig):
                unfreeze(child)

    unfreeze(node)
    return node


# ---- overrides Hydra would refuse unhelpfully, refused here first ------------------------------------
_UNQUOTED_ITEM = re.compile(r"[\[,]\s*[^'\"\[\],]*=")  # a list item holding '=' outside quotes


def _is_setting_override(arg: str) -> bool:
    """key=value for one of the command's settings (not Hydra's `+key`, `~key`, `hydra.*` or a flag)."""
    key, eq, _ = arg.partition("=")
    return bool(eq) and not arg.startswith(("-", "+", "~")) and key != "hydra" and not key.startswith("hydra.")


def _setting_type(settings_cls: type, key: str) -> tuple[Any, str | None]:
    """(the type of the setting a dotted key names, None), or (None, why not) where a part of it is no field.
    Below a field that is not a dataclass (a dict), any key is that field's."""
    cls, path = settings_cls, []
    for part in key.split("."):
        names = [f.name for f in dataclasses.fields(cls)]
        if part not in names:
            close = difflib.get_close_matches(part, names, n=1)
            hint = f" (did you mean {'.'.join([*path, close[0]])!r}?)" if close else ""
            where = f"{'.'.join(path)!r} has" if path else "it has"
            return None, f"unknown setting {key!r}{hint}; {where} {', '.join(names)}"
        path.append(part)
        field_type = typing.get_type_hints(cls)[part]
        if not dataclasses.is_dataclass(field_type):
            return field_type, None
        cls = field_type
    return cls, None


def override_problem(command: Command, settings_cls: type, arg: str) -> str | None:
    """Why `arg` is a key=value override this command cannot take, naming what it expected, or None. Covers the
    two that Hydra words least helpfully: a key the settings do not have (Hydra suggests `+key=`, which then
    fails), and a list item holding '=' unquoted (`shapes=[T=1]`, a grammar error). Hydra's own syntax
    (`+key`, `~key`, `hydra.*`, flags) and every value's type are left to Hydra."""
    if not _is_setting_override(arg):
        return None
    key, _, value = arg.partition("=")
    _, unknown = _setting_type(settings_cls, key)
    if unknown:
        return f"{unknown}; `harness {command.name} --help` gives each one's default and meaning"
    if value.startswith("[") and _UNQUOTED_ITEM.search(value):
        quoted = ",".join(f"'{item.strip()}'" for item in value.strip("[]").split(","))
        return f"{arg}: a list item holding '=' must be quoted, the whole override too: \"{key}=[{quoted}]\""
    return None


def as_hydra_reads(settings_cls: type, arg: str) -> str:
    """`arg` written as Hydra must read it to mean what was typed: a text setting's value that Hydra's grammar
    cannot read unquoted (a git revision: HEAD~1, HEAD^, main@{1}) quoted, and one value given to a list setting
    (`candidates=lean_row`, `seeds=4`, `shapes=T=1`) made a list of it. Everything else unchanged: a value
    Hydra reads (a sweep, a list, an interpolation) and Hydra's own syntax stay in force."""
    if not _is_setting_override(arg):
        return arg
    key, _, value = arg.partition("=")
    field_type, _ = _setting_type(settings_cls, key)
    is_list = typing.get_origin(field_type) in (tuple, list)
    is_text = field_type is str or (
        typing.get_origin(field_type) in (typing.Union, types.UnionType)
        and set(typing.get_args(field_type)) == {str, type(None)}
    )
    if not (is_list or is_text):
        return arg
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    unreadable, sweep = object(), object()

    def reads(text: str) -> Any:
        try:
            override = parser.parse_override(text)
        except HydraException:
            return unreadable
        return sweep if override.is_sweep_override() else override.value()

    typed = reads(arg)
    if typed is sweep or value == "":
        return arg
    quoted = "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if not is_list:
        return f"{key}={quoted}" if typed is unreadable and reads(f"{key}={quoted}") == value else arg
    if value.startswith("[") or typed is None:  # a list already (or Hydra's error to give), or null
        return arg
    one = [value] if typed is unreadable else [typed]
    return next((text for text in (f"{key}=[{value}]", f"{key}=[{quoted}]") if reads(text) == one), arg)


def run_command(command: Command, args: list[str]) -> int:
    try:
        module = importlib.import_module(command.module)
        settings_cls = getattr(module, command.settings)
        entry = getattr(module, command.main)
    except (ImportError, AttributeError) as e:
        print(f"error: command `harness {command.name}` needs {command.module}.{command.settings} and "
              f".{command.main}, which do not import: {type(e).__name__}: {e}", file=sys.stderr)  # fmt: skip
        return 1
    if any(a in HELP_FLAGS for a in args):
        print(command_help(command, settings_cls))
        return 0
    problems = [p for p in (override_problem(command, settings_cls, a) for a in args) if p]
    if problems:
        print("\n".join(f"error: harness {command.name}: {p}" for p in problems), file=sys.stderr)
        return 1
    args = [as_hydra_reads(settings_cls, a) for a in args]
    import hydra
    from hydra.core.config_store import ConfigStore
    from omegaconf.errors import MissingMandatoryValue

    ConfigStore.instance().store(name=SCHEMA_NAME, node=_schema_node(settings_cls))
    codes: list[int] = []

    @hydra.main(version_base=None, config_path=CONFIG_DIR, config_name=COMMAND_CONFIG)
    def app(cfg) -> None:
        try:
            settings = _to_settings(settings_cls, cfg)
        except (MissingMandatoryValue, ValueError) as e:  # a bad value: the settings' own validation
            print(f"error: harness {command.name}: {e}", file=sys.stderr)
            codes.append(1)
            return
        codes.append(int(entry(settings)))

    saved = sys.argv
    sys.argv = [f"harness {command.name}", *args]
    try:
        app()
    finally:
        sys.argv = saved
    return max(codes, default=0)


def _line_buffered() -> None:
    """Every printed line reaches a log file or CI pipe as it is printed (Python block-buffers them
    when stdout is not a terminal): a command killed by a time limit still shows how far it got."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure") and not stream.isatty():
            stream.reconfigure(line_buffering=True)


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """SIGTERM (a CI runner's time limit, `timeout`) and SIGINT (Ctrl-C) stop the command with every child
    it started (harness/sandbox.py stop_on_signal), then the previous handlers come back. Signal handlers
    belong to the main thread: elsewhere (a test calling main() from a thread) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    from harness import sandbox

    previous = {sig: signal.signal(sig, sandbox.stop_on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    with _stopped_by_signals():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _line_buffered()
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 1
    found = find_command(argv)
    if found is None:
        known = ", ".join(c.name for c in COMMANDS)
        print(f"error: unknown command {' '.join(argv[:2])!r}; known: {known}\n\n{usage()}", file=sys.stderr)
        return 1
    return run_command(*found)
