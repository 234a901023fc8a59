"""Documentation-only edits of a promoted kernel: the code hash, `harness rehash` on a git repository, what
the nightly, the optimized model's loader and `harness review` make of such an edit (CPU, no kernel runs)."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from harness import promote, promoted_source, review
from harness.candidates import code_differences, code_hash, content_hash
from harness.nightly_checks import TaskEvidence, assess
from harness.optimized_model import CandidateChoice, load_candidate_op
from harness.records import PROMOTIONS_FILE, EvaluationRecord, PromotionRecord, Status, Timing, append
from harness.regression import Thresholds
from harness.rehash import RehashError, RehashSettings, carried_promotions, main
from harness.report import Change, profile_section

KERNEL = '''"""output_gate, written out. Not yet run on a GPU."""

import torch

CANDIDATE = {"author": "human", "model": None, "parent": None, "idea": "the reference, written out"}
SCALE = 1.0  # the gate's scale


def output_gate(o_THD, g_THD, bias_H):
    """o * sigmoid(g + bias), FP32 math, one rounding."""
    gate = torch.sigmoid(g_THD.float() + bias_H.float()[None, :, None])  # FP32
    return (o_THD.float() * gate * SCALE).to(torch.bfloat16)
'''
PATH = "candidate_kernels/output_gate/written_out.py"


def _docs_edited(source: str) -> str:
    """The header and a comment rewritten, a line re-wrapped: the same code."""
    wrapped = "return (\n        o_THD.float() * gate * SCALE\n    )"
    return (source.replace("Not yet run on a GPU.", "On the H200: 1.19 us at T=1 (fifteenth session).\n\nMore.")
            .replace("# FP32", "# all in FP32, as BEAM.md says")
            .replace("return (o_THD.float() * gate * SCALE)", wrapped))  # fmt: skip


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
                          check=True, capture_output=True, text=True).stdout  # fmt: skip


@pytest.fixture
def repo(tmp_path) -> Path:
    """A git repository whose committed kernel is promoted (results/ inside it)."""
    root = tmp_path / "repo"
    (root / PATH).parent.mkdir(parents=True)
    (root / PATH).write_text(KERNEL)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "the promoted kernel")
    promotion = PromotionRecord(task="output_gate", action="promote", candidate="written_out", path=PATH,
                                content_hash=content_hash(KERNEL.encode()), run_id="run-gpu", evidence=["rec-1"],
                                reason="beats every baseline beyond noise on every shape; geomean 1.2x",
                                speedups={"T=1": {"reference": 9.0}},
                                environment={"device": "NVIDIA H200"})  # fmt: skip
    append(root / "results" / "output_gate" / PROMOTIONS_FILE, promotion)
    return root


def test_the_code_hash_ignores_docstrings_comments_and_layout_and_nothing_else():
    assert code_hash(_docs_edited(KERNEL).encode()) == code_hash(KERNEL.encode())
    for change in (("SCALE = 1.0", "SCALE = 1.5"), ("g_THD.float() +", "g_THD.float() -"),
                   ('"the reference, written out"}', '"the reference"}')):  # fmt: skip
        edited = KERNEL.replace(*change).encode()
        assert code_hash(edited) != code_hash(KERNEL.encode()), change
    assert code_differences(KERNEL.encode(), KERNEL.replace("SCALE = 1.0", "SCALE = 2.0").encode()) == ["SCALE"]
    body = KERNEL.replace("* SCALE)", "* SCALE * 2)").replace("SCALE = 1.0", "SCALE = 0.5").encode()
    assert code_differences(KERNEL.encode(), body) == ["SCALE", "output_gate"]
    assert code_differences(KERNEL.encode(), KERNEL.replace("SCALE = 1.0  # the gate's scale\n", "").encode()) == [
        "SCALE (removed)"
    ]
    with pytest.raises(SyntaxError):
        code_hash(b"def broken(:\n")


def test_rehash_moves_the_promotion_to_a_documentation_only_edit(repo):
    results = repo / "results"
    assert carried_promotions("output_gate", results, repo) == []  # the file holds the promoted bytes
    (repo / PATH).write_text(_docs_edited(KERNEL))
    before = promote.promoted("output_gate", results)
    assert "harness rehash task=output_gate" in promoted_source.loadable_problem(repo, before)
    (record,) = carried_promotions("output_gate", results, repo)
    assert record.content_hash == content_hash((repo / PATH).read_bytes())
    assert record.same_code_as == before.content_hash
    assert (record.evidence, record.speedups, record.environment, record.run_id) == (
        before.evidence, before.speedups, before.environment, before.run_id)  # fmt: skip
    assert record.reason.startswith(f"documentation-only edit of {before.content_hash[:12]}")
    assert record.reason.endswith("in run run-gpu: beats every baseline beyond noise on every shape; geomean 1.2x")
    append(results / "output_gate" / PROMOTIONS_FILE, record)
    after = promote.promoted("output_gate", results)
    assert after == record and promoted_source.loadable_problem(repo, after) is None
    op = load_candidate_op(CandidateChoice("output_gate", repo / PATH, after.content_hash, "promotion"))
    assert callable(op)

    # A second edit carries it again; the reason names the promotion the evidence was measured for, once.
    git(repo, "commit", "-q", "-am", "header")
    (repo / PATH).write_text(_docs_edited(KERNEL) + "# a last comment\n")
    (again,) = carried_promotions("output_gate", results, repo)
    assert again.same_code_as == record.content_hash and again.reason.count("documentation-only") == 1
    append(results / "output_gate" / PROMOTIONS_FILE, again)
    chain = promote.same_code_chain("output_gate", again, results)
    assert [r.content_hash for r in chain] == [again.content_hash, record.content_hash, before.content_hash]


def test_rehash_carries_the_promotion_of_every_gpu_that_has_the_file_in_force(repo):
    """Promotions are per GPU (harness/promote.py): where the H100 promoted the same file too, one edit of its
    header moves both, each with its own evidence; a GPU whose kernel in force is another file, unchanged, keeps
    its record, and one whose file cannot be carried stops the command before it appends anything."""
    results = repo / "results"
    h200 = promote.promoted("output_gate", results)
    h100 = dataclasses.replace(h200, run_id="run-h100", evidence=["rec-h100"], promotion_id="p-h100",
                               environment={"device": "NVIDIA H100 80GB HBM3"})  # fmt: skip
    other_bytes = KERNEL.replace("SCALE = 1.0", "SCALE = 2.0")
    other = dataclasses.replace(h200, candidate="other", path="candidate_kernels/output_gate/other.py",
                                content_hash=content_hash(other_bytes.encode()), promotion_id="p-b200",
                                environment={"device": "NVIDIA B200"})  # fmt: skip
    for record in (h100, other):
        append(results / "output_gate" / PROMOTIONS_FILE, record)
    (repo / other.path).write_text(other_bytes)
    (repo / PATH).write_text(_docs_edited(KERNEL))
    records = carried_promotions("output_gate", results, repo)
    assert [promote.gpu_of(r) for r in records] == ["NVIDIA H200", "NVIDIA H100 80GB HBM3"]
    (repo / other.path).write_text(other_bytes + "EXTRA = 1\n")
    with pytest.raises(RehashError, match="`candidate_kernels/output_gate/other.py` holds other bytes"):
        carried_promotions("output_gate", results, repo)
    for record in records:
        append(results / "output_gate" / PROMOTIONS_FILE, record)
    new_hash = content_hash((repo / PATH).read_bytes())
    for gpu, before in (("NVIDIA H200", h200), ("NVIDIA H100 80GB HBM3", h100)):
        carried = promote.promoted("output_gate", results, gpu)
        assert (carried.content_hash, carried.same_code_as, carried.evidence) == (
            new_hash, before.content_hash, before.evidence)  # fmt: skip
        assert promote.gpu_of(carried) == gpu
    assert promote.promoted("output_gate", results, "NVIDIA B200") == other


def test_rehash_refuses_a_code_change_naming_what_changed_and_says_why_else(repo, tmp_path, capsys):
    results = repo / "results"
    (repo / PATH).write_text(_docs_edited(KERNEL).replace("SCALE = 1.0", "SCALE = 1.5"))
    with pytest.raises(RehashError, match=r"changes code, not only docstrings or comments.*`SCALE`.*harness run"):
        carried_promotions("output_gate", results, repo)
    promotion = promote.promoted("output_gate", results)
    assert "harness rehash" not in promoted_source.loadable_problem(repo, promotion)
    (repo / PATH).write_text("def output_gate(:\n")
    with pytest.raises(RehashError, match="not valid Python"):
        carried_promotions("output_gate", results, repo)
    (repo / PATH).unlink()
    with pytest.raises(RehashError, match="does not exist"):
        carried_promotions("output_gate", results, repo)
    with pytest.raises(RehashError, match="has no promotion in force"):
        carried_promotions("dense_act", results, repo)
    elsewhere = tmp_path / "not_a_repo"  # the promoted bytes are in no git history
    (elsewhere / PATH).parent.mkdir(parents=True)
    (elsewhere / PATH).write_text(_docs_edited(KERNEL))
    with pytest.raises(RehashError, match="nothing to compare the code with"):
        carried_promotions("output_gate", results, elsewhere)
    assert main(RehashSettings(task="")) == 1 and "task is required" in capsys.readouterr().err
    assert main(RehashSettings(task="output_gate", results_dir=str(tmp_path / "none"))) == 1
    assert "has no promotion in force" in capsys.readouterr().err


def test_the_nightly_counts_the_timings_of_the_bytes_a_rehash_replaced_as_history():
    old, new = "a" * 64, "b" * 64

    def timed(run: str, digest: str, p50: float, when: str) -> EvaluationRecord:
        return EvaluationRecord(run_id=run, task="output_gate", implementation="written_out", kind="candidate",
                                shape_label="T=1", shape={"T": 1}, device="cuda", policy="gpu", seeds=[1],
                                status=Status.PASSED, detail="", environment={"device": "NVIDIA H200"},
                                candidate_hash=digest, candidate_path=PATH, parity={"y": {"passed": True}},
                                timing=Timing(p50 * 0.99, p50, p50 * 1.01, "cuda_graph", 40, 100), created_utc=when,
                                record_id=f"{run}-{digest[0]}")  # fmt: skip

    history = tuple(timed(f"h{i}", old, 2.0, f"2026-11-0{i + 1}T00:00:00+00:00") for i in range(4))
    now = (timed("new", new, 3.0, "2026-11-30T00:00:00+00:00"),)
    carried = PromotionRecord(task="output_gate", action="promote", candidate="written_out", path=PATH,
                              content_hash=new, run_id="h0", evidence=["x"], reason="docs", speedups={},
                              environment={}, same_code_as=old)  # fmt: skip
    blind = TaskEvidence("output_gate", now, carried, "written_out", "", None, "stays", history)
    assert not [f for f in assess(blind, Thresholds())[0] if f.kind == "regression"]  # no history by its own hash
    seeing = TaskEvidence("output_gate", now, carried, "written_out", "", None, "stays", history,
                          promoted_lineage=(new, old))  # fmt: skip
    (regression,) = [f for f in assess(seeing, Thresholds())[0] if f.kind == "regression"]
    assert regression.gating and regression.figures["n_history"] == 4


def test_review_says_what_an_edit_of_the_promoted_file_does_to_the_optimized_model(repo):
    promotion = promote.promoted("output_gate", repo / "results")
    (repo / PATH).write_text(_docs_edited(KERNEL))

    def note(text: str) -> str:
        (repo / PATH).write_text(text)
        cand = review.candidate_files.load(repo / PATH, "output_gate", "output_gate")
        change = Change("output_gate", PATH, "modified")
        return review._promoted_edit_note(change, review._promoted_relation(repo, change, cand, promotion))

    assert "documentation-only edit of the promoted kernel" in note(_docs_edited(KERNEL))
    assert "harness rehash task=output_gate" in note(_docs_edited(KERNEL))
    assert "edits the promoted kernel's code" in note(KERNEL.replace("SCALE = 1.0", "SCALE = 3.0"))
    assert note(KERNEL) == ""  # the promoted bytes themselves
    other = Change("output_gate", "candidate_kernels/output_gate/other.py", "added")
    assert review._promoted_relation(repo, other, None, promotion) == ""
    assert review._promoted_edit_note(other, "") == ""


def test_review_shows_the_kernel_profiles_of_the_same_code_for_a_documentation_only_edit(repo):
    results = repo / "results"
    promotion = promote.promoted("output_gate", results)
    edit = Change("output_gate", PATH, "modified")

    def same_code(text: str, promoted: PromotionRecord, change: Change = edit) -> tuple[str, ...]:
        (repo / PATH).write_text(text)
        cand = review.candidate_files.load(repo / PATH, "output_gate", "output_gate")
        change = dataclasses.replace(change, content_hash=cand.content_hash)
        return review._same_code_hashes(change, review._promoted_relation(repo, change, cand, promoted), promoted,
                                        results)  # fmt: skip

    assert same_code(KERNEL, promotion) == ()  # the promoted bytes: their own hash finds their profiles
    assert same_code(_docs_edited(KERNEL), promotion) == (promotion.content_hash,)  # not yet rehashed
    assert same_code(KERNEL.replace("SCALE = 1.0", "SCALE = 3.0"), promotion) == ()  # other code
    other = Change("output_gate", "candidate_kernels/output_gate/other.py", "added")
    assert same_code(_docs_edited(KERNEL), promotion, other) == ()  # not the promoted file
    (record,) = carried_promotions("output_gate", results, repo)
    append(results / "output_gate" / PROMOTIONS_FILE, record)
    carried = promote.promoted("output_gate", results)
    assert same_code(_docs_edited(KERNEL), carried) == (promotion.content_hash,)  # rehashed: through the chain

    # The report shows the other bytes' profile and says which bytes ran.
    profile = {"candidate_hash": promotion.content_hash, "shape_label": "T=1", "status": "profiled",
               "run_id": "p-1", "kernels": ["_gate"], "duration_us": 1.5, "created_utc": "2026-12-04"}  # fmt: skip
    (para, table) = profile_section([profile], "output_gate", "written_out", carried.content_hash)
    assert f"Profiled as `{promotion.content_hash[:12]}`: the same code as this file" in para.text
    assert table.rows[0][:4] == ("`T=1`", "profiled", "1", "1.50")
    (para, _) = profile_section([profile], "output_gate", "written_out", promotion.content_hash)
    assert "Profiled as" not in para.text


def test_a_review_of_a_documentation_only_edit_says_where_the_promoted_bytes_came_from(repo, tmp_path):
    """The promoted bytes are evaluated beside the edit, read from git history; the report says so, and the
    edit's own verdict says what merging it does (each note in its place, neither overwriting the other)."""
    (repo / PATH).write_text(_docs_edited(KERNEL))
    settings = review.ReviewSettings(candidates=(str(repo / PATH),), device="cpu", shapes=("tiny T=1",), seeds=(1,),
                                     results_dir=str(repo / "results"), repo_dir=str(repo), progress=False,
                                     cache_dir=str(tmp_path / "cache"))  # fmt: skip
    (task,) = review.run_review(settings, echo=lambda _: None).tasks
    assert task.promoted_note.startswith("The promoted kernel was read from"), task.promoted_note
    assert "documentation-only edit of the promoted kernel" in task.verdicts[PATH].reason
