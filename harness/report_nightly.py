"""The nightly summary: a pure function of the run's journal (its done ItemRecords) -> Markdown and HTML.

New promotions, regressions, failures first (what a reader acts on), then each task's re-validation
of its promoted kernel against history, baseline drift, agent sessions, interrupted items, and the
environment. harness/nightly.py writes it to results/nightly/<run>/summary.{md,html}.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness import promote
from harness.journal import ItemRecord
from harness.report import environment_section, goals_table, short, us
from harness.report_doc import Block, Bullets, Heading, Para, Table, render_html, render_markdown


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1f}%"


def _findings(items: Sequence[ItemRecord], *kinds: str) -> list[dict[str, Any]]:
    return [f for r in items for f in r.findings if f["kind"] in kinds]


def _where(f: dict[str, Any]) -> str:
    return f"`{f['shape']}`" if f.get("shape") else "-"


def _comparison_cells(c: dict[str, Any] | None) -> tuple[str, str, str, str, str]:
    if c is None:
        return "-", "-", "-", "-", "-"
    return (c["verdict"], us(c.get("center_us")), us(c.get("threshold_us")), _pct(c.get("change_pct")),
            str(c["n_history"]))  # fmt: skip


def _task_blocks(r: ItemRecord) -> list[Block]:
    task = r.item.split(":", 1)[1]
    d = r.details
    blocks: list[Block] = [Heading(3, f"`{task}`", anchor=task)]
    if "error" in d:
        return blocks + [Para(f"**The evaluation failed**: {d['error']}", cls="verdict reject")]
    shapes = ", ".join(f"`{s}`" for s in d.get("shapes", [])) or "none (nothing to evaluate)"
    blocks.append(Para(f"Run `{d.get('evaluation_run')}` on {d.get('environment', {}).get('device', d.get('device'))}, "
                       f"{d.get('policy')} parity policy, shapes {shapes}; {r.wall_s:.1f} s."))  # fmt: skip
    before = d.get("promoted_before")
    if before:
        on = promote.on_gpu(before.get("gpu"))
        blocks.append(Para(f"Promoted when the run started: `{before['candidate']}` (`{short(before['hash'])}`, "
                           f"`{before['path']}`, since run `{before['run_id']}`{on})."))  # fmt: skip
    else:
        blocks.append(Para("No kernel was promoted when the run started."))
    if d.get("promoted_note"):
        blocks.append(Para(d["promoted_note"], cls="note"))
    blocks.append(Para(f"Promotion: {d.get('promotion_reason')}."))
    statuses = d.get("statuses", {})
    blocks.append(Table(("candidate", "worst status over shapes"), tuple((f"`{n}`", s) for n, s in statuses.items()),
                        tuple("pass" if s == "passed" else "fail" for s in statuses.values())))  # fmt: skip
    rows, classes = [], []
    for v in d.get("revalidation", []):
        t = v.get("timing") or {}
        cmp = v.get("comparison")
        ref = v.get("speedups", {}).get("reference")
        rows.append((f"`{v['kernel']}`", f"`{v['shape']}`", v["status"], us(t.get("p20_us")), us(t.get("p50_us")),
                     us(t.get("p80_us")), *_comparison_cells(cmp), "-" if ref is None else f"{ref:.2f}x"))  # fmt: skip
        bad = v["status"] != "passed" or (cmp is not None and cmp["verdict"] == "regression")
        classes.append("fail" if bad else "pass")
    if rows:
        blocks += [Heading(4, "Promoted kernel, re-validated"),
                   Table(("kernel", "shape", "status", "p20 us", "p50 us", "p80 us", "vs history", "history median us",
                          "threshold us", "change", "n", "vs reference"), tuple(rows), tuple(classes))]  # fmt: skip
        untimed = sorted({v["timing_skipped"] for v in d.get("revalidation", []) if v.get("timing_skipped")})
        blocks += [Para("Timing: " + "; ".join(untimed), cls="note")] if untimed else []
    if d.get("goals"):
        blocks += [Heading(4, f"Goals in this run (tasks/{task}.py)"), goals_table(d["goals"])]
    drift = d.get("drift", [])
    if drift:
        blocks += [Heading(4, "Baselines against their history"),
                   Table(("baseline", "shape", "p50 us", "vs history", "history median us", "threshold us", "change",
                          "n"),
                         tuple((f"`{x['implementation']}`", f"`{x['shape']}`", us(x["comparison"]["new_p50_us"]),
                                *_comparison_cells(x["comparison"])) for x in drift))]  # fmt: skip
    return blocks


def nightly_blocks(run: str, done: Sequence[ItemRecord], interrupted: Sequence[ItemRecord], thresholds: dict[str, Any],
                   generated_utc: str) -> list[Block]:  # fmt: skip
    gating = [f for r in done for f in r.findings if f["gating"]]
    blocks: list[Block] = [Heading(1, f"Nightly `{run}`")]
    if gating:
        blocks.append(Para(f"**FAIL**: {len(gating)} gating finding(s).", cls="gate fail"))
        blocks.append(Bullets(tuple(f"`{f['task']}`/`{f['subject']}`: {f['kind']}: {f['message']}" for f in gating)))
    else:
        blocks.append(Para(f"**PASS**: {len(done)} item(s) done: no regression, every promoted kernel passes.",
                           cls="gate pass"))  # fmt: skip
    t = thresholds
    blocks.append(Para(f"A regression: a promoted kernel's p50 above its history's median by more than max({t['k']:g} "
                       f"x spread, {t['min_pct']:g}%), over the last {t['window']} measurements on the same GPU model "
                       f"(at least {t['min_history']}); spread: the larger of the between-run spread (1.4826 x MAD) "
                       "and the within-run half band (p80 - p20) / 2."))  # fmt: skip
    promotions = _findings(done, "promotion", "withdrawal")
    blocks += [Heading(2, "New promotions"),
               Table(("task", "kernel", "action", "reason"),
                     tuple((f"`{f['task']}`", f"`{f['subject']}`", f["kind"], f["message"])
                           for f in promotions))]  # fmt: skip
    regressions = _findings(done, "regression")
    blocks += [Heading(2, "Regressions"),
               Table(("task", "kernel", "shape", "p50 us", "history median us", "threshold us", "change", "n", "why"),
                     tuple((f"`{f['task']}`", f"`{f['subject']}`", _where(f), us(f["figures"].get("new_p50_us")),
                            us(f["figures"].get("center_us")), us(f["figures"].get("threshold_us")),
                            _pct(f["figures"].get("change_pct")), str(f["figures"].get("n_history")), f["message"])
                           for f in regressions), tuple("fail" for _ in regressions))]  # fmt: skip
    failures = _findings(done, "failure")
    blocks += [Heading(2, "Failures"),
               Table(("task", "subject", "shape", "gating", "what"),
                     tuple((f"`{f['task']}`", f"`{f['subject']}`", _where(f), "yes" if f["gating"] else "no",
                            f["message"]) for f in failures),
                     tuple("fail" if f["gating"] else "" for f in failures))]  # fmt: skip
    moved = _findings(done, "faster", "drift")
    if moved:
        blocks += [Heading(2, "Faster than history, and baseline drift (informational)"),
                   Table(("task", "implementation", "shape", "kind", "what"),
                         tuple((f"`{f['task']}`", f"`{f['subject']}`", _where(f), f["kind"], f["message"])
                               for f in moved))]  # fmt: skip
    evaluations = [r for r in done if r.item.startswith("evaluate:")]
    blocks.append(Heading(2, "Tasks"))
    for r in evaluations:
        blocks += _task_blocks(r)
    agents = [r for r in done if r.item.startswith("agent:")]
    if agents:
        blocks += [Heading(2, "Agent sessions"),
                   Table(("task", "kind", "session", "submissions", "passed", "stopped", "transcript"),
                         tuple((f"`{r.item.split(':', 1)[1]}`", r.details.get("kind", "-"),
                                f"`{r.details.get('session', '-')}`", str(len(r.details.get("submissions", []))),
                                str(len(r.details.get("passed", []))), r.details.get("stopped") or "-",
                                f"`{r.details.get('transcript', '-')}`") for r in agents))]  # fmt: skip
    if interrupted:
        blocks += [Heading(2, "Started, not finished"),
                   Para("Taken by a process that had not finished them when this summary was written: still running "
                        "in another invocation, or killed (a later invocation redoes them). Records a killed process "
                        "appended carry no run record and are left out of every history."),
                   Table(("item", "host", "pid", "started"),
                         tuple((f"`{r.item}`", r.host, str(r.pid), r.created_utc) for r in interrupted))]  # fmt: skip
    env = next((r.details.get("environment") for r in evaluations if r.details.get("environment")), None)
    blocks += environment_section(env, "No evaluation recorded its environment.")
    blocks.append(Para(f"Generated {generated_utc} by `harness nightly`.", cls="note"))
    return blocks


def nightly_markdown(*args: Any) -> str:
    return render_markdown(nightly_blocks(*args))


def nightly_html(run: str, *args: Any) -> str:
    return render_html(nightly_blocks(run, *args), f"Nightly {run}", {})
