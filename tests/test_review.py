"""`harness review`: verdicts and the gate from records, the report against a stored file, the page in a
real browser, and the command end to end on a git repository (CPU, planted candidates)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import goals, review
from harness.environment import REPO_ROOT
from harness.records import EvaluationRecord, PromotionRecord, Status, Timing
from harness.report import Change, Review, TaskReview, review_html, review_markdown
from tasks import get_task
from tests.conftest import working_tree_env

EXPECTED = Path(__file__).parent / "expected" / "review_fuse_norm.md"
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "fuse_norm"
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)

# ---- a review built from fixed records -------------------------------------------------------------------
ENV = {"device": "NVIDIA H200", "driver": "580.95.05", "cuda": "13.0", "torch": "2.11.0+cu130", "triton": "3.6.0",
       "flashinfer": "0.6.13", "python": "3.12.3", "host": "gpu-runner-1",
       "git_commit": "0123456789abcdef0123456789abcdef01234567", "git_dirty": False}  # fmt: skip
RUN, WHEN = "20261130T040000-abc123", "2026-11-30T04:00:00+00:00"
SHAPES = ("T=1", "T=16384")
HASHES = {"fast_rows": "f" * 64, "row_per_program": "b" * 64, "row_per_program@promoted": "a" * 64, "skipped": "c" * 64}
BASELINES_US = {"T=1": {"reference": 8.0, "torch_compile": 5.0, "flashinfer": 3.1},
                "T=16384": {"reference": 900.0, "torch_compile": 400.0, "flashinfer": 262.0}}  # fmt: skip
FLOOR_US = {"T=1": 0.01, "T=16384": 157.0}
PARITY = {"h_new_TD": {"passed": True, "reason": "", "calls": 3, "roundings": ["nearest"], "max_ulp": 1,
                       "n_elements": 15360, "n_mismatched": 3, "n_over_tolerance": 0, "max_abs_err": 0.0078125,
                       "fp64_err": 0.00171, "ref_fp64_err": 0.00171, "fp64_ratio": 1.0},
          "x_TD": {"passed": True, "reason": "", "calls": 3, "roundings": ["nearest"], "max_ulp": 0,
                   "n_elements": 15360, "n_mismatched": 0, "n_over_tolerance": 0, "max_abs_err": 0.0,
                   "fp64_err": 0.00244, "ref_fp64_err": 0.00244, "fp64_ratio": 1.0}}  # fmt: skip


def band(p50: float, noise: float = 0.04) -> Timing:
    return Timing(p50 * (1 - noise / 2), p50, p50 * (1 + noise / 2), "cuda_graph", 40, 100)


def record(name: str, shape: str, p50: float | None, kind: str = "candidate", **changes) -> EvaluationRecord:
    t = band(p50) if p50 is not None else None
    baselines = {b: {"p20_us": us * 0.98, "p50_us": us, "p80_us": us * 1.02} for b, us in BASELINES_US[shape].items()}
    fields = dict(
        run_id=RUN, task="fuse_norm", implementation=name, kind=kind, shape_label=shape,
        shape={"T": int(shape[2:]), "D": 5120}, device="cuda", policy="gpu", seeds=[1, 2, 3], status=Status.PASSED,
        detail="", environment=ENV, parity=PARITY if kind != "reference" else {}, timing=t,
        record_id=f"rec-{name}-{shape}", created_utc=WHEN, isolation={"audit_hook": "active", "uid_drop": "active"},
    )  # fmt: skip
    if kind == "candidate":
        fields.update(candidate_hash=HASHES[name], candidate_path=f"candidate_kernels/fuse_norm/{name}.py",
                      candidate_meta={"author": "human", "model": None, "parent": None, "idea": name})  # fmt: skip
        if t is not None:
            fields.update(baselines_us=baselines, speedups={b: v["p50_us"] / p50 for b, v in baselines.items()},
                          floor_us=FLOOR_US[shape], floor_fraction=FLOOR_US[shape] / p50, copy_gbps=4275.0,
                          gemm_tflops=750.0)  # fmt: skip
    fields.update(changes)
    return EvaluationRecord(**fields)


def fixed_records() -> list[EvaluationRecord]:
    rows = []
    for shape in SHAPES:
        big = shape == "T=16384"
        rows += [
            record("fast_rows", shape, 170.0 if big else 2.2),
            record("row_per_program", shape, 240.0 if big else 2.9),  # the promoted file, edited: slower
            record("row_per_program@promoted", shape, 200.0 if big else 2.4),
            record("reference", shape, BASELINES_US[shape]["reference"], kind="reference"),
            record("torch_compile", shape, BASELINES_US[shape]["torch_compile"], kind="torch_compile"),
        ]
        if big:
            rows.append(record("skipped", shape, 180.0))
        else:
            why = "12 elements differ by more than 1 ulp (max 15)"
            failing = {**PARITY, "x_TD": {**PARITY["x_TD"], "passed": False, "max_ulp": 15, "n_mismatched": 40,
                                          "n_over_tolerance": 12, "reason": f"call 1: {why}"}}  # fmt: skip
            rows.append(record("skipped", shape, None, status=Status.MISMATCH, parity=failing,
                               detail=f"x_TD: {why}",
                               timing_skipped="not timed: mismatch"))  # fmt: skip
    return rows


PROMOTED = PromotionRecord(
    task="fuse_norm", action="promote", candidate="row_per_program",
    path="candidate_kernels/fuse_norm/row_per_program.py",
    content_hash=HASHES["row_per_program@promoted"], run_id="20261101T000000-000000", evidence=["rec-old"],
    reason="beats every baseline beyond noise on every shape", speedups={}, environment=ENV,
    promotion_id="p-1", created_utc="2026-11-01T00:00:00+00:00",
)  # fmt: skip
DIFF = ("--- a/candidate_kernels/fuse_norm/row_per_program.py\n+++ b/candidate_kernels/fuse_norm/row_per_program.py\n"
        "@@ -1,3 +1,3 @@\n def norm_residual_norm(y_TD, h_TD, post_weight_D, pre_weight_D, n, eps):\n"
        "-    num_warps = 4\n+    num_warps = 8\n     return _launch(y_TD, h_TD, num_warps)")  # fmt: skip


def fixed_changes() -> tuple[Change, ...]:
    meta = {"author": "agent", "model": "claude-test", "parent": "row_per_program", "idea": "two rows per program"}
    return (
        Change("fuse_norm", "candidate_kernels/fuse_norm/broken_meta.py", "added", content_hash="d" * 64,
               contract_error="CANDIDATE keys must be exactly ['author', 'model', 'parent', 'idea']; missing ['idea']",
               diff_against="nothing (a new file)", diff="--- /dev/null\n+++ b/broken_meta.py\n@@ -0,0 +1 @@\n+x = 1",
               diff_note="A new file without a parent (CANDIDATE['parent'] is None): the whole file is shown."),
        Change("fuse_norm", "candidate_kernels/fuse_norm/fast_rows.py", "added", candidate="fast_rows",
               content_hash=HASHES["fast_rows"], meta=meta, diff_against="`row_per_program.py` (its parent) at `main`",
               diff=DIFF.replace("a/candidate_kernels/fuse_norm/row_per_program.py", "a/row_per_program")),
        Change("fuse_norm", "candidate_kernels/fuse_norm/old_rows.py", "deleted", diff_note="Deleted at `HEAD`."),
        Change("fuse_norm", "candidate_kernels/fuse_norm/row_per_program.py", "modified", candidate="row_per_program",
               content_hash=HASHES["row_per_program"], diff_against="`candidate_kernels/fuse_norm/row_per_program.py` "
               "at `main`", diff=DIFF),
        Change("fuse_norm", "candidate_kernels/fuse_norm/skipped.py", "added", candidate="skipped",
               content_hash=HASHES["skipped"], diff_against="nothing (a new file)",
               diff="--- /dev/null\n+++ b/candidate_kernels/fuse_norm/skipped.py\n@@ -0,0 +1 @@\n+# skips a rounding"),
    )  # fmt: skip


PROFILE = {"candidate_hash": HASHES["fast_rows"], "shape_label": "T=16384", "status": "profiled", "run_id": "prof-1",
           "kernels": [{"name": "_fused_kernel"}], "duration_us": 168.2, "dram_throughput_pct": 93.1,
           "l2_throughput_pct": 47.5, "l2_read_bytes": 352e6, "l1_hit_pct": 0.4, "achieved_occupancy_pct": 61.5,
           "registers_per_thread": 40, "spill_bytes": 0.0, "floor_fraction": 0.933,
           "issue_active_pct": 41.2, "xu_pipe_pct": 18.4, "fp64_pipe_pct": 9.0, "fma_pipe_pct": 22.7,
           "alu_pipe_pct": 15.1, "warp_cycles_per_issue": 13.4,
           "stalls": {"long_scoreboard": 9.6, "wait": 2.2, "not_selected": 0.7, "barrier": 0.3},
           "ncu_version": "2025.3.1", "ncu_options": "--cache-control all",
           "created_utc": WHEN}  # fmt: skip


def fixed_review() -> Review:
    changes, records = fixed_changes(), fixed_records()
    verdicts, reason = review.judge(changes, records, PROMOTED, "row_per_program@promoted", SHAPES)
    task = TaskReview("fuse_norm", changes, verdicts, tuple(records), RUN, PROMOTED, "row_per_program@promoted",
                      "The promoted kernel was read from `candidate_kernels/fuse_norm/row_per_program.py` at "
                      "`0123456789ab` (the file has changed since).", reason, (PROFILE,),
                      tuple(goals.side_by_side(get_task("fuse_norm"), records)))  # fmt: skip
    return Review("`main...HEAD` (`aaaaaaaaaa...bbbbbbbbbb`)", WHEN, (task,), review.gate_of([task]),
                  review.cheat_checks())  # fmt: skip


# ---- verdicts and the gate --------------------------------------------------------------------------------
def test_verdicts_promote_the_best_reject_what_fails_the_gate_and_say_why_the_rest_are_not_promoted():
    r = fixed_review()
    v = r.tasks[0].verdicts
    fast = v["candidate_kernels/fuse_norm/fast_rows.py"]
    assert fast.action == "promote" and fast.gate_ok and "geomean" in fast.reason
    edited = v["candidate_kernels/fuse_norm/row_per_program.py"]
    assert edited.action == "reject" and not edited.gate_ok
    assert edited.reason.startswith("regresses the promoted `row_per_program` it replaces on `T=1`")
    assert {s: c.verdict for s, c in edited.against_promoted.items()} == {"T=1": "regression", "T=16384": "regression"}
    skipped = v["candidate_kernels/fuse_norm/skipped.py"]
    assert not skipped.gate_ok and skipped.reason.startswith("mismatch on `T=1`: x_TD: 12 elements")
    assert skipped.action == "reject"
    deleted = v["candidate_kernels/fuse_norm/old_rows.py"]
    assert deleted.gate_ok and deleted.action == "not promoted"  # deleting a file nobody uses is fine
    assert not v["candidate_kernels/fuse_norm/broken_meta.py"].gate_ok
    assert not r.gate.ok and len(r.gate.reasons) == 3
    assert r.gate.line == f"review: FAIL: {r.gate.reasons[0]} (and 2 more, see the report)"


def test_an_edit_slower_than_the_promoted_version_says_where_their_autotuners_picked_differently():
    key = "(5120, 1, 'torch.bfloat16')"
    picks = {"row_per_program": "BLOCK: 256, num_warps: 8", "row_per_program@promoted": "BLOCK: 256, num_warps: 4"}
    records = [EvaluationRecord(**{**r.__dict__, "autotuned": {"_row_kernel": {key: picks[r.implementation]}}})
               if r.implementation in picks else r for r in fixed_records()]  # fmt: skip
    verdicts, _ = review.judge(fixed_changes(), records, PROMOTED, "row_per_program@promoted", SHAPES)
    edited = verdicts["candidate_kernels/fuse_norm/row_per_program.py"]
    assert edited.action == "reject" and edited.reason.startswith("regresses the promoted `row_per_program`")
    assert edited.reason.endswith(
        "(their autotuners picked differently, promoted -> challenger: `_row_kernel` (5120, 1): num_warps 4 -> 8)"
    )
    assert "autotuners" not in fixed_review().tasks[0].verdicts["candidate_kernels/fuse_norm/row_per_program.py"].reason


def test_a_verdict_rejects_exactly_what_fails_the_gate():
    from harness.report import Verdict

    path = "candidate_kernels/fuse_norm/x.py"
    assert Verdict(path, "mismatch", gate_ok=False).action == "reject"
    assert Verdict(path, "slower than torch_compile").action == "not promoted"
    assert Verdict(path, "geomean 2.0x", promoted=True).action == "promote"
    with pytest.raises(ValueError, match="a verdict failing the gate cannot promote"):
        Verdict(path, "mismatch", gate_ok=False, promoted=True)
    with pytest.raises(ValueError, match="a verdict must say why"):
        Verdict(path, "")
    assert Verdict(path, "why").css_class == "verdict not-promoted"


def test_deleting_the_promoted_kernel_fails_the_gate_and_a_same_speed_edit_does_not():
    gone = Change("fuse_norm", PROMOTED.path, "deleted")
    verdicts, _ = review.judge((gone,), [], PROMOTED, None, SHAPES)
    assert not verdicts[PROMOTED.path].gate_ok and "deletes the promoted kernel" in verdicts[PROMOTED.path].reason
    same = [r for r in fixed_records() if r.implementation != "row_per_program"]
    same += [record("row_per_program", s, 202.0 if s == "T=16384" else 2.41) for s in SHAPES]  # within noise
    edit = next(c for c in fixed_changes() if c.kind == "modified")
    verdicts, _ = review.judge((edit,), same, PROMOTED, "row_per_program@promoted", SHAPES)
    assert verdicts[edit.path].gate_ok
    assert {c.verdict for c in verdicts[edit.path].against_promoted.values()} == {"steady"}
    verdicts, _ = review.judge((edit,), same, PROMOTED, None, SHAPES)  # the promoted bytes were not found
    assert verdicts[edit.path].gate_ok and verdicts[edit.path].reason.endswith("so no regression check ran")


def test_the_regression_threshold_of_a_review_is_its_max_regression_pct_setting():
    """An edit of the promoted kernel 3% slower, bands apart: steady at the default 5%, a regression at 2%."""
    slower = [r for r in fixed_records() if r.implementation != "row_per_program"]
    slower += [record("row_per_program", s, p50, timing=band(p50, 0.01))
               for s, p50 in (("T=1", 2.4 * 1.03), ("T=16384", 200.0 * 1.03))]  # fmt: skip
    slower = [r if r.implementation != "row_per_program@promoted" else EvaluationRecord(**{**r.__dict__,
              "timing": band(r.timing.p50_us, 0.01)}) for r in slower]  # fmt: skip
    edit = next(c for c in fixed_changes() if c.kind == "modified")
    verdicts, _ = review.judge((edit,), slower, PROMOTED, "row_per_program@promoted", SHAPES)
    assert {c.verdict for c in verdicts[edit.path].against_promoted.values()} == {"steady"}
    verdicts, _ = review.judge((edit,), slower, PROMOTED, "row_per_program@promoted", SHAPES, max_regression_pct=2.0)
    assert {c.verdict for c in verdicts[edit.path].against_promoted.values()} == {"regression"}
    assert not verdicts[edit.path].gate_ok


def test_the_markdown_report_matches_the_stored_file():
    text = review_markdown(fixed_review())
    if os.environ.get("BEAM_REGENERATE_EXPECTED"):
        EXPECTED.write_text(text)
    assert text == EXPECTED.read_text(), f"regenerate with BEAM_REGENERATE_EXPECTED=1 and review {EXPECTED}"


def test_a_report_too_long_for_a_pr_comment_drops_its_diffs_then_is_cut():
    r = fixed_review()
    full = review_markdown(r)
    slim = review_markdown(r, max_chars=len(full) - 1)
    assert "```diff" not in slim
    assert "diff against `row_per_program.py` (its parent) at `main`: in the HTML report" in slim
    cut = review_markdown(r, max_chars=2000)
    assert len(cut) <= 2000 and cut.endswith("the whole report is in review.html._\n")


def test_the_report_carries_every_section():
    text = review_markdown(fixed_review())
    for needle in ("**Gate: FAIL**", "**Verdict: PROMOTE**", "#### Parity",
                   "| `T=1` | **mismatch** | `x_TD` | **no** | 15 |",
                   "`fast_rows` (candidate)", "| flashinfer |", "row_per_program@promoted (promoted)",
                   "#### Cheat checks", "`fallback_to_reference`", "Nsight Compute 2025.3.1", "| 168.20 |",
                   "| 41.2 | fma 23 xu 18 alu 15 fp64 9 | long_scoreboard 9.6 wait 2.2 not_selected 0.7 of 13.4 |",
                   "```diff", "+    num_warps = 8", "## Environment", "| torch | 2.11.0+cu130 |",
                   "#### Goals in this run (tasks/fuse_norm.py)",
                   "| `T=16384` | p50 <= 165 us | 170.00 us, missed by 5.00 (3.0%) | 240.00 us, missed"):  # fmt: skip
        assert needle in text, needle


def test_a_review_of_nothing_evaluated_says_so_where_the_environment_would_be():
    text = review_markdown(dataclasses.replace(fixed_review(), tasks=()))
    assert text.split("## Environment\n", 1)[1].lstrip().startswith("Nothing was evaluated.\n"), text
    assert "| torch |" not in text


def test_an_edit_says_which_definitions_it_changed():
    edit = Change("fuse_norm", "candidate_kernels/fuse_norm/k.py", "modified", code_changes=("_kernel", "CONFIGS"))
    assert edit.kind_text == "modified (code of `_kernel`, `CONFIGS`)"
    many = dataclasses.replace(edit, kind="renamed", code_changes=("a", "b", "c", "d", "e"))
    assert many.kind_text == "renamed (code of `a`, `b`, `c` and 2 more)"
    assert dataclasses.replace(edit, code_changes=()).kind_text == "modified (documentation only)"
    assert dataclasses.replace(edit, kind="added", code_changes=None).kind_text == "added"


def test_a_file_shows_the_profiles_of_its_code_under_earlier_bytes_and_says_so():
    r = fixed_review()
    t = r.tasks[0]
    earlier = dict(PROFILE, candidate_hash="e" * 64)  # fast_rows' code before a documentation-only edit

    def markdown(changes: tuple[Change, ...]) -> str:
        return review_markdown(dataclasses.replace(r, tasks=(dataclasses.replace(t, changes=changes,
                                                                                 profiles=(earlier,)),)))  # fmt: skip

    assert "| 168.20 |" not in markdown(t.changes)  # another file's profile is not this one's
    same = tuple(dataclasses.replace(c, same_code_hashes=("e" * 64,)) if c.candidate == "fast_rows" else c
                 for c in t.changes)  # fmt: skip
    text = markdown(same)
    assert "| 168.20 |" in text and "Profiled as `eeeeeeeeeeee`: the same code as this file" in text


def test_the_autotuners_choices_are_shown_without_dtypes_and_defaults():
    from harness.report import autotuned_lines

    dtypes = ", ".join(["'torch.bfloat16'"] * 6)
    tuned = {
        "_fuse_norm_kernel": {
            f"(5120, 16384, {dtypes})": "num_warps: 8, num_ctas: 1, num_stages: 3, maxnreg: 64",
            f"(5120, 1, {dtypes})": "num_warps: 4, num_ctas: 1, num_stages: 3, maxnreg: None",
        }
    }
    rows = [r for r in fixed_records() if r.implementation == "fast_rows"]
    assert autotuned_lines(rows) == []
    rows = [EvaluationRecord(**{**r.__dict__, "autotuned": tuned}) for r in rows]
    assert autotuned_lines(rows) == [
        "`_fuse_norm_kernel` (5120, 1): num_warps: 4, num_stages: 3",
        "`_fuse_norm_kernel` (5120, 16384): num_warps: 8, num_stages: 3, maxnreg: 64",
    ]


# ---- the page, in a real browser --------------------------------------------------------------------------
def chromium(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    if CHROMIUM is None:
        if os.environ.get("CI") or (shutil.which("apt-get") and os.geteuid() == 0):
            pytest.fail("chromium is missing but can be installed here: run .ci/setup.sh (apt-get install chromium)")
        pytest.skip("chromium is not installed and cannot be here (no apt-get as root); .ci/setup.sh installs it")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run",
             f"--user-data-dir={tmp / 'profile'}"]  # fmt: skip
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=120)


def test_the_html_page_renders_in_headless_chromium(tmp_path):
    page = tmp_path / "review.html"
    page.write_text(review_html(fixed_review()))
    dom = chromium("--dump-dom", page.as_uri(), tmp=tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert "<strong>Gate: FAIL</strong>" in html and "<strong>Verdict: PROMOTE</strong>" in html
    assert '<p class="verdict reject">' in html and '<p class="verdict not-promoted">' in html
    assert html.count("<table>") >= 8
    assert "<th>candidate speedup</th>" in html and '<span class="add">+    num_warps = 8</span>' in html
    chart = '<img class="chart" alt="speedup of fuse_norm candidates over each baseline" src="data:image/png;base64,'
    assert chart in html
    shot = tmp_path / "shot.png"
    result = chromium(f"--screenshot={shot}", "--window-size=1280,2400", page.as_uri(), tmp=tmp_path)
    assert result.returncode == 0 and shot.stat().st_size > 10_000, result.stderr[-2000:]
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.shape[:2] == (2400, 1280)
    assert pixels.std() > 0.05  # not a blank page
    red_row = ((abs(pixels[..., 0] - 0xFF / 255) < 0.02) & (abs(pixels[..., 1] - 0xEB / 255) < 0.02)
               & (abs(pixels[..., 2] - 0xE9 / 255) < 0.02))  # fmt: skip
    assert red_row.sum() > 1000  # the failing rows' background: the CSS applied


# ---- the command, end to end on a git repository ----------------------------------------------------------
def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
                          check=True, capture_output=True, text=True).stdout  # fmt: skip


@pytest.fixture
def repo(tmp_path):
    """main: one correct candidate and one to delete; HEAD: it edited, a broken one added, one deleted."""
    root = tmp_path / "repo"
    folder = root / "candidate_kernels" / "fuse_norm"
    folder.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    shutil.copy(FIXTURES / "correct.py", folder / "base_kernel.py")
    shutil.copy(FIXTURES / "correct.py", folder / "old_rows.py")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base")
    git(root, "checkout", "-q", "-b", "feature")
    (folder / "base_kernel.py").write_text((FIXTURES / "correct.py").read_text() + "\n# retuned\n")
    broken = (FIXTURES / "skipped_rounding.py").read_text().replace('"parent": None', '"parent": "base_kernel"')
    assert '"parent": "base_kernel"' in broken
    (folder / "broken.py").write_text(broken)
    (folder / "old_rows.py").unlink()
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "head")
    return root


def test_review_of_a_revision_range_fails_the_gate_on_the_broken_candidate(repo, tmp_path):
    env = working_tree_env()
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "harness", "review", "base=main", "head=HEAD", f"repo_dir={repo}", "device=cpu",
         "shapes=['tiny T=1']", "seeds=[1]", f"results_dir={tmp_path / 'results'}", f"out_dir={out}",
         "progress=false"], capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("review: FAIL: fuse_norm/broken: mismatch on `tiny T=1`"), result.stdout
    assert "fuse_norm/base_kernel, modified (documentation only): not promoted [gate pass]" in result.stdout
    assert "fuse_norm/old_rows, deleted: not promoted [gate pass]" in result.stdout
    md = (out / "review.md").read_text()
    assert "diff against <code>candidate_kernels/fuse_norm/base_kernel.py</code> at <code>main</code>" in md
    assert (
        "+# retuned" in md
        and "### `base_kernel`: modified `candidate_kernels/fuse_norm/base_kernel.py` (documentation only)" in md
    )
    assert "diff against <code>base_kernel.py</code> (its parent) at <code>main</code>" in md  # added: vs its parent
    assert "**None fired** on any shape" in md and "`tiny T=1` | **mismatch**" in md
    assert (out / "review.html").read_text().startswith("<!DOCTYPE html>")


def test_review_of_given_files_passes_and_bad_input_is_refused(repo, tmp_path, capsys):
    settings = dict(device="cpu", shapes=("tiny T=1",), seeds=(1,), results_dir=str(tmp_path / "results"),
                    progress=False, repo_dir=str(repo), out_dir=str(tmp_path / "out"))  # fmt: skip
    code = review.main(review.ReviewSettings(candidates=(str(FIXTURES / "correct.py"),), **settings))
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and out[-1] == "review: PASS: every changed candidate passes and none regresses a promoted kernel"
    assert any("not promotable without GPU timings" in line for line in out)
    edited = repo / "candidate_kernels" / "fuse_norm" / "base_kernel.py"  # a working-tree edit, against HEAD
    edited.write_text(edited.read_text().replace("keepdim=True) + eps)", "keepdim=True) + eps * 1.0)"))
    assert review.main(review.ReviewSettings(candidates=(str(edited),), **settings)) == 0
    assert (
        "fuse_norm/base_kernel, given (code of `norm_residual_norm`): not promoted [gate pass]"
        in capsys.readouterr().out
    )
    assert review.main(review.ReviewSettings(base="HEAD", head="HEAD", **settings)) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("review: PASS: no candidate file changed")
    assert review.main(review.ReviewSettings(base="no-such-branch", **settings)) == 1
    err = capsys.readouterr().err
    assert "revision 'no-such-branch' is not a commit of the repository at" in err
    assert review.main(review.ReviewSettings(candidates=(str(tmp_path / "nope.py"),), **settings)) == 1
    assert "does not exist" in capsys.readouterr().err


# ---- on the GPU: timings, the table against the baselines, the chart ---------------------------------------
@pytest.mark.gpu
def test_on_the_gpu_a_review_times_the_candidate_and_draws_the_chart(tmp_path, capsys):
    settings = review.ReviewSettings(
        candidates=(str(REPO_ROOT / "candidate_kernels" / "fuse_norm" / "row_per_program.py"),), device="cuda",
        shapes=("T=1", "T=16384"), seeds=(1,), baselines=False, results_dir=str(tmp_path / "results"),
        out_dir=str(tmp_path / "out"), progress=False,
    )  # fmt: skip
    assert review.main(settings) == 0, capsys.readouterr().out  # parity passes; promotion needs every shape
    md = (tmp_path / "out" / "review.md").read_text()
    assert "| `T=1` | `row_per_program` (candidate) |" in md and "| `T=16384` | reference |" in md
    (candidate_row,) = [line for line in md.splitlines() if line.startswith("| `T=1` | `row_per_program` (cand")]
    assert "| launches |" in md and "| 1 kernel |" in candidate_row, candidate_row  # counted in its child
    assert "_Speedup chart (p50 ratio, whiskers: p20..p80 bands): in the HTML report._" in md
    assert "data:image/png;base64," in (tmp_path / "out" / "review.html").read_text()
