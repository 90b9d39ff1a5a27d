"""The optimisation loop: the runner, run sessions (start, resume, decide, confirm), guards, strategies."""
