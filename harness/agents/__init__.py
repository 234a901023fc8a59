"""Proposers: agents that write candidates for a task during `harness run` (issue 7).

    harness run task=fuse_norm agent=anthropic agent.model=<id> agent.rounds=8    Claude, through the API
    harness run task=fuse_norm agent=command agent.cmd='cli --prompt {prompt_file} --out {candidate_path}'
    harness run task=fuse_norm agent=replay agent.transcript=results/fuse_norm/agents/<session>.json
    harness agent prompt task=fuse_norm                                            what an agent is told

Reading order: settings.py (agent.*), prompt.py + context.py (what the agent is told), tools.py (what
it can do), loop.py (a session: rounds, evaluation pool, transcript), submissions.py (source -> file
-> verdict), budget.py (tokens and dollars), then one module per kind: anthropic_agent.py,
command_agent.py, replay_agent.py. An agent can only submit candidates: every submission is a file in
candidate_kernels/<task>/ evaluated by the same runner as every other candidate, and the usual
evaluation and promotion of `harness run` follow the session.
"""
