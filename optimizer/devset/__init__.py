"""AgentHorizon data: splits (judge input), labels (the only label reader), import and verify.

Deliberately empty: importing a submodule must not import `optimizer.devset.labels`."""
