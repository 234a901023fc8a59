"""The review report: a pure function of records (+ the diffs passed in) -> Markdown and HTML.

    review = Review(title, generated_utc, tasks=(TaskReview(...), ...), gate, cheat_checks)
    review_markdown(review)   a PR comment
    review_html(review)       one self-contained page (inline CSS, speedup charts as base64 PNG)

`harness review` (harness/review.py) gathers the inputs: the runner's records of the run, the
promotion in force, the verdicts, the diffs, the kernel profiles. Nothing here reads a file, a
clock or git: the same inputs give the same report (tests/test_review.py holds it to a stored file).

Per task: the verdict of every changed candidate (promote / not promoted / reject, and why), what an edit touched (the
definitions whose code changed, or documentation only), parity figures per shape and output, timings
against every baseline with their p20..p80 bands, the GPU operations one call launches (where counted), the
floor fraction, the contract (cheat) checks and the sandbox, Nsight Compute metrics when recorded, the
speedup chart (HTML), the diff against the parent, and at the end the environment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from harness import promote
from harness.profile_kernel_records import pipes_cell, stalls_cell
from harness.profile_summary import format_cell
from harness.records import (
    EvaluationRecord,
    PromotionRecord,
    Status,
    autotune_key_text,
    config_parts,
    launches_cell,
)
from harness.regression import Comparison
from harness.report_chart import SpeedupPoint, speedup_chart
from harness.report_doc import Block, Bullets, Chart, Diff, Heading, Para, Table, render_html, render_markdown

CHANGE_KINDS = ("added", "modified", "renamed", "deleted", "given")
PR_COMMENT_MAX_CHARS = 65_000  # GitHub refuses a comment over 65,536 characters
ENVIRONMENT_KEYS = ("device", "driver", "cuda", "torch", "triton", "flashinfer", "python", "host", "git_commit",
                    "git_dirty")  # fmt: skip


@dataclass(frozen=True)
class Change:
    """One candidate file under review and what it is compared with."""

    task: str
    path: str  # repository-relative at head (a deleted file: at base)
    kind: str  # one of CHANGE_KINDS ("given": named on the command line, not from a revision range)
    candidate: str | None = None  # its implementation name in the run's records; None: not evaluated
    content_hash: str | None = None
    meta: dict[str, Any] | None = None  # the CANDIDATE dict
    old_path: str | None = None  # renamed: the path at base
    diff_against: str = ""  # e.g. "`row_per_program.py` (its parent) at `main`"
    diff: str = ""  # unified diff against that; empty with `diff_note` saying why
    diff_note: str = ""
    contract_error: str | None = None  # the file breaks the candidate contract: not evaluated
    # Earlier content hashes of the same code (documentation edits apart: the promotions `harness rehash`
    # carried), whose kernel profiles stand for this file's.
    same_code_hashes: tuple[str, ...] = ()
    # The top-level definitions whose code differs from the version diffed against at base (or at HEAD, for a
    # given file) (candidates.code_differences), () where only docstrings and comments changed; None: no
    # earlier version of the file was compared.
    code_changes: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in CHANGE_KINDS:
            raise ValueError(f"change kind must be one of {CHANGE_KINDS}; got {self.kind!r}")

    @property
    def label(self) -> str:
        return self.candidate or self.path.rsplit("/", 1)[-1].removesuffix(".py")

    @property
    def edit_text(self) -> str:
        """What an edit touched: 'documentation only', 'code of `_kernel`, `CONFIGS`' (three names at most, then
        how many more); '' where the file was not compared with an earlier version."""
        if self.code_changes is None:
            return ""
        if not self.code_changes:
            return "documentation only"
        names = ", ".join(f"`{name}`" for name in self.code_changes[:3])
        return f"code of {names}" + (f" and {len(self.code_changes) - 3} more" if len(self.code_changes) > 3 else "")

    @property
    def kind_text(self) -> str:
        """The kind, with what the edit touched: 'modified (documentation only)'."""
        return f"{self.kind} ({self.edit_text})" if self.edit_text else self.kind


@dataclass(frozen=True)
class Verdict:
    """What the review concludes for one change: does it pass the gate, and would `harness run` promote it."""

    path: str
    reason: str  # why it is promoted, why it is not, or why it fails the gate
    gate_ok: bool = True
    promoted: bool = False  # `harness run` would promote it on these records
    against_promoted: dict[str, Comparison] = field(default_factory=dict)  # shape -> vs the promoted kernel

    def __post_init__(self) -> None:
        if not self.reason:
            raise ValueError(f"a verdict must say why ({self.path})")
        if self.promoted and not self.gate_ok:
            raise ValueError(f"a verdict failing the gate cannot promote ({self.path})")

    @property
    def action(self) -> str:
        """'promote'; 'not promoted': it passes the gate, but would not be (not timed, not eligible, or another
        candidate won); 'reject': it fails the gate."""
        return "reject" if not self.gate_ok else "promote" if self.promoted else "not promoted"

    @property
    def css_class(self) -> str:
        return "verdict " + self.action.replace(" ", "-")


@dataclass(frozen=True)
class TaskReview:
    task: str
    changes: tuple[Change, ...]
    verdicts: dict[str, Verdict]  # change path -> verdict
    records: tuple[EvaluationRecord, ...] = ()  # every record of the run (candidates, promoted, baselines)
    run_id: str | None = None  # None: nothing was evaluated (only deletions or contract errors)
    promoted: PromotionRecord | None = None  # in force before the review
    promoted_name: str | None = None  # its implementation name in `records`; None: not evaluated beside
    promoted_note: str = ""  # why it was not evaluated beside, when it was not
    promotion_reason: str = ""  # what `harness run` would decide on these records (promote.decide)
    profiles: tuple[dict[str, Any], ...] = ()  # KernelProfileRecord dicts of the reviewed candidates
    goals: tuple[dict[str, Any], ...] = ()  # the run's candidates against the task's goals (goals.side_by_side)

    @cached_property
    def run_showings(self) -> dict[tuple[str, str], list[promote.Showing]]:
        """promote.showings of the run's records, computed once: the showings each baseline's bar is taken
        from (promote.bars) in this task's timing tables and speedup chart."""
        return promote.showings(self.records)


