"""A report as a list of blocks, rendered twice: Markdown (a PR comment) and a self-contained HTML page.

harness/report.py (review) and harness/report_nightly.py (nightly summary) build the blocks from
records; this module renders them, so the two formats always say the same thing. Text may carry
two inline marks, the same in both formats: `code` and **bold**.

The HTML page is one file: inline CSS, charts as PNG in data: URIs, no script, no external fetch.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass

MAX_DIFF_LINES = 400  # a diff longer than this is cut, with a note saying how much is missing


@dataclass(frozen=True)
class Heading:
    level: int  # 1..4
    text: str
    anchor: str = ""  # HTML id (a task name): a table of contents can link to it


@dataclass(frozen=True)
class Para:
    text: str
    # HTML class: "verdict promote", "verdict not-promoted", "verdict reject", "gate pass", "gate fail", "note"
    cls: str = ""


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]
    cls: str = ""  # HTML class of the list


@dataclass(frozen=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    row_classes: tuple[str, ...] = ()  # HTML class per row ("fail", "pass", "candidate"); empty: none

    def __post_init__(self) -> None:
        bad = [r for r in self.rows if len(r) != len(self.headers)]
        if bad:
            raise ValueError(f"table rows must have {len(self.headers)} cells ({self.headers}); got {bad[0]}")


@dataclass(frozen=True)
class Diff:
    title: str  # e.g. "diff against `row_per_program.py` at `main`"
    text: str  # unified diff


@dataclass(frozen=True)
class Chart:
    key: str  # the PNG's key in the charts passed to render_html
    alt: str
    markdown_note: str  # what the Markdown says in its place (a PR comment cannot embed a PNG)


Block = Heading | Para | Bullets | Table | Diff | Chart


# ---- Markdown ----------------------------------------------------------------------------------------
def _md_cell(text: str) -> str:
    return (text or "-").replace("|", "\\|").replace("\n", " ")


def _md_table(t: Table) -> str:
    if not t.rows:
        return "_(none)_"
    lines = ["| " + " | ".join(_md_cell(h) for h in t.headers) + " |", "|" + "|".join(" --- " for _ in t.headers) + "|"]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in t.rows]
    return "\n".join(lines)


def diff_stats(text: str) -> tuple[int, int]:
    lines = text.splitlines()
    added = sum(1 for ln in lines if ln.startswith("+") and not ln.startswith("+++"))
    removed = sum(1 for ln in lines if ln.startswith("-") and not ln.startswith("---"))
    return added, removed


def _cut(text: str) -> tuple[str, int]:
    lines = text.splitlines()
    return "\n".join(lines[:MAX_DIFF_LINES]), max(0, len(lines) - MAX_DIFF_LINES)


def _md_diff(d: Diff) -> str:
    if not d.text:
        return f"{d.title}: _no differences_"
    body, cut = _cut(d.text)
    fence = "```"
    while fence in body:
        fence += "`"
    added, removed = diff_stats(d.text)
    more = f"\n\n_... {cut} more lines cut; the whole diff is in the HTML report._" if cut else ""
    return (f"<details><summary>{_md_inline_html(d.title)} (+{added} -{removed} lines)</summary>\n\n"
            f"{fence}diff\n{body}\n{fence}{more}\n\n</details>")  # fmt: skip


def _md_item(text: str) -> str:
    return text.replace("\n", " ")


def _md_inline_html(text: str) -> str:
    """A <summary> is HTML inside Markdown: marks must be tags there."""
    return _inline_html(text)


def render_markdown(blocks: Sequence[Block]) -> str:
    out = []
    for b in blocks:
        if isinstance(b, Heading):
            out.append("#" * b.level + " " + b.text)
        elif isinstance(b, Para):
            out.append(b.text)
        elif isinstance(b, Bullets):
            out.append("\n".join(f"- {_md_item(item)}" for item in b.items))
        elif isinstance(b, Table):
            out.append(_md_table(b))
        elif isinstance(b, Diff):
            out.append(_md_diff(b))
        elif isinstance(b, Chart):
            out.append(f"_{b.markdown_note}_")
        else:
            raise TypeError(f"unknown report block {type(b).__name__}")
    return "\n\n".join(out) + "\n"


# ---- HTML --------------------------------------------------------------------------------------------
_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*(.+?)\*\*")

CSS = """
body { font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #1f2328; margin: 24px auto;
       max-width: 1280px; padding: 0 16px; background: #ffffff; }
h1 { font-size: 24px; border-bottom: 1px solid #d0d7de; padding-bottom: 6px; }
h2 { font-size: 20px; border-bottom: 1px solid #d0d7de; padding-bottom: 4px; margin-top: 32px; }
h3 { font-size: 16px; margin-top: 24px; } h4 { font-size: 14px; margin-top: 18px; }
h1 code, h2 code, h3 code { font-size: inherit; }
code { font: 12px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; background: #f6f8fa; padding: 1px 4px;
       border-radius: 4px; }
table { border-collapse: collapse; margin: 8px 0 12px; font-size: 13px; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
tr.fail td { background: #ffebe9; } tr.pass td { background: #eef9f0; } tr.candidate td { font-weight: 600; }
p.verdict, p.gate { padding: 8px 12px; border-radius: 6px; font-size: 15px; }
p.promote, p.pass { background: #dafbe1; border: 1px solid #1a7f37; }
p.reject, p.fail { background: #ffebe9; border: 1px solid #cf222e; }
p.not-promoted { background: #f6f8fa; border: 1px solid #8c959f; }
p.note { color: #59636e; }
pre.diff { font: 12px/1.35 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; background: #f6f8fa;
           padding: 8px; overflow-x: auto; border: 1px solid #d0d7de; border-radius: 6px; }
pre.diff span { display: block; white-space: pre; }
pre.diff .add { background: #dafbe1; } pre.diff .del { background: #ffebe9; } pre.diff .hunk { color: #0550ae; }
img.chart { max-width: 100%; border: 1px solid #d0d7de; border-radius: 6px; }
"""


def _inline_html(text: str) -> str:
    escaped = html.escape(text, quote=False)
    return _BOLD.sub(r"<strong>\1</strong>", _CODE.sub(r"<code>\1</code>", escaped))


def _html_table(t: Table) -> str:
    if not t.rows:
        return '<p class="note"><em>(none)</em></p>'
    head = "".join(f"<th>{_inline_html(h)}</th>" for h in t.headers)
    rows = []
    for i, row in enumerate(t.rows):
        cls = t.row_classes[i] if i < len(t.row_classes) and t.row_classes[i] else ""
        attr = f' class="{html.escape(cls)}"' if cls else ""
        rows.append(f"<tr{attr}>" + "".join(f"<td>{_inline_html(c or '-')}</td>" for c in row) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _diff_line_class(line: str) -> str:
    if line.startswith(("+++", "---")):
        return "file"
    return {"+": "add", "-": "del", "@": "hunk"}.get(line[:1], "ctx")


def _html_diff(d: Diff) -> str:
    if not d.text:
        return f"<p>{_inline_html(d.title)}: <em>no differences</em></p>"
    added, removed = diff_stats(d.text)
    lines = "".join(f'<span class="{_diff_line_class(ln)}">{html.escape(ln) or " "}</span>'
                    for ln in d.text.splitlines())  # fmt: skip
    return (f"<details open><summary>{_inline_html(d.title)} (+{added} -{removed} lines)</summary>"
            f'<pre class="diff">{lines}</pre></details>')  # fmt: skip


def render_html(blocks: Sequence[Block], title: str, charts: dict[str, bytes]) -> str:
    """One self-contained page. `charts` maps a Chart block's key to its PNG bytes."""
    body = []
    for b in blocks:
        if isinstance(b, Heading):
            anchor = f' id="{html.escape(b.anchor)}"' if b.anchor else ""
            body.append(f"<h{b.level}{anchor}>{_inline_html(b.text)}</h{b.level}>")
        elif isinstance(b, Para):
            cls = f' class="{html.escape(b.cls)}"' if b.cls else ""
            body.append(f"<p{cls}>{_inline_html(b.text)}</p>")
        elif isinstance(b, Bullets):
            cls = f' class="{html.escape(b.cls)}"' if b.cls else ""
            body.append(f"<ul{cls}>" + "".join(f"<li>{_inline_html(i)}</li>" for i in b.items) + "</ul>")
        elif isinstance(b, Table):
            body.append(_html_table(b))
        elif isinstance(b, Diff):
            body.append(_html_diff(b))
        elif isinstance(b, Chart):
            if b.key not in charts:
                raise ValueError(f"chart {b.key!r} has no PNG; charts given: {sorted(charts)}")
            data = base64.b64encode(charts[b.key]).decode()
            body.append(f'<p><img class="chart" alt="{html.escape(b.alt)}" src="data:image/png;base64,{data}"></p>')
        else:
            raise TypeError(f"unknown report block {type(b).__name__}")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")  # fmt: skip
