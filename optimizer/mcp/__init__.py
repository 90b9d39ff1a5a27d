"""`judgeloop mcp`: a coding agent (Claude Code, Codex) as the optimiser, judgeloop as the evaluator it
cannot bypass. `session` holds the engine side (one run in the ledger, the budget, the tools); `server`
speaks MCP over stdio with the official SDK. A top-level entry like ``cli``: nothing in the engine
imports it.
"""