@dataclass(frozen=True)
class Gate:
    ok: bool
    reasons: tuple[str, ...]  # every failure, "task/candidate: why"

    @property
    def line(self) -> str:
        """The last line of `harness review`'s output: the CI gate's reason."""
        if self.ok:
            return "review: PASS: every changed candidate passes and none regresses a promoted kernel"
        more = f" (and {len(self.reasons) - 1} more, see the report)" if len(self.reasons) > 1 else ""
        return f"review: FAIL: {self.reasons[0]}{more}"


@dataclass(frozen=True)
class Review:
    title: str  # e.g. "main...HEAD"
    generated_utc: str
    tasks: tuple[TaskReview, ...]
    gate: Gate
    cheat_checks: tuple[tuple[str, str], ...]  # (name, what it catches): the checks every call runs


# ---- small formatters --------------------------------------------------------------------------------
def us(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def g3(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def size(x: float | None) -> str:
    return format_cell("bytes", x)  # "352.00 MB": the kernel profile tables' own byte cells


def pct(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.0%}" if x >= 0.1 else f"{x:.2%}"  # a decode shape's floor is a sliver of its time


def short(h: str | None) -> str:
    return (h or "")[:12]


def status_cell(r: EvaluationRecord) -> str:
    return "passed" if r.status is Status.PASSED else f"**{r.status.value}**"


# ---- sections ----------------------------------------------------------------------------------------
def parity_table(rows: Sequence[EvaluationRecord]) -> Table:
    headers = ("shape", "status", "output", "output ok", "max ulp", "ulp>0", ">1 ulp", "max abs err", "FP64 err",
               "ref FP64 err", "ratio", "judged against")  # fmt: skip
    out, classes = [], []
    for r in rows:
        cls = "pass" if r.status is Status.PASSED else "fail"
        if not r.parity:
            out.append((f"`{r.shape_label}`", status_cell(r), "-", "-", "-", "-", "-", "-", "-", "-", "-", "-"))
            classes.append(cls)
            continue
        for name, o in r.parity.items():
            out.append((
                f"`{r.shape_label}`", status_cell(r), f"`{name}`", "yes" if o.get("passed") else "**no**",
                str(o.get("max_ulp", "-")),
                f"{o.get('n_mismatched', 0)}/{o.get('n_elements', 0)}", str(o.get("n_over_tolerance", "-")),
                g3(o.get("max_abs_err")), g3(o.get("fp64_err")), g3(o.get("ref_fp64_err")),
                "-" if o.get("fp64_ratio") is None else f"{o['fp64_ratio']:.3f}", ", ".join(o.get("roundings", [])),
            ))  # fmt: skip
            classes.append(cls)
    return Table(headers, tuple(out), tuple(classes))


def failures(rows: Sequence[EvaluationRecord]) -> list[str]:
    return [f"`{r.shape_label}`: {r.status.value}: {r.detail}" for r in rows if r.status is not Status.PASSED]


def _band(t: dict[str, float]) -> tuple[str, str, str, str]:
    noise = (t["p80_us"] - t["p20_us"]) / t["p50_us"]
    return us(t["p20_us"]), us(t["p50_us"]), us(t["p80_us"]), f"{noise:.1%}"


def timing_table(rows: Sequence[EvaluationRecord], name: str, promoted: dict[str, EvaluationRecord],
                 run_showings: dict[tuple[str, str], list[promote.Showing]] | None = None,
                 run_records: Sequence[EvaluationRecord] = ()) -> Table:  # fmt: skip
    """The candidate and everything it was timed against, per shape; `promoted`: shape -> record. A baseline
    that ran more than 5% faster, beyond noise, elsewhere in the run (`run_showings`, promote.bars) gets a
    second row: the showing the candidate is judged against. Where the run counted GPU operations per call,
    a `launches` column gives each row's: the candidate's from its record, a baseline's from the baselines
    child's record of it (`run_records`), the promoted kernel's from its own."""
    baseline_records = {(r.implementation, r.shape_label): r for r in run_records if r.kind != "candidate"}
    counted = any(r.launches is not None for r in [*rows, *baseline_records.values(), *promoted.values()])
    headers = ("shape", "implementation", "p20 us", "p50 us", "p80 us", "noise", *(("launches",) if counted else ()),
               "candidate speedup", "beyond noise", "floor fraction")  # fmt: skip
    out, classes = [], []
    for r in rows:
        if r.timing is None:
            continue
        t = {"p20_us": r.timing.p20_us, "p50_us": r.timing.p50_us, "p80_us": r.timing.p80_us}
        floor = f"{pct(r.floor_fraction)} of {us(r.floor_us)} us" if r.floor_fraction is not None else "-"
        if r.suspicious:
            floor += " **below the floor**"
        if r.copy_floor_fraction is not None:
            floor += f"; {pct(r.copy_floor_fraction)} of one kernel moving the same bytes ({us(r.copy_floor_us)} us)"
        launches = (launches_cell(r),) if counted else ()
        out.append((f"`{r.shape_label}`", f"`{name}` (candidate)", *_band(t), *launches, "-", "-", floor))
        classes.append("candidate")
        others = []
        for baseline, bar in sorted(promote.bars(r, run_showings or {}).items()):
            counts = baseline_records.get((baseline, r.shape_label))
            others.append((baseline, r.baselines_us[baseline], counts))
            if bar.where != "beside it":
                others.append((f"{baseline} ({bar.where}: faster, the bar)", bar.band, counts))
        p = promoted.get(r.shape_label)
        if p is not None and p.timing is not None and p.implementation != name:
            others.append((f"{p.implementation} (promoted)", {"p20_us": p.timing.p20_us, "p50_us": p.timing.p50_us,
                                                                "p80_us": p.timing.p80_us}, p))  # fmt: skip
        for other, b, counts in others:
            beyond = "yes" if r.timing.p80_us < b["p20_us"] else "no"
            launches = (launches_cell(counts),) if counted else ()
            out.append((f"`{r.shape_label}`", other, *_band(b), *launches, f"{b['p50_us'] / r.timing.p50_us:.2f}x",
                        beyond, "-"))  # fmt: skip
            classes.append("" if beyond == "yes" else "fail")
    return Table(headers, tuple(out), tuple(classes))


def goals_table(rows: Sequence[dict[str, Any]]) -> Table:
    """One run's candidates against the task's goals (harness/goals.py side_by_side rows); a row a
    candidate met is marked pass, a missed one is plain: a goal informs, it gates nothing."""
    names = list(rows[0]["cells"]) if rows else []
    return Table(("shape", "goal", *(f"`{n}`" for n in names)),
                 tuple((f"`{g['shape']}`", g["goal"], *(g["cells"][n] for n in names)) for g in rows),
                 tuple("pass" if any(g["met"].values()) else "" for g in rows))  # fmt: skip


def autotuned_lines(rows: Sequence[EvaluationRecord]) -> list[str]:
    """`kernel (key values)`: config, per autotuning key; the key's dtypes and the configs' defaults left out."""
    chosen = {(kernel, key, config) for r in rows for kernel, choices in r.autotuned.items()
              for key, config in choices.items()}  # fmt: skip
    return sorted(f"`{k}` ({autotune_key_text(key)}): {', '.join(config_parts(c))}" for k, key, c in chosen)


def cheat_section(rows: Sequence[EvaluationRecord], checks: Sequence[tuple[str, str]]) -> list[Block]:
    n_calls = sum(len(r.seeds) for r in rows)
    names = ", ".join(f"`{n}`" for n, _ in checks)
    blocks: list[Block] = [Para(f"Checked on every call ({n_calls} = {len(rows)} shape(s) x seeds): {names}.")]
    fired = [r for r in rows if r.cheats or r.sandbox_events]
    if fired:
        blocks.append(Table(("shape", "status", "cheats", "sandbox events"),
                            tuple((f"`{r.shape_label}`", status_cell(r), "; ".join(r.cheats) or "-",
                                   "; ".join(r.sandbox_events) or "-") for r in fired),
                            tuple("fail" for _ in fired)))  # fmt: skip
    else:
        blocks.append(Para("**None fired** on any shape; the sandbox recorded no violation."))
    isolation = next((r.isolation for r in rows if r.isolation), None)
    if isolation:
        blocks.append(Para("Sandbox layers: " + ", ".join(f"{k} {v}" for k, v in sorted(isolation.items())) + "."))
    return blocks


PROFILE_COLUMNS = (("duration_us", "duration us", us), ("dram_throughput_pct", "DRAM % peak", g3),
                   ("l2_throughput_pct", "L2 % peak", g3), ("l2_read_bytes", "L2 read", size),
                   ("l1_hit_pct", "L1 hit %", g3), ("achieved_occupancy_pct", "occupancy %", g3),
                   ("registers_per_thread", "registers", str), ("spill_bytes", "spill bytes", g3),
                   ("floor_fraction", "floor fraction", pct), ("issue_active_pct", "issue %", g3))  # fmt: skip


def profile_section(
    profiles: Sequence[dict[str, Any]], task: str, name: str, own_hash: str | None = None
) -> list[Block]:
    """The latest profile per shape of a file; `own_hash` (the file's content hash): profiles of other bytes
    (the same code, `Change.same_code_hashes`) say which bytes ran."""
    if not profiles:
        return [Para(f"No Nsight Compute profile recorded for this file (`harness profile task={task} "
                     f"candidate={name}` on a GPU with ncu).", cls="note")]  # fmt: skip
    latest: dict[str, dict[str, Any]] = {}
    for p in sorted(profiles, key=lambda p: p.get("created_utc", "")):
        latest[p["shape_label"]] = p
    rows = []
    for label, p in latest.items():
        cells = [f"`{label}`", p.get("status", "-"), str(len(p.get("kernels", [])))]
        cells += ["-" if p.get(key) is None else fmt(p[key]) for key, _, fmt in PROFILE_COLUMNS]
        rows.append((*cells, pipes_cell(p) or "-", stalls_cell(p) or "-"))
    first = next(iter(latest.values()))
    others = sorted({p["candidate_hash"][:12] for p in latest.values() if own_hash and p["candidate_hash"] != own_hash})
    of = (f" Profiled as `{'`, `'.join(others)}`: the same code as this file, documentation edits apart."
          if others else "")  # fmt: skip
    return [Para(f"Nsight Compute {first.get('ncu_version', '')} ({first.get('ncu_options', '')}), run "
                 f"`{first.get('run_id', '-')}`.{of}"),
            Table(("shape", "status", "kernels", *(h for _, h, _ in PROFILE_COLUMNS), "pipes %, busiest first",
                   "largest stalls, warp cycles per issue"), tuple(rows))]  # fmt: skip


def chart_points(t: TaskReview) -> list[SpeedupPoint]:
    """Speedups of the reviewed candidates (and of the promoted kernel beside them) over each baseline's bar
    (promote.bars: beside it, or faster elsewhere in the run)."""
    names = {c.candidate for c in t.changes if c.candidate}

    def of(r: EvaluationRecord, label: str) -> list[SpeedupPoint]:
        mine = {"p20_us": r.timing.p20_us, "p50_us": r.timing.p50_us, "p80_us": r.timing.p80_us}
        return [SpeedupPoint.from_timings(label, r.shape_label, b, mine, bar.band)
                for b, bar in sorted(promote.bars(r, t.run_showings).items())]  # fmt: skip

    points = [p for r in t.records if r.implementation in names and r.timing is not None
              for p in of(r, r.implementation)]  # fmt: skip
    if points and t.promoted_name not in names:
        points += [p for r in t.records if r.implementation == t.promoted_name and r.timing is not None
                   for p in of(r, f"{r.implementation} (promoted)")]  # fmt: skip
    return points


def _verdict_para(v: Verdict) -> Para:
    gate = "passes the gate" if v.gate_ok else "**fails the gate**"
    return Para(f"**Verdict: {v.action.upper()}**: {v.reason} ({gate})", cls=v.css_class)


def change_section(t: TaskReview, c: Change, checks: Sequence[tuple[str, str]]) -> list[Block]:
    v = t.verdicts[c.path]
    where = f"`{c.old_path}` -> `{c.path}`" if c.old_path else f"`{c.path}`"
    edit = f" ({c.edit_text})" if c.edit_text else ""
    blocks: list[Block] = [Heading(3, f"`{c.label}`: {c.kind} {where}{edit}"), _verdict_para(v)]
    if c.meta:
        model = f" ({c.meta.get('model')})" if c.meta.get("model") else ""
        blocks.append(Para(f"Author: {c.meta.get('author')}{model}; parent: `{c.meta.get('parent') or 'none'}`; "
                           f"idea: {c.meta.get('idea')}; content hash `{short(c.content_hash)}`."))  # fmt: skip
    if c.contract_error:
        blocks.append(Para(f"Breaks the candidate contract (candidate_kernels/README.md), not evaluated: "
                           f"{c.contract_error}"))  # fmt: skip
    rows = [r for r in t.records if r.implementation == c.candidate] if c.candidate else []
    if rows:
        blocks += [Heading(4, "Parity"), parity_table(rows)]
        blocks += [Bullets(tuple(failures(rows)))] if failures(rows) else []
        promoted = {r.shape_label: r for r in t.records if r.implementation == t.promoted_name}
        blocks.append(Heading(4, "Timing"))
        table = timing_table(rows, c.candidate, promoted, t.run_showings, t.records)
        if table.rows:
            blocks.append(table)
            notes = sorted({f"`{b}`: {why}" for r in rows for b, why in r.baseline_notes.items()})
            blocks += [Para("Not timed beside it: " + "; ".join(notes), cls="note")] if notes else []
            tuned = autotuned_lines(rows)
            blocks += [Para("Configs its autotuners chose in the benchmark child: " + "; ".join(tuned),
                            cls="note")] if tuned else []  # fmt: skip
        else:
            skipped = sorted({r.timing_skipped or "no timing" for r in rows})
            blocks.append(Para("Timing: " + "; ".join(skipped), cls="note"))
        if v.against_promoted:
            blocks.append(Heading(4, f"Against the promoted `{t.promoted.candidate}`"))
            blocks.append(Table(("shape", "verdict", "why"), tuple((f"`{s}`", cmp.verdict, cmp.reason)
                                                                   for s, cmp in v.against_promoted.items()),
                                tuple("fail" if cmp.verdict == "regression" else "" for cmp in
                                      v.against_promoted.values())))  # fmt: skip
        blocks += [Heading(4, "Cheat checks"), *cheat_section(rows, checks)]
        blocks += [Heading(4, "Nsight Compute"),
                   *profile_section([p for p in t.profiles if p.get("candidate_hash") in
                                     {c.content_hash, *c.same_code_hashes}], t.task, c.label,
                                    c.content_hash)]  # fmt: skip
    if c.kind != "deleted":
        blocks.append(Heading(4, "Diff"))
        if c.diff_against:
            blocks.append(Diff(f"diff against {c.diff_against}", c.diff))
        if c.diff_note:
            blocks.append(Para(c.diff_note, cls="note"))
    return blocks


def task_section(t: TaskReview, checks: Sequence[tuple[str, str]]) -> list[Block]:
    blocks: list[Block] = [Heading(2, f"`{t.task}`", anchor=t.task)]
    first = t.records[0] if t.records else None
    if first is not None:
        shapes = ", ".join(f"`{s}`" for s in dict.fromkeys(r.shape_label for r in t.records))
        blocks.append(Para(f"Run `{t.run_id}` on {first.environment.get('device', first.device)}, {first.policy} "
                           f"parity policy, seeds {first.seeds}, shapes {shapes}."))  # fmt: skip
    p = t.promoted
    if p is None:
        blocks.append(Para("Promoted before this review: none."))
    else:
        beside = f", evaluated beside as `{t.promoted_name}`" if t.promoted_name else ""
        blocks.append(Para(f"Promoted before this review: `{p.candidate}` (`{short(p.content_hash)}`, `{p.path}`) "
                           f"since run `{p.run_id}`{promote.on_gpu(promote.gpu_of(p))}{beside}."))  # fmt: skip
    if t.promoted_note:
        blocks.append(Para(t.promoted_note, cls="note"))
    if t.promotion_reason:
        blocks.append(Para(f"Promotion on these records (as `harness run` would decide): {t.promotion_reason}."))
    if t.goals:
        blocks += [Heading(4, f"Goals in this run (tasks/{t.task}.py)"), goals_table(t.goals)]
    if chart_points(t):
        blocks.append(Chart(t.task, f"speedup of {t.task} candidates over each baseline",
                            "Speedup chart (p50 ratio, whiskers: p20..p80 bands): in the HTML report."))  # fmt: skip
    for c in t.changes:
        blocks += change_section(t, c, checks)
    return blocks


def review_blocks(review: Review) -> list[Block]:
    gate = review.gate
    blocks: list[Block] = [Heading(1, f"Kernel review: {review.title}")]
    if gate.ok:
        blocks.append(Para("**Gate: PASS**: every changed candidate passes and none regresses a promoted kernel.",
                           cls="gate pass"))  # fmt: skip
    else:
        blocks.append(Para(f"**Gate: FAIL**: {len(gate.reasons)} problem(s).", cls="gate fail"))
        blocks.append(Bullets(gate.reasons))
    summary = []
    for t in review.tasks:
        for c in t.changes:
            v = t.verdicts[c.path]
            gate = "pass" if v.gate_ok else "FAIL"
            summary.append((f"`{t.task}`", f"`{c.label}`", c.kind_text, f"**{v.action}**", gate, v.reason))
    blocks.append(Table(("task", "candidate", "change", "verdict", "gate", "reason"), tuple(summary),
                        tuple("pass" if row[4] == "pass" else "fail" for row in summary)))  # fmt: skip
    for t in review.tasks:
        blocks += task_section(t, review.cheat_checks)
    env = next((r.environment for t in review.tasks for r in t.records), None)
    blocks += environment_section(env, "Nothing was evaluated.")
    blocks.append(Para(f"Generated {review.generated_utc} by `harness review`.", cls="note"))
    return blocks


def environment_section(env: dict[str, Any] | None, missing: str) -> list[Block]:
    """The report's closing section: the recorded environment's key facts, or `missing` where none was recorded."""
    if not env:
        return [Heading(2, "Environment"), Para(missing, cls="note")]
    return [Heading(2, "Environment"),
            Table(("key", "value"), tuple((k, str(env.get(k))) for k in ENVIRONMENT_KEYS if k in env))]  # fmt: skip


def review_markdown(review: Review, max_chars: int = PR_COMMENT_MAX_CHARS) -> str:
    """The PR comment. Past `max_chars` the diffs give way to a pointer to the HTML page, then the text is cut."""
    blocks = review_blocks(review)
    text = render_markdown(blocks)
    if len(text) <= max_chars:
        return text
    slim = [Para(f"_{b.title}: in the HTML report (the comment would pass GitHub's size limit)._")
            if isinstance(b, Diff) else b for b in blocks]  # fmt: skip
    text = render_markdown(slim)
    if len(text) <= max_chars:
        return text
    note = "\n\n_... cut at GitHub's comment size limit; the whole report is in review.html._\n"
    return text[: max_chars - len(note)] + note


def review_charts(review: Review) -> dict[str, bytes]:
    return {t.task: speedup_chart(points, f"{t.task}: speedup (p50 ratio; whiskers p20..p80)")
            for t in review.tasks if (points := chart_points(t))}  # fmt: skip


def review_html(review: Review) -> str:
    return render_html(review_blocks(review), f"Kernel review: {review.title}", review_charts(review))
