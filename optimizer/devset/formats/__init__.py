"""Other labelled computer-use judge benchmarks, imported as AgentHorizon-shaped splits.

Each format is one module that reads a benchmark's published files (`agentrewardbench`, `osreward`)
and converts them into trajectories and labels (`common.Converted`); `common.import_converted` stages
them in the AgentHorizon layout and imports that through `optimizer.devset.importer.import_split`, so a
converted split has the same id and path rules, verification, label firewall and held-out machinery as
AgentHorizon. `registry.import_benchmark` is the one entry point (`devset import --format NAME`).
"""
