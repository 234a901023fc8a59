"""Where a record says it ran: the commit of the tree that ran, from git or from the shipper."""

from __future__ import annotations

import subprocess

from harness import environment
from harness.environment import REPO_ROOT


def test_the_commit_comes_from_git_where_the_shipper_names_none(monkeypatch):
    monkeypatch.delenv("BEAM_GIT_COMMIT", raising=False)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    commit, dirty = environment._commit()
    assert commit == head.stdout.strip()
    assert isinstance(dirty, bool)


def test_a_shipped_commit_wins_over_the_copys_own_git(monkeypatch):
    # The GPU machine's copy of the working tree may carry a .git older than the tree; the commit
    # the shipper names is the one that ran, and whether its copy was dirty is unknown.
    monkeypatch.setenv("BEAM_GIT_COMMIT", " c33a88d78a96b731ec63a601866594e521fbd9de\n")
    assert environment._commit() == ("c33a88d78a96b731ec63a601866594e521fbd9de", None)


def test_a_tree_without_git_and_without_a_shipped_commit_names_none(monkeypatch):
    monkeypatch.delenv("BEAM_GIT_COMMIT", raising=False)
    monkeypatch.setattr(environment, "_git", lambda *args: None)
    assert environment._commit() == (None, None)
