"""Where verdicts meet the labels, outside the loop: `scoring` (``judgeloop score``: a folder of verdict
files against a split's labels) and `triage` (the label-suspects queue and the metrics under the labels as
given and as corrected). Answers: the judge, the evaluation package and the optimiser's strategies never
import them (the label firewall contracts in pyproject.toml).
"""
