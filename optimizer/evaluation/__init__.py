"""Evaluating a prompt revision on a split: the judge-call cache, budgets, judging items, result files."""
