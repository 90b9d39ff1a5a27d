"""The statistics of the loop's decisions, pure: the metrics (`metrics`), the exact tests
(`signflip`, `binomial`), the keep/roll-back rule and its early-stopping bounds (`decision`), the decision
policies as objects (`policies`) and futility screening (`futility`). No I/O, no git, no SQLite."""
