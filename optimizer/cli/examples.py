"""An example or two for each command's ``-h`` (argparse's epilog), keyed by the command as typed
(``"devset import"``). A test holds every command to having one."""

from __future__ import annotations

EXAMPLES: dict[str, tuple[str, ...]] = {
    "init": ("judgeloop init demo --sample", "judgeloop init myjudge"),
    "devset": ("judgeloop devset list", "judgeloop devset import ~/data/ah --name dev --all"),
    "devset import": (
        "judgeloop devset import ~/data/ah --name dev --all",
        "judgeloop devset import ~/data/ah --name test --manifest test-ids.txt",
        "judgeloop devset import ~/data/arb --name arb --format agentrewardbench --all",
    ),
    "devset verify": ("judgeloop devset verify", "judgeloop devset verify dev"),
    "devset show": ("judgeloop devset show sample 3f2a",),
    "devset list": ("judgeloop devset list",),
    "score": ("judgeloop score experiments/evals/2024-05-01T10-00 --split sample",),
    "eval": (
        "judgeloop eval --limit 5",
        "judgeloop eval --provider anthropic --model claude-haiku-4-5 --split dev",
    ),
    "run": (
        "judgeloop run --max-experiments 3",
        "judgeloop run --strategy agent --budget-usd 5 --hours 2",
        "judgeloop run --resume",
    ),
    "decide": (
        "judgeloop decide 12 keep",
        "judgeloop decide 12 keep --force   # against the policy, no question",
        "judgeloop decide 12 discard",
    ),
    "report": ("judgeloop report", "judgeloop report --run 20240501-100000-ab12 --json"),
    "attribute": ("judgeloop attribute --run 20240501-100000-ab12 --budget-usd 2",),
    "history": ("judgeloop history", "judgeloop history --run 20240501-100000-ab12"),
    "confirm": ("judgeloop confirm --split test",),
    "reviews": ("judgeloop reviews", "judgeloop reviews --export reviews.jsonl"),
    "label-fix": ('judgeloop label-fix 3f2a9c --label failure --reason "the form was never submitted"',),
    "label-adopt": ("judgeloop label-adopt --split dev",),
    "mcp": (
        "judgeloop mcp --budget-usd 5",
        "claude mcp add judgeloop -- judgeloop -w ~/myjudge mcp --budget-usd 5",
    ),
    "selftest": ("judgeloop selftest --budget-usd 2 --repeats 3",),
    "certify": ("judgeloop certify", "judgeloop certify HEAD --transfer-model claude-haiku-4-5 --no-bias"),
    "tui": ("judgeloop tui", "judgeloop tui --screen compare --screenshot compare.svg --size 80x24"),
    "bias": ("judgeloop bias --probes final_claim,idle_steps --budget-usd 1",),
    "plan": (
        "judgeloop plan --budget-usd 10",
        "judgeloop plan --budget-usd 10 --hours 4 --provider anthropic",
    ),
    "runs": ("judgeloop runs prune", "judgeloop runs prune --keep 3 --yes"),
    "runs prune": (
        "judgeloop runs prune                 # what would go, nothing removed",
        "judgeloop runs prune --keep 3 --yes  # remove all but the 3 newest runs' branches and folders",
    ),
    "hook": ("judgeloop hook pre-tool-use < event.json",),
    "hook pre-tool-use": (
        "judgeloop hook pre-tool-use < event.json   # exit 0: allowed; exit 2: blocked, the reason on stderr",
        "judgeloop hook pre-tool-use || exit 2      # as registered in hooks.json: a hook that cannot run blocks",
    ),
    "cascade": ("judgeloop cascade calibrate", "judgeloop cascade calibrate --json"),
    "cascade calibrate": (
        "judgeloop cascade calibrate                   # both judges on the dev split, two pair-aware folds",
        "judgeloop cascade calibrate --folds 3 --tune-fold 1 --json",
    ),
    "completion": (
        "judgeloop completion bash > ~/.judgeloop-completion.bash",
        'eval "$(judgeloop completion bash)"   # in ~/.bashrc',
    ),
}


def epilog(command: str) -> str | None:
    """The ``-h`` examples of ``command`` ("run", "devset import"), or None when it has none."""
    lines = EXAMPLES.get(command)
    return "examples:\n" + "\n".join(f"  {line}" for line in lines) if lines else None
