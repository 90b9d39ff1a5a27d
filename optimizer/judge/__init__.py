"""The judge: prompt files, rendering a trajectory into a request, the providers (the only LLM
clients, for the judge and the optimiser alike), the agentic mode and verdict parsing.

Judge-input side: nothing here may import `optimizer.devset.labels` (an import-linter contract)."""
