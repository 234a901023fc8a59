"""Agents, offline: a scripted Messages API server on 127.0.0.1 drives agent=anthropic through several
rounds (real Triton kernels, a wrong one then a right one, through the interpreter), a stand-in CLI
drives agent=command, a saved transcript is replayed, and the prompt, budget, retries and file
handling are checked on their own."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from harness import candidates as candidate_files
from harness import cli, run_cmd
from harness.agents import context, loop, submissions, tools
from harness.agents.anthropic_agent import RetryPolicy, retry_after_s
from harness.agents.budget import Budget, Price, Usage, price_of
from harness.agents.loop import AgentError
from harness.agents.prompt import SYSTEM_PROMPT
from harness.agents.settings import AgentSettings
from harness.environment import REPO_ROOT
from harness.records import RECORDS_FILE, EvaluationRecord, read
from tasks import get_task

FIXTURES = REPO_ROOT / "tests" / "fixtures"
AGENT_FIXTURES = FIXTURES / "agents"
SHAPE = "tiny T=1"
MODEL = "claude-sonnet-4-6"  # $3 in, $15 out, $3.75 cache write, $0.30 cache read per MTok
TASK = get_task("fuse_norm")


# ---- a Messages API that follows a script ----------------------------------------------------------
def _message(content: list[dict[str, Any]], usage: tuple[int, int, int, int], stop: str) -> dict[str, Any]:
    i, o, cw, cr = usage
    return {"id": "msg_scripted", "type": "message", "role": "assistant", "model": MODEL, "content": content,
            "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": i, "output_tokens": o, "cache_creation_input_tokens": cw,
                      "cache_read_input_tokens": cr}}  # fmt: skip


class ScriptedAPI:
    """Answers each POST /v1/messages with the next entry of `script`: (status, headers, body) or a
    function of the request body returning one. Records every request it saw."""

    def __init__(self, script: list):
        self.script, self.requests = list(script), []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                api.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                entry = api.script.pop(0)
                status, headers, payload = entry(body) if callable(entry) else entry
                data = json.dumps(payload).encode()
                self.send_response(status)
                for k, v in {**headers, "content-type": "application/json", "content-length": str(len(data))}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def _error(status: int, kind: str, headers: dict[str, str] | None = None):
    return status, headers or {}, {"type": "error", "error": {"type": kind, "message": f"scripted {kind}"}}


def _tool_result_text(body: dict[str, Any], tool_use_id: str) -> dict[str, Any]:
    for block in body["messages"][-1]["content"]:
        if block.get("type") == "tool_result" and block["tool_use_id"] == tool_use_id:
            return block
    raise AssertionError(f"no tool_result for {tool_use_id} in the last message")


WRONG = (AGENT_FIXTURES / "wrong_kernel.py").read_text()
RIGHT = (AGENT_FIXTURES / "right_kernel.py").read_text()
BROKEN = RIGHT.replace("1.0 / tl.sqrt(", "1.0 / tl.sqrtt(")  # no such function: fails when the kernel runs
assert BROKEN != RIGHT
USAGES = [(4000, 100, 3500, 0), (200, 900, 1200, 3500), (300, 1100, 1500, 4700), (250, 40, 0, 6200)]
# By hand, at $3 / $15 / $3.75 / $0.30 per MTok: 26625 + 19650 + 24435 + 3210 micro-dollars.
EXPECTED_USD = 0.07392
EXPECTED_TOKENS = 27490


def _second_submission(body):
    first = json.loads(_tool_result_text(body, "toolu_02")["content"])
    calls = [
        {"type": "tool_use", "id": "toolu_03", "name": "submit_candidate",
         "input": {"source": RIGHT, "idea": "depth-scaled residual restored: h*a + post*b, each product in FP32",
                   "parent": first["candidate"]}},
        {"type": "tool_use", "id": "toolu_04", "name": "list_files", "input": {"path": ".git"}},
        {"type": "tool_use", "id": "toolu_05", "name": "benchmark", "input": {"candidate": first["candidate"]}},
    ]  # fmt: skip
    return 200, {}, _message(calls, USAGES[2], "tool_use")


SCRIPT = [
    _error(429, "rate_limit_error", {"retry-after": "0.2"}),
    (200, {}, _message([{"type": "text", "text": "Reading the reference first."},
                        {"type": "tool_use", "id": "toolu_01", "name": "read_file",
                         "input": {"path": "reference_model/ops.py", "limit": 40}}], USAGES[0], "tool_use")),
    _error(529, "overloaded_error"),
    (200, {}, _message([{"type": "tool_use", "id": "toolu_06", "name": "check_parity", "input": {"source": BROKEN}},
                        {"type": "tool_use", "id": "toolu_02", "name": "submit_candidate",
                         "input": {"source": WRONG, "idea": "one program per row, both norms in registers"}}],
                       USAGES[1], "tool_use")),
    _second_submission,
    (200, {}, _message([{"type": "text", "text": "The second candidate passes; done."}], USAGES[3], "end_turn")),
]  # fmt: skip


def _settings(tmp: Path, agent: AgentSettings, **overrides) -> run_cmd.RunSettings:
    values = dict(task="fuse_norm", device="cpu", shapes=(SHAPE,), seeds=(1,), results_dir=str(tmp / "results"),
                  cache_dir=str(tmp / "cache"), progress=False, agent=agent)  # fmt: skip
    return run_cmd.RunSettings(**{**values, **overrides})


@pytest.fixture(scope="module")
def api_session(tmp_path_factory):
    """`harness run task=fuse_norm agent=anthropic ...` end to end against the scripted API."""
    pytest.importorskip("anthropic")  # not installed on the GPU machine
    tmp = tmp_path_factory.mktemp("anthropic")
    api = ScriptedAPI(SCRIPT)
    agent = AgentSettings(kind="anthropic", model=MODEL, rounds=3, base_url=api.url, backoff_s=0.01, backoff_max_s=5,
                          candidates_dir=str(tmp / "candidates"))  # fmt: skip
    settings = _settings(tmp, agent, candidates=("row_per_program",))
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setenv("ANTHROPIC_API_KEY", "test")
        code = run_cmd.run(settings)
    api.close()
    (path,) = (tmp / "results" / "fuse_norm" / loop.AGENTS_DIR).glob("*.json")
    return {"code": code, "out": out.getvalue(), "api": api, "transcript": json.loads(path.read_text()),
            "path": path, "tmp": tmp, "settings": settings}  # fmt: skip


def test_the_api_conversation_ran_every_scripted_turn(api_session):
    assert api_session["code"] == 0, api_session["out"]
    requests = api_session["api"].requests
    assert len(requests) == len(SCRIPT) and not api_session["api"].script
    assert all(r["path"] == "/v1/messages" and r["headers"]["Authorization"] == "Bearer test" for r in requests)
    assert requests[0]["body"] == requests[1]["body"] and requests[2]["body"] == requests[3]["body"]  # retries resend
    t = api_session["transcript"]
    assert t["stopped"] == "the model ended the conversation (stop_reason end_turn)" and t["error"] is None
    assert [m["role"] for m in t["messages"]] == ["user", "assistant"] * 4
    assert t["messages"][1]["content"][1] == {"type": "tool_use", "id": "toolu_01", "name": "read_file",
                                              "input": {"path": "reference_model/ops.py", "limit": 40}}  # fmt: skip


def test_the_stable_prompt_part_carries_cache_control(api_session):
    for request in api_session["api"].requests:
        body = request["body"]
        assert body["model"] == MODEL and body["system"][0]["text"] == SYSTEM_PROMPT
        assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
        assert [t["name"] for t in body["tools"]] == list(tools.TOOL_NAMES)
        assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
        statement = body["messages"][0]["content"][0]
        assert statement["text"].startswith("# Task `fuse_norm`")
        assert statement["cache_control"] == {"type": "ephemeral"}
        assert json.dumps(body).count('"cache_control"') <= 4  # the API's limit of breakpoints
    assert api_session["transcript"]["prompt"]["statement"] == statement["text"]


def test_retries_honour_retry_after_and_back_off_and_are_logged(api_session):
    calls = api_session["transcript"]["api_calls"]
    assert len(calls) == 4
    (rate_limited,) = calls[0]["retries"]
    assert rate_limited["status"] == 429 and rate_limited["retry_after_s"] == 0.2 and rate_limited["delay_s"] >= 0.2
    (overloaded,) = calls[1]["retries"]
    assert overloaded["status"] == 529 and overloaded["retry_after_s"] is None and 0 <= overloaded["delay_s"] <= 0.01
    assert calls[2]["retries"] == [] and calls[3]["retries"] == []
    assert "HTTP 429" in api_session["out"] and "HTTP 529" in api_session["out"]


def test_the_budget_is_the_cost_of_the_usage(api_session):
    t = api_session["transcript"]
    budget = t["budget"]
    assert budget["usage"]["total"] == EXPECTED_TOKENS and budget["turns_used"] == 4 and budget["rounds_used"] == 2
    assert budget["usage"]["cache_read_tokens"] == 3500 + 4700 + 6200
    assert budget["spent_usd"] == pytest.approx(EXPECTED_USD, abs=1e-9)
    assert [c["cost_usd"] for c in t["api_calls"]] == pytest.approx([0.026625, 0.01965, 0.024435, 0.00321])


def test_verdicts_went_back_as_tool_results(api_session):
    requests = [r["body"] for r in api_session["api"].requests]
    read = _tool_result_text(requests[2], "toolu_01")
    assert read["is_error"] is False and read["content"].startswith("reference_model/ops.py (lines 1-40 of")
    wrong = json.loads(_tool_result_text(requests[4], "toolu_02")["content"])
    assert wrong["passed"] is False and wrong["round"] == 1 and wrong["rounds_left"] == 2
    (shape,) = wrong["shapes"]
    assert shape["shape"] == SHAPE and shape["status"] == "mismatch" and shape["parity"]["h_new_TD"]["max_ulp"] > 1
    assert shape["timing"] == "not timed: mismatch"
    right = json.loads(_tool_result_text(requests[5], "toolu_03")["content"])
    assert right["passed"] is True and right["shapes"][0]["status"] == "passed" and right["round"] == 2
    assert "no CUDA GPU" in right["shapes"][0]["timing"] and right["summary"].startswith("passed parity on all 1")
    refused = _tool_result_text(requests[5], "toolu_04")
    assert refused["is_error"] is True and "'.git' is never shown" in refused["content"]
    no_gpu = _tool_result_text(requests[5], "toolu_05")
    assert no_gpu["is_error"] is True and no_gpu["content"].startswith("no GPU here")


def test_a_parity_check_returns_the_error_text_and_spends_no_round(api_session):
    check = json.loads(_tool_result_text(api_session["api"].requests[4]["body"], "toolu_06")["content"])
    assert check["passed"] is False and check["shapes"][0]["status"] == "runtime_error"
    assert "sqrtt" in check["shapes"][0]["detail"] and any("sqrtt" in log for log in check["log"])
    assert check["note"] == "parity check only: nothing recorded, no round spent" and check["candidate"] is None
    (saved,) = api_session["transcript"]["checks"]
    assert saved["source"] == BROKEN and saved["shapes"] == [SHAPE]


def test_submissions_are_candidate_files_with_metadata_and_records(api_session):
    t, tmp = api_session["transcript"], api_session["tmp"]
    first, second = t["submissions"]
    files = sorted((tmp / "candidates").iterdir())
    assert [f.name for f in files] == [f"{first['name']}.py", f"{second['name']}.py"]  # no temporary files left
    assert first["name"].startswith("agent_r01_") and second["name"].startswith("agent_r02_")
    one, two = (candidate_files.load(f, "fuse_norm", TASK.op_name) for f in files)
    assert one.meta.to_dict() == {"author": "agent", "model": MODEL, "parent": None,
                                  "idea": "one program per row, both norms in registers"}  # fmt: skip
    assert two.meta.parent == one.name and two.content_hash == second["content_hash"]
    assert two.name.endswith(two.content_hash[:12]) and "round 2 of a `harness run" in files[1].read_text()
    assert first["source"] == WRONG and second["source"] == RIGHT
    records, _ = read(tmp / "results" / "fuse_norm" / RECORDS_FILE, EvaluationRecord)
    by_run: dict[str, dict[str, str]] = {}
    for r in records:
        by_run.setdefault(r.run_id, {})[r.implementation] = r.status.value
    assert by_run[first["verdict"]["run_id"]] == {one.name: "mismatch"}
    assert by_run[second["verdict"]["run_id"]] == {two.name: "passed"}
    (final,) = [v for k, v in by_run.items() if k not in (first["verdict"]["run_id"], second["verdict"]["run_id"])]
    assert final == {"row_per_program": "passed", two.name: "passed"}  # the usual evaluation: the passing one joins
    assert "2 submission(s), 1 passed every shape" in api_session["out"]


def test_replaying_the_transcript_yields_the_same_submissions(api_session, tmp_path):
    original = api_session["transcript"]
    agent = AgentSettings(kind="replay", transcript=str(api_session["path"]), workers=2,
                          candidates_dir=str(tmp_path / "candidates"))  # fmt: skip
    settings = _settings(tmp_path, agent)
    outcome = loop.run_agent(TASK, settings, echo=lambda _: None)
    assert outcome.error is None
    assert [(c.name, c.content_hash) for c in outcome.candidates] == [
        (s["name"], s["content_hash"]) for s in original["submissions"]
    ]
    replay = json.loads(outcome.transcript_path.read_text())
    assert replay["replay"]["agree"] == 2 and all(c["agree"] for c in replay["replay"]["comparisons"])
    assert [s["verdict"]["passed"] for s in replay["submissions"]] == [False, True]
    assert replay["replay_of"]["session_id"] == original["session_id"]


def test_the_session_stops_when_its_rounds_are_spent(tmp_path, monkeypatch):
    pytest.importorskip("anthropic")
    both = [{"type": "tool_use", "id": f"toolu_{i}", "name": "submit_candidate",
             "input": {"source": RIGHT, "idea": f"attempt {i}"}} for i in (1, 2)]  # fmt: skip
    api = ScriptedAPI([(200, {}, _message(both, (100, 10, 0, 0), "tool_use"))])
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
    agent = AgentSettings(kind="anthropic", model=MODEL, rounds=1, base_url=api.url,
                          candidates_dir=str(tmp_path / "candidates"))  # fmt: skip
    outcome = loop.run_agent(TASK, _settings(tmp_path, agent), echo=lambda _: None)
    api.close()
    assert len(api.requests) == 1 and outcome.stopped == "round budget spent (1 of 1 rounds)"
    assert [c.meta.idea for c in outcome.candidates] == ["attempt 1"]
    last = json.loads(outcome.transcript_path.read_text())["messages"][-1]  # kept, though never sent
    assert [r["is_error"] for r in last["content"]] == [False, True]
    assert last["content"][1]["content"] == "round budget spent (1 rounds): no more submissions"


@pytest.mark.parametrize(
    ("script", "expected"),
    [([_error(401, "authentication_error")], "the Messages API refused the request (401)"),
     ([_error(529, "overloaded_error"), _error(529, "overloaded_error")], "failed 2 times; last: HTTP 529")],
)  # fmt: skip
def test_an_api_that_refuses_or_keeps_failing_ends_the_session_with_its_transcript(tmp_path, monkeypatch, script,
                                                                                    expected):  # fmt: skip
    pytest.importorskip("anthropic")
    api = ScriptedAPI(script)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test")
    agent = AgentSettings(kind="anthropic", model=MODEL, retries=1, backoff_s=0.01, base_url=api.url,
                          candidates_dir=str(tmp_path / "candidates"))  # fmt: skip
    outcome = loop.run_agent(TASK, _settings(tmp_path, agent), echo=lambda _: None)
    api.close()
    assert outcome.stopped == "error" and expected in outcome.error and outcome.candidates == ()
    saved = json.loads(outcome.transcript_path.read_text())
    assert saved["error"] == outcome.error and saved["api_calls"][0]["error"] == outcome.error
    assert len(saved["api_calls"][0]["retries"]) == len(script) - 1 and not (tmp_path / "candidates").exists()


def test_no_api_key_is_a_clear_error_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    agent = AgentSettings(kind="anthropic", model=MODEL, candidates_dir=str(tmp_path / "candidates"))
    assert run_cmd.run(_settings(tmp_path, agent)) == 1
    assert "needs an API key in $ANTHROPIC_API_KEY, which is not set" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


# ---- agent=command with a stand-in CLI --------------------------------------------------------------
@pytest.fixture(scope="module")
def command_session(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("command")
    repo = tmp / "repo"
    repo.mkdir()
    (repo / "README.md").write_text("the project\n")
    (repo / "harness.py").write_text("print('harness')\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "README.md", "harness.py"], check=True)
    cmd = (f"{sys.executable} {AGENT_FIXTURES / 'fake_cli.py'} --prompt {{prompt_file}} --out {{candidate_path}} "
           f"--round {{round}} --repo {{repo}} --source {FIXTURES / 'fuse_norm' / 'correct.py'}")  # fmt: skip
    agent = AgentSettings(kind="command", cmd=cmd, rounds=3, time_limit_s=3, pass_env=("BEAM_AGENT_PASSED",),
                          candidates_dir=str(tmp / "candidates"))  # fmt: skip
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BEAM_AGENT_PASSED", "yes")
        mp.setenv("BEAM_AGENT_NOT_PASSED_TOKEN", "secret")
        outcome = loop.run_agent(TASK, _settings(tmp, agent), echo=lines.append, repo_root=repo)
    return {"outcome": outcome, "transcript": json.loads(outcome.transcript_path.read_text()), "repo": repo,
            "lines": lines}  # fmt: skip


def test_the_command_agent_writes_a_candidate_that_is_evaluated(command_session):
    outcome, t = command_session["outcome"], command_session["transcript"]
    assert outcome.error is None and outcome.stopped == "all 3 rounds run"
    assert [c.name[:10] for c in outcome.candidates] == ["agent_r01_", "agent_r02_"]
    assert len(outcome.passed) == 2
    first = outcome.candidates[0]
    assert first.meta.author == "agent" and first.meta.model == f"command:{Path(sys.executable).name}"
    assert first.meta.idea == "round 1: the reference's arithmetic in plain torch"  # its own CANDIDATE idea kept
    rounds = t["command"]["rounds"]
    assert rounds[0]["returncode"] == 0 and "told to write: True" in rounds[0]["stdout_tail"]
    assert "earlier verdicts: 1" in rounds[1]["stdout_tail"]  # round 2's prompt shows round 1's verdict
    env_line = next(line for line in rounds[0]["stdout_tail"].splitlines() if line.startswith("env: "))
    names = set(env_line[5:].split(","))
    assert "BEAM_AGENT_PASSED" in names and "BEAM_AGENT_NOT_PASSED_TOKEN" not in names
    assert names <= {"PATH", "HOME", "TMPDIR", "LANG", "TERM", "BEAM_AGENT_PASSED", "LC_CTYPE"}


def test_writes_outside_the_candidate_path_are_undone_and_reported(command_session):
    repo, rounds = command_session["repo"], command_session["transcript"]["command"]["rounds"]
    assert rounds[0]["ignored_writes"] == []
    assert rounds[1]["ignored_writes"] == [
        {"path": "PLANTED_BY_AGENT.txt", "change": "created", "restored": True},
        {"path": "README.md", "change": "modified", "restored": True},
        {"path": "harness.py", "change": "deleted", "restored": True},
    ]
    assert not (repo / "PLANTED_BY_AGENT.txt").exists()
    assert (repo / "README.md").read_text() == "the project\n" and (repo / "harness.py").exists()
    assert any("ignored a write outside the candidate path: created PLANTED_BY_AGENT.txt" in line
               for line in command_session["lines"])  # fmt: skip


def test_a_command_that_hangs_is_killed_at_the_limit(command_session):
    third = command_session["transcript"]["command"]["rounds"][2]
    assert third["timed_out"] is True and third["returncode"] is None and 3 <= third["wall_s"] < 30
    assert third["candidate"] is None and "no file at" in third["summary"] and "timed out" in third["summary"]


# ---- the prompt --------------------------------------------------------------------------------------
def test_agent_prompt_prints_system_statement_and_tools(capsys, tmp_path):
    code = cli.main(["agent", "prompt", "task=fuse_norm", "device=cpu", f"results_dir={tmp_path}"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("=== SYSTEM PROMPT ===\n" + SYSTEM_PROMPT.rstrip())
    for part in ("=== TASK STATEMENT ===", "def norm_residual_norm(", "h_new_TD = (h_TD.float() * a",
                 "def residual_coefficients(", "`tiny T=5`: preset=beam-tiny, T=5, D=96", "Promoted: none yet",
                 "CPU only (no CUDA GPU)", "## Which ops dominate", "## The candidate file contract",
                 "## Goals (reported", "T=16384 p50 <= 165 us", "not measured on the H200",
                 "=== TOOLS (6) ===", '"name": "submit_candidate"'):  # fmt: skip
        assert part in out, part
    code = cli.main(["agent", "prompt", "task=fuse_norm", "device=cpu", "agent=command", f"results_dir={tmp_path}"])
    out = capsys.readouterr().out
    assert code == 0 and "=== TOOLS" not in out and "Write ONE complete candidate file to" in out


def test_hot_spots_come_from_the_newest_profile_of_each_kind(tmp_path):
    runs = {"beam-slice-decode-reference-cuda-20261130T070000Z": ("decode", "11.0"),
            "beam-slice-decode-reference-cuda-20261130T080000Z": ("decode", "42.0"),
            "beam-slice-prefill-reference-cuda-20261130T075000Z": ("prefill", "91.7")}  # fmt: skip
    for name, (scenario, share) in runs.items():
        (tmp_path / name).mkdir()
        text = f"# Profile: beam-slice, {scenario}, reference ops\n\n## Which ops dominate\n\n- `attention`: "
        (tmp_path / name / "summary.md").write_text(text + f"{share}% of the op time\n\n## Ops\n\n| op |\n")
    os.utime(tmp_path / "beam-slice-decode-reference-cuda-20261130T080000Z" / "summary.md", (1, 1))  # a checkout's
    text = context.hot_spots_text(TASK, tmp_path / "results", tmp_path)
    assert "T080000Z/summary.md (Profile: beam-slice, decode, reference ops)" in text  # by its stamp, not its mtime
    assert "T075000Z/summary.md (Profile: beam-slice, prefill, reference ops)" in text
    assert text.index("42.0%") < text.index("91.7%") and "11.0%" not in text and "## Ops" not in text
    assert "Model profile: none" in context.hot_spots_text(TASK, tmp_path / "results", tmp_path / "nothing")
    assert "reference ops; it ran" not in text
    optimized = tmp_path / "optimized" / "beam-slice-decode-optimized-cuda-20261130T090000Z"
    optimized.mkdir(parents=True)
    (optimized / "summary.md").write_text("# Profile: beam-slice, decode, optimized ops\n\n## Which ops dominate\n")
    assert ("T090000Z/summary.md (Profile: beam-slice, decode, optimized ops; it ran the kernels promoted when it was "
            "taken: the ones in force now are under Candidates):\n") in context.hot_spots_text(
        TASK, tmp_path / "results", optimized.parent)  # fmt: skip


# ---- the pieces ----------------------------------------------------------------------------------------
def test_prices_and_cost_from_usage():
    assert price_of("claude-haiku-4-5-20251001") == Price(1.0, 5.0, 1.25, 0.10)
    assert price_of("claude-opus-4-1") == Price(15.0, 75.0, 18.75, 1.50)  # longest prefix, not claude-opus-4
    with pytest.raises(ValueError, match="no price for model 'gpt-5'.*known:"):
        price_of("gpt-5")
    usage = Usage(1_000_000, 200_000, 100_000, 2_000_000)
    assert usage.cost_usd(Price(3.0, 15.0, 3.75, 0.30)) == pytest.approx(3.0 + 3.0 + 0.375 + 0.6)
    budget = Budget(rounds=5, turns=10, tokens=3_000_000, usd=100.0, price=Price(3.0, 15.0, 3.75, 0.30))
    assert budget.exhausted() is None
    budget.charge(usage)
    assert budget.exhausted() == "token budget spent (3,300,000 of 3,000,000 tokens)"


def test_retry_policy_backs_off_with_jitter_and_honours_retry_after():
    policy, rng = RetryPolicy(retries=6, backoff_s=1.0, backoff_max_s=10.0), random.Random(0)
    delays = [policy.delay(n, None, rng) for n in range(6)]
    assert all(0 <= d <= min(10.0, 2**n) for n, d in enumerate(delays)) and max(delays) > 1.0
    assert all(policy.delay(0, 7.0, rng) >= 7.0 for _ in range(20))
    with pytest.raises(AgentError, match="asked to wait 60 s"):
        policy.delay(0, 60.0, rng)
    assert retry_after_s({"retry-after": "3"}) == 3.0 and retry_after_s({"retry-after-ms": "250"}) == 0.25
    assert retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0 and retry_after_s({}) is None


def test_read_file_is_confined_to_the_repository(tmp_path):
    (tmp_path / "ok.py").write_text("a = 1\nb = 2\nc = 3\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("[core]\n")
    (tmp_path / "api_keys.txt").write_text("sk-...\n")
    (tmp_path / "escape").symlink_to("/etc")
    assert tools.read_file(tmp_path, "ok.py", offset=2, limit=1) == "ok.py (lines 2-2 of 3); continue with offset=3\n" \
        "    2  b = 2"  # fmt: skip
    for path, why in ((".git/config", "never shown"), ("../x", "outside the repository"),
                      ("escape/passwd", "outside the repository"), ("api_keys.txt", "looks like a secret"),
                      ("missing.py", "does not exist")):  # fmt: skip
        with pytest.raises(tools.ToolError, match=why):
            tools.read_file(tmp_path, path)
    assert "api_keys.txt" not in tools.list_files(tmp_path, ".") and ".git" not in tools.list_files(tmp_path, ".")


def test_metadata_replaces_the_agents_own_and_keeps_future_imports_first():
    source = '"""doc"""\nfrom __future__ import annotations\nCANDIDATE = {"author": "human"}\nimport torch\n'
    meta = candidate_files.CandidateMeta("agent", "m", "row_per_program", "an idea")
    text = submissions.with_metadata(source, meta, 4)
    lines = text.splitlines()
    assert lines[:2] == ['"""doc"""', "from __future__ import annotations"] and text.count("CANDIDATE = {") == 1
    assert '"parent": "row_per_program",' in text and "in round 4 of" in text and lines[-1] == "import torch"
    with pytest.raises(submissions.SubmissionRejected, match="no top-level launcher"):
        submissions.draft(TASK, "import torch\n", "an idea", None, "m")
    with pytest.raises(submissions.SubmissionRejected, match="not valid Python"):
        submissions.draft(TASK, "def norm_residual_norm(:\n", "an idea", None, "m")


def test_concurrent_submissions_never_overwrite_each_other(tmp_path):
    texts = [f"def norm_residual_norm():\n    return {i}\n" for i in range(8)]
    paths: list[Path] = []
    threads = [threading.Thread(target=lambda t=t: paths.append(submissions.write(tmp_path, t, 1))) for t in texts * 2]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(set(paths)) == 8 and sorted(p.read_text() for p in set(paths)) == sorted(texts)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in set(paths))  # no temporary files


def test_agent_settings_are_validated_and_composed_by_hydra(capsys):
    with pytest.raises(ValueError, match=r"agent kind 'gpt' unknown; known: \['none', 'anthropic'"):
        AgentSettings(kind="gpt")
    with pytest.raises(ValueError, match=r"agent.cmd refers to \['out'\]; the placeholders are"):
        AgentSettings(kind="command", cmd="cli {out}")
    code = cli.main(["run", "task=fuse_norm", "agent=anthropic", "agent.model=claude-haiku-4-5", "agent.rounds=8",
                     "agent.pass_env=[A,B]", "--cfg", "job"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "kind: anthropic" in out and "model: claude-haiku-4-5" in out and "rounds: 8" in out
    assert cli.main(["model", "info", "--cfg", "job"]) == 0  # agent=none adds nothing to other commands
    assert "agent" not in capsys.readouterr().out


def test_the_inspect_tool_returns_the_compilers_figures_without_a_gpu_or_a_round(tmp_path):
    agent = AgentSettings(kind="anthropic", model=MODEL, candidates_dir=str(tmp_path / "candidates"))
    session = loop.Session(TASK, _settings(tmp_path, agent), agent, MODEL, Budget(rounds=1, turns=1, tokens=1, usd=1.0))
    box = tools.ToolBox(session)
    source = (REPO_ROOT / "candidate_kernels" / "fuse_norm" / "row_per_program.py").read_text()
    call = {
        "type": "tool_use",
        "id": "t1",
        "name": "inspect_kernels",
        "input": {"source": source, "shapes": ["T=16384"]},
    }
    (result,) = box.run_all([call])
    assert result["is_error"] is False, result["content"]
    assert "| _fuse_norm_kernel | warps=4, stages=3 | T=16384 | 120 |" in result["content"]
    assert session.budget.rounds_used == 0 and not list((tmp_path / "candidates").glob("*.py"))
    (inspection,) = session.record["checks"]
    assert {r["status"] for r in inspection["inspection"]} == {"compiled"}
    bad = {"type": "tool_use", "id": "t2", "name": "inspect_kernels", "input": {"source": source, "shapes": ["T=2"]}}
    (refused,) = box.run_all([bad])
    assert refused["is_error"] is True and "has no GPU shapes ['T=2']" in refused["content"]


# ---- on the GPU: verdicts with timings ---------------------------------------------------------------
@pytest.mark.gpu
def test_on_the_gpu_verdicts_carry_timings_against_every_baseline(tmp_path):
    """The tools as the API agent calls them (no API needed): a submission is timed against every
    baseline, and the benchmark tool times it again."""
    agent = AgentSettings(kind="anthropic", model=MODEL, candidates_dir=str(tmp_path / "candidates"))
    settings = _settings(tmp_path, agent, device="cuda", shapes=("T=1",))
    session = loop.Session(TASK, settings, agent, MODEL, Budget(rounds=2, turns=1, tokens=1, usd=1.0))
    box = tools.ToolBox(session)
    source = (REPO_ROOT / "candidate_kernels" / "fuse_norm" / "row_per_program.py").read_text()
    call = {"type": "tool_use", "id": "t1", "name": "submit_candidate",
            "input": {"source": source, "idea": "row_per_program again", "parent": "row_per_program"}}  # fmt: skip
    (submitted,) = box.run_all([call])
    verdict = json.loads(submitted["content"])
    assert submitted["is_error"] is False and verdict["passed"] is True and verdict["device"] == "cuda", verdict
    (shape,) = verdict["shapes"]
    assert shape["p20_us"] <= shape["p50_us"] <= shape["p80_us"] and shape["floor_fraction"] > 0
    assert {"reference", "torch_compile"} <= set(shape["speedup_vs"]) == set(shape["baseline_p50_us"])
    bench_call = {"type": "tool_use", "id": "t2", "name": "benchmark",
                  "input": {"candidate": verdict["candidate"], "shapes": ["T=1"]}}  # fmt: skip
    (bench,) = box.run_all([bench_call])
    again = json.loads(bench["content"])
    assert bench["is_error"] is False and again["shapes"][0]["p50_us"] > 0 and again["run_id"] != verdict["run_id"]


def test_the_statement_shows_the_promoted_kernels_speedups_as_promotion_bars_them():
    """qk_norm_rope's committed H200 records: loads_first, promoted and since rehashed (a header edit), keeps its
    figures in the statement; at global T=16384 its speedup over torch.compile is over the compile's time beside
    pdl_token_ring (141.00 us), not the 178.85 us timed beside it (promote.bars)."""
    task = get_task("qk_norm_rope")
    results = REPO_ROOT / "results"
    records = read(results / "qk_norm_rope" / RECORDS_FILE, EvaluationRecord)[0]
    records = [r for r in records if r.run_id <= "20261205T014911-ba3c81"]  # up to that run (ids sort by time)
    text = context.candidates_text(task, records, results, REPO_ROOT / "candidate_kernels" / "qk_norm_rope")
    lines = text.splitlines()
    assert lines[0].startswith("Promoted (the one to beat): loads_first")
    (line,) = [line for line in lines if line.startswith("  - global T=16384: p50 143.28 us")]
    assert "0.98x vs torch_compile (its time beside pdl_token_ring, faster than beside it)" in line
    assert "13.87x vs flashinfer_norm_rope," in line  # timed beside it: no note


def test_a_candidate_whose_docstrings_changed_since_its_run_keeps_its_figures_in_the_statement(tmp_path):
    """Records name the bytes they measured; a candidate whose header was edited since (its code the same) is shown
    with its earlier bytes' records, found in the file's git history, and one whose code changed is not."""
    from harness.records import Status

    repo = tmp_path / "repo"
    folder = repo / "candidate_kernels" / "fuse_norm"
    folder.mkdir(parents=True)
    fixture = (REPO_ROOT / "tests" / "fixtures" / "fuse_norm" / "correct.py").read_text()
    measured = {name: fixture + f"# {name}\n" for name in ("documented", "recoded")}  # the bytes of run-1
    for name, text in measured.items():
        (folder / f"{name}.py").write_text(text)
    git = ["git", "-C", str(repo), "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "measured"], check=True)
    hashes = {name: candidate_files.content_hash(text.encode()) for name, text in measured.items()}
    records = [
        EvaluationRecord(run_id="run-1", task="fuse_norm", implementation=name, kind="candidate", shape_label="T=1",
                         shape={"T": 1}, device="cpu", policy="interpreter", seeds=[1], status=Status.PASSED,
                         detail="", environment={}, candidate_hash=hashes[name],
                         candidate_path=f"candidate_kernels/fuse_norm/{name}.py", parity={"x_TD": {"passed": True}})
        for name in measured
    ]  # fmt: skip
    (folder / "documented.py").write_text(measured["documented"].replace("no defect.", "no defect (edited since)."))
    (folder / "recoded.py").write_text(measured["recoded"].replace("+ eps)", "+ eps * 1.0)"))
    lines = context.candidates_text(get_task("fuse_norm"), records, tmp_path / "results", folder, repo).splitlines()
    documented = lines.index(next(line for line in lines if line.startswith("- documented ")))
    assert lines[documented].endswith(f"[cpu, run run-1, as its earlier bytes {hashes['documented'][:12]}: the same "
                                      "code, documentation edited since]")  # fmt: skip
    assert lines[documented + 1] == "  - T=1: passed parity (cpu, not timed)"
    assert next(line for line in lines if line.startswith("- recoded ")).endswith("[never evaluated]")
