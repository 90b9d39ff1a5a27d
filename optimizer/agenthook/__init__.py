"""A second fence for coding-agent hosts (Claude Code, Codex): their PreToolUse hook.

`judgeloop hook pre-tool-use` reads the event a host sends before one of its own tools runs (a file read,
an edit, a search, a shell command) and blocks the call when a path it names reaches what the optimiser must
never read or write: ``devset/`` (labels, held-out splits), ``corrections.jsonl``, the ledger and runs under
``experiments/``, or git's objects (``.git/``, ``git show REV:devset/...``). The real confinement is the MCP
server's boundary and a sandbox around the agent; a shell can always hide a path (base64, variables built at
run time), so this fence stops the plain ways, not a determined program.

- `fence`: the protected places of a workspace and whether a path, a glob or a searched folder reaches them;
- `shell`: the paths a shell command names (words, redirections, ``cd``, recursive searches, git's readers);
- `events`: the hosts' event JSON, tool by tool, to one `Verdict`.
"""
