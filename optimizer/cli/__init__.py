"""The `judgeloop` command line. Each subcommand dispatches to a ``cmd_*`` function in its module.

Handlers take the parsed arguments and return an exit code. A `UserError` anywhere becomes one line
on stderr and exit code 2, and so does a command line argparse refuses (an unknown or abbreviated
flag, a value out of its range) and a full disk, a read-only folder or a refused permission met
while writing a file; Ctrl-C becomes exit code 130. Bugs still raise with a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from optimizer.cli.examples import epilog
from optimizer.errors import UserError
from optimizer.vocab import FLAG_PROVIDERS, IMPORT_FORMATS, POLICIES, RUN_STRATEGIES
from optimizer.workspace.config import MAX_CONCURRENCY, MAX_REPLICATES, MAX_WAVE

WORKSPACE_HELP = (
    "the workspace folder, exactly; before or after any command (default: the nearest folder at or above "
    "the current one that holds judgeloop.toml, as git finds its repository)"
)


class CommandLineError(Exception):
    """A command line the parser refused; the message is the whole line to print."""


class Parser(argparse.ArgumentParser):
    """argparse without prefix matching (``--max-experiment`` must not pass for ``--max-experiments``)
    and with its refusals as one line, like every other judgeloop error."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise CommandLineError(f"{self.prog}: error: {message} (see `{self.prog} -h`)")


def wave_size(text: str) -> int:
    """An argparse type for ``--wave``: 1 to `MAX_WAVE` candidates."""
    return whole(1, MAX_WAVE)(text)


def whole(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high] (no upper bound when ``high`` is None)."""
    allowed = (
        f"a whole number from {low} to {high}" if high is not None else f"a whole number of at least {low}"
    )

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {allowed}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} is out of range: use {allowed}")
        return value

    return parse


def positive(text: str) -> float:
    """An argparse type: a finite number greater than 0 (a budget, a number of hours)."""
    allowed = "a number greater than 0"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {allowed}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is out of range: use {allowed}")
    return value


def _common() -> Parser:
    common = Parser(add_help=False)
    # -w works before the command (as `git -C`) and after it, at every level (`devset -w DIR list`).
    # SUPPRESS here: a subcommand's default would otherwise overwrite the value given before it.
    common.add_argument("-w", "--workspace", default=argparse.SUPPRESS, metavar="DIR", help=WORKSPACE_HELP)
    return common


def _version() -> str:
    try:
        return importlib.metadata.version("judgeloop")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed; run `pip install -e .`)"


class _ScreenNames:
    """The TUI's view names for --screen, read from `tui.app` only when argparse checks or shows them:
    building the parser must not import Textual for every command."""

    @staticmethod
    def _names() -> list[str]:
        from tui.app import VIEWS

        return list(VIEWS)

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())


def _judge_overrides(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--provider",
        choices=FLAG_PROVIDERS,
        help="the judge's provider (default: [judge] provider in judgeloop.toml)",
    )
    p.add_argument("--model", help="the judge's model (default: [judge] model)")
    p.add_argument(
        "--base-url",
        metavar="URL",
        help="the judge's API address, e.g. an OpenAI-compatible server (default: [judge] base_url)",
    )
    p.add_argument(
        "--concurrency",
        type=whole(1, MAX_CONCURRENCY),
        metavar="N",
        help=f"judge calls in flight at once, 1 to {MAX_CONCURRENCY} (default: [judge] max_concurrency)",
    )


BATCH_HELP = (
    "send the uncached judge calls as one batch through the provider's batch API (anthropic, openai): "
    "half price, answered within 24 h; early stopping does not apply (every item is judged); a killed "
    "command run again collects its pending batch instead of sending a second one"
)
OFF = " (default: off)"
BATCH_COLD_HELP = (
    "with --batch: submit at once, without first warming each cold item with one direct call "
    "(the batch's calls for one item then each pay its cache write; default: warm first)"
)
INSPECT_LOG_HELP = (
    "also write the pass as an Inspect AI log (.eval: one sample per item, the verdict as its score, the label as "
    "its target; open it with `inspect view`; needs pip install 'judgeloop[inspect]') (default: none)"
)
REPLICATES_HELP = (
    f"judge each item K times per prompt set and score the majority verdict, 1 to {MAX_REPLICATES} "
    "(default: replicates in prompts/judge.toml, 1)"
)
LATEST_RUN = "(default: the latest run)"


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = Parser(
        prog="judgeloop",
        description="Improve an LLM judge of computer-use trajectories, one audited git commit at a time.",
    )
    parser.add_argument("-w", "--workspace", default=None, metavar="DIR", help=WORKSPACE_HELP)
    parser.add_argument(
        "--version",
        action="version",
        version=f"judgeloop {_version()}",
        help="print the installed judgeloop version and exit",
    )
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        help="one of the commands below; `judgeloop COMMAND -h` for its options",
    )

    def command(group: Any, name: str, handler: str, help_: str, typed: str = "") -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = group.add_parser(
            name,
            parents=[common],
            help=help_,
            description=help_,
            epilog=epilog(typed or name),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.set_defaults(handler=handler)
        return p

    def add(name: str, handler: str, help_: str) -> argparse.ArgumentParser:
        return command(sub, name, handler, help_)

    def actions(name: str, help_: str, actions_help: str, metavar: str = "ACTION") -> Any:
        """Command ``name`` made of sub-actions (``judgeloop NAME ACTION``): its group of sub-parsers."""
        group = sub.add_parser(
            name,
            parents=[common],
            help=help_,
            description=help_,
            epilog=epilog(name),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        return group.add_subparsers(dest=f"{name}_command", required=True, metavar=metavar, help=actions_help)

    p = add("init", "optimizer.cli.workspace:cmd_init", "create a workspace (a git repository) in DIR")
    p.add_argument(
        "dir", metavar="DIR", help="the folder to create, new or empty (relative to the current folder)"
    )
    p.add_argument(
        "--sample",
        action="store_true",
        help="import the bundled sample set as split 'sample' (default: no split)",
    )

    devset_help = "import, verify and read data splits"
    dsub = actions(
        "devset", devset_help, "one of the actions below; `judgeloop devset ACTION -h` for its options"
    )

    def dadd(name: str, handler: str, help_: str) -> argparse.ArgumentParser:
        return command(dsub, name, handler, help_, f"devset {name}")

    p = dadd(
        "import",
        "optimizer.cli.devset:cmd_import",
        "copy a benchmark's labelled items (AgentHorizon by default) into devset/NAME",
    )
    p.add_argument(
        "src", metavar="SRC", help="the downloaded benchmark folder (AgentHorizon: either release layout)"
    )
    p.add_argument(
        "--name",
        required=True,
        metavar="NAME",
        help="the new split's name, also its folder devset/NAME (required)",
    )
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--manifest",
        metavar="FILE",
        help="import the items listed in FILE: one trajectory id per line, # comments",
    )
    how.add_argument("--all", action="store_true", help="import every labelled item")
    how.add_argument("--rebuild-ahd", action="store_true", help="reconstruct AH-D (pair-aware, seeded)")
    p.add_argument(
        "--link", action="store_true", help="symlink screenshots instead of copying them (default: copy)"
    )
    p.add_argument(
        "--format",
        choices=IMPORT_FORMATS,
        default="agenthorizon",
        help="the benchmark SRC holds (default: agenthorizon; see docs/guides/other-benchmarks.md)",
    )
    p = dadd("verify", "optimizer.cli.devset:cmd_verify", "check a split is complete and print its counts")
    p.add_argument("name", nargs="?", metavar="NAME", help="the split to check (default: every split)")
    p = dadd("show", "optimizer.cli.devset:cmd_show", "print one trajectory as a person would read it")
    p.add_argument("name", metavar="NAME", help="the split holding the item")
    p.add_argument("id", metavar="ID", help="the trajectory id, or a prefix of it that names one item")
    dadd("list", "optimizer.cli.devset:cmd_list", "list the workspace's splits")

    p = add("score", "optimizer.cli.score:cmd_score", "score a folder of verdict files against a split")
    p.add_argument(
        "results_dir", metavar="RESULTS_DIR", help="a folder of <trajectory id>.json verdict files"
    )
    p.add_argument(
        "--split", required=True, metavar="NAME", help="the split whose labels score them (required)"
    )
    p.add_argument(
        "--json", action="store_true", help="print the metrics as one JSON object (default: a table)"
    )

    p = add("eval", "optimizer.cli.eval:cmd_eval", "evaluate the judge prompts on a split")
    p.add_argument("--split", metavar="NAME", help="the split to judge (default: [workspace] dev_split)")
    p.add_argument("--rev", metavar="REV", help="git revision of prompts/ (default: the working tree)")
    p.add_argument("--replicates", type=whole(1, MAX_REPLICATES), metavar="K", help=REPLICATES_HELP)
    p.add_argument(
        "--limit", type=whole(1), metavar="N", help="only the first N manifest items (default: every item)"
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="where to write verdict files (default: a new folder under experiments/evals/)",
    )
    p.add_argument(
        "--json", action="store_true", help="print the metrics as one JSON object (default: a table)"
    )
    p.add_argument("--batch", action="store_true", help=BATCH_HELP + OFF)
    p.add_argument("--batch-cold", action="store_true", help=BATCH_COLD_HELP)
    p.add_argument("--inspect-log", metavar="FILE.eval", help=INSPECT_LOG_HELP)
    _judge_overrides(p)

    p = add("run", "optimizer.cli.loop:cmd_run", "run the optimisation loop on the dev split")
    p.add_argument(
        "--split", metavar="NAME", help="the split the loop judges on (default: [workspace] dev_split)"
    )
    p.add_argument(
        "--strategy",
        choices=RUN_STRATEGIES,
        help="who proposes the candidates; memory: distil human reviews and disagreements into "
        "prompts/memory/ (offline); manual: your working-tree edit of the allowed files, judged "
        "as one candidate (default: [optimizer] strategy, library)",
    )
    p.add_argument(
        "-m",
        "--message",
        metavar="TEXT",
        help='--strategy manual: the edit\'s rationale (default: "a hand edit of FILES")',
    )
    p.add_argument(
        "--policy",
        choices=POLICIES,
        help="how a candidate is decided (default: [loop] policy of judgeloop.toml; adaptive in a new workspace); see docs/concepts/deciding.md",
    )
    p.add_argument(
        "--max-experiments",
        type=whole(1),
        metavar="N",
        help="candidates to try after the baseline (default: no limit)",
    )
    p.add_argument(
        "--budget-usd",
        type=positive,
        metavar="X",
        help="stop before the run's judge and optimiser calls cost more than X US dollars (default: no limit)",
    )
    p.add_argument(
        "--hours",
        type=positive,
        metavar="H",
        help="start no new candidate after H hours of wall time (default: no limit)",
    )
    p.add_argument(
        "--patience",
        type=whole(1),
        metavar="K",
        help="stop after K candidates in a row without a keep (default: [loop] patience, 5)",
    )
    p.add_argument("--replicates", type=whole(1, MAX_REPLICATES), metavar="K", help=REPLICATES_HELP)
    p.add_argument(
        "--propose-only",
        action="store_true",
        help="evaluate one candidate, wait for `judgeloop decide` (default: decide by the policy)",
    )
    p.add_argument(
        "--wave",
        type=wave_size,
        metavar="K",
        help="propose K candidates per round against one incumbent, judge them item by item together and "
        "keep at most one (Holm over their p-values); see docs/concepts/waves.md (default: [loop] wave, 1)",
    )
    p.add_argument(
        "--resume", action="store_true", help="continue the last unfinished run (default: start a new run)"
    )
    p.add_argument(
        "--batch",
        action="store_true",
        help=BATCH_HELP.replace("a killed command run again", "`--resume`")
        + "; a run started with --batch resumes in batch mode"
        + OFF,
    )
    p.add_argument("--batch-cold", action="store_true", help=BATCH_COLD_HELP)
    _judge_overrides(p)

    p = add(
        "decide", "optimizer.cli.loop:cmd_decide", "keep or discard a candidate waiting in propose-only mode"
    )
    p.add_argument(
        "experiment", metavar="EXPERIMENT", help="the waiting experiment's id (see `judgeloop history`)"
    )
    p.add_argument(
        "decision",
        choices=["keep", "discard"],
        help="keep: commit it as the incumbent; discard: roll it back",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="keep a candidate the policy rolls back without asking (default: ask on a terminal, "
        "refuse elsewhere)",
    )

    p = add("report", "optimizer.cli.report:cmd_report", "audit a run: decisions, kept chain, flips, spend")
    p.add_argument("--run", metavar="ID", help=f"the run to audit {LATEST_RUN}")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object (default: text)")

    p = add(
        "attribute",
        "optimizer.cli.attribute:cmd_attribute",
        "measure what each kept edit still contributes at the end, and the final prompts vs the baseline",
    )
    p.add_argument(
        "--run", metavar="ID", help="one run's kept edits (default: every kept edit in HEAD's history)"
    )
    p.add_argument(
        "--budget-usd",
        type=positive,
        metavar="X",
        help="stop cleanly before spending more than X US dollars in all (default: no limit)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the result as one JSON object, status lines on stderr (default: text)",
    )
    _judge_overrides(p)

    p = add("history", "optimizer.cli.report:cmd_history", "print the experiments table")
    p.add_argument("--run", metavar="ID", help=f"the run whose experiments to list {LATEST_RUN}")

    p = add(
        "confirm", "optimizer.cli.loop:cmd_confirm", "evaluate the final prompts once on a held-out split"
    )
    p.add_argument(
        "--split",
        required=True,
        metavar="NAME",
        help="the held-out split, listed under [workspace] heldout_splits (required)",
    )
    p.add_argument("--run", metavar="ID", help=f"the run whose final prompts to confirm {LATEST_RUN}")
    p.add_argument("--batch", action="store_true", help=BATCH_HELP + OFF)
    p.add_argument("--batch-cold", action="store_true", help=BATCH_COLD_HELP)
    p.add_argument("--inspect-log", metavar="FILE.eval", help=INSPECT_LOG_HELP)
    _judge_overrides(p)

    p = add("reviews", "optimizer.cli.report:cmd_reviews", "list human reviews or export them as JSONL")
    p.add_argument(
        "--export", metavar="FILE", help="write every review to FILE as JSON lines (default: list them)"
    )

    p = add(
        "label-fix",
        "optimizer.cli.triage:cmd_label_fix",
        "record a person's correction of one label in devset/<split>/corrections.jsonl (see the label suspects "
        "in `judgeloop report`)",
    )
    p.add_argument("id", metavar="ID", help="the trajectory id whose label is wrong")
    p.add_argument(
        "--label",
        required=True,
        choices=("success", "failure"),
        help="the right label (required); the item's given label again removes its correction",
    )
    p.add_argument("--reason", required=True, metavar="TEXT", help="why the given label is wrong (required)")
    p.add_argument("--split", metavar="NAME", help="the split (default: [workspace] dev_split)")
    p.add_argument("--by", metavar="WHO", help="who corrects it (default: $USER)")

    p = add(
        "label-adopt",
        "optimizer.cli.triage:cmd_label_adopt",
        "accept devset/<split>/corrections.jsonl as it is now (a hand edit, or a file from before label-fix "
        "recorded its writes): every line checked, what changed since the last record printed",
    )
    p.add_argument("--split", metavar="NAME", help="the split (default: [workspace] dev_split)")
    p.add_argument("--by", metavar="WHO", help="who accepts it (default: $USER)")

    p = add(
        "mcp",
        "optimizer.cli.mcp:cmd_mcp",
        "serve one optimisation session to a coding agent (Claude Code, Codex) over MCP on stdio",
    )
    p.add_argument(
        "--budget-usd",
        type=positive,
        metavar="X",
        required=True,
        help="the session's judge budget in US dollars (required): a call that would cross it is refused",
    )
    p.add_argument("--policy", choices=POLICIES, help="how a candidate is decided (default: [loop] policy)")
    p.add_argument("--replicates", type=whole(1, MAX_REPLICATES), metavar="K", help=REPLICATES_HELP)
    _judge_overrides(p)

    # Can I trust this judge? (optimizer.trust.selftest, optimizer.trust.certify)
    p = add(
        "selftest",
        "optimizer.cli.trust:cmd_selftest",
        "A/A repeats, a planted degradation and the minimum detectable gain of the judge on the dev split",
    )
    p.add_argument(
        "--budget-usd",
        type=positive,
        metavar="X",
        help="stop cleanly before spending more than X in all (default: no cap)",
    )
    p.add_argument(
        "--repeats",
        type=whole(1, 100),
        metavar="N",
        help="A/A repeats at most (default 5; each costs about two evaluations of the split, fewer "
        "when cached)",
    )
    p.add_argument(
        "--json", action="store_true", help="print the recorded result as one JSON object (default: text)"
    )
    _judge_overrides(p)

    p = add(
        "certify",
        "optimizer.cli.trust:cmd_certify",
        "write a versioned certificate of the judge at REV (experiments/certificates/, a git note on REV)",
    )
    p.add_argument(
        "rev", nargs="?", metavar="REV", help="the revision whose prompts are certified (default: HEAD)"
    )
    p.add_argument(
        "--transfer-model",
        metavar="M",
        help="also judge with model M of the same provider: kappa and FPR deltas (default: no transfer check)",
    )
    p.add_argument(
        "--no-bias",
        action="store_true",
        help="leave out the bias battery, 7 calls an item (default: run it, as `judgeloop bias` would)",
    )
    p.add_argument(
        "--json", action="store_true", help="print the certificate as one JSON object (default: text)"
    )
    _judge_overrides(p)

    p = add("tui", "optimizer.cli.tui:cmd_tui", "open the terminal UI")
    p.add_argument(
        "--screenshot", metavar="FILE.svg", help="render one screen to SVG and exit (default: open the app)"
    )
    p.add_argument(
        "--screen",
        default="history",
        metavar="NAME",
        choices=_ScreenNames(),
        help="the view to open: %(choices)s (default: %(default)s)",
    )
    p.add_argument(
        "--experiment",
        metavar="ID",
        help="the experiment its views open on (default: the latest run's incumbent)",
    )
    p.add_argument(
        "--run",
        metavar="ID",
        help="open this run's history (default: the latest; R in the TUI picks another)",
    )
    p.add_argument(
        "--size",
        default="120x40",
        metavar="WxH",
        help="terminal size for --screenshot (default: %(default)s)",
    )

    p = add(
        "bias",
        "optimizer.cli.bias:cmd_bias",
        "bias battery: flip rates under a success claim, idle steps and a note to the judge, against a placebo",
    )
    p.add_argument(
        "rev", nargs="?", default="HEAD", metavar="REV", help="git revision of prompts/ (default: HEAD)"
    )
    p.add_argument(
        "--split",
        metavar="NAME",
        help="the split to probe (default: [workspace] dev_split; a held-out split is refused)",
    )
    p.add_argument(
        "--probes",
        metavar="NAME[,NAME]",
        help="comma-separated: final_claim, idle_steps, judge_note (default: all three)",
    )
    p.add_argument(
        "--budget-usd",
        type=positive,
        metavar="X",
        help="cap the spend; the items become a label-stratified subset sized from estimated costs (default: no cap, every item)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object; status lines go to stderr (default: a table)",
    )
    _judge_overrides(p)

    p = add(
        "plan",
        "optimizer.cli.plan:cmd_plan",
        "before a run: the candidates, judge calls and cost per candidate a budget buys",
    )
    p.add_argument(
        "--budget-usd",
        type=positive,
        metavar="X",
        required=True,
        help="the run's budget in US dollars (required)",
    )
    p.add_argument(
        "--hours",
        type=positive,
        metavar="H",
        help="also the candidates H hours buy at the measured time per candidate (default: no time figure)",
    )
    p.add_argument(
        "--split", metavar="NAME", help="the split the run would judge (default: [workspace] dev_split)"
    )
    p.add_argument(
        "--policy",
        choices=POLICIES,
        help="how candidates would be decided (default: [loop] policy of judgeloop.toml; adaptive in a new workspace)",
    )
    p.add_argument("--replicates", type=whole(1, MAX_REPLICATES), metavar="K", help=REPLICATES_HELP)
    p.add_argument(
        "--wave",
        type=wave_size,
        metavar="K",
        help="candidates per round, as `run --wave` (default: [loop] wave of judgeloop.toml)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object (default: text)")
    _judge_overrides(p)

    cascade_help = "a cascade judge's escalation rule (judge.toml [cascade])"
    csub = actions("cascade", cascade_help, "`judgeloop cascade ACTION -h` for its options")
    p = command(
        csub,
        "calibrate",
        "optimizer.cli.cascade:cmd_cascade_calibrate",
        "both judges judge the dev split; every escalation rule is scored on one pair-aware fold, one is chosen "
        "there, and all are reported on the other with intervals",
        "cascade calibrate",
    )
    p.add_argument("--rev", metavar="REV", help="git revision of prompts/ (default: the working tree)")
    p.add_argument(
        "--split", metavar="NAME", help="the split (default: [workspace] dev_split; held-out refused)"
    )
    p.add_argument("--folds", type=whole(2, 20), default=2, metavar="K", help="pair-aware folds (default: 2)")
    p.add_argument(
        "--tune-fold",
        type=whole(0, 19),
        default=0,
        metavar="F",
        help="the fold the rule is chosen on (default: 0)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (default: a table)")
    _judge_overrides(p)

    runs_help = "housekeeping of old runs"
    rsub = actions("runs", runs_help, "one of the actions below; `judgeloop runs ACTION -h` for its options")
    p = command(
        rsub,
        "prune",
        "optimizer.cli.runs:cmd_runs_prune",
        "remove old finished runs' branches and experiments/runs/ folders (never a run that is unfinished, "
        "checked out or under HEAD; the ledger keeps their rows, git their commits)",
        "runs prune",
    )
    p.add_argument(
        "--keep",
        type=whole(0),
        metavar="N",
        help="never prune the N newest runs (default: 5, optimizer.prune.DEFAULT_KEEP)",
    )
    p.add_argument(
        "--yes", action="store_true", help="remove them (default: a dry run listing what would go)"
    )

    hook_help = (
        "the PreToolUse hook of Claude Code and Codex that keeps the agent's own tools out of the labels"
    )
    hsub = actions(
        "hook", hook_help, "one of the events below; `judgeloop hook EVENT -h` for its options", "EVENT"
    )
    command(
        hsub,
        "pre-tool-use",
        "optimizer.cli.hook:cmd_hook_pre_tool_use",
        "read a host's PreToolUse event (JSON) on stdin; exit 2 with the reason on stderr when the tool call "
        "reaches devset/, corrections.jsonl, experiments/ or .git/ (see docs/integrations/agent-hosts.md), "
        "else exit 0",
        "hook pre-tool-use",
    )

    p = add(
        "completion",
        "optimizer.cli.runs:cmd_completion",
        "print the shell code that completes judgeloop's commands and options (argcomplete)",
    )
    p.add_argument(
        "shell",
        nargs="?",
        default="bash",
        choices=("bash", "zsh", "fish", "tcsh"),
        help="the shell (default: %(default)s)",
    )
    return parser


def _autocomplete(parser: argparse.ArgumentParser) -> None:
    """Answer a shell's completion request (argcomplete sets _ARGCOMPLETE, then this exits); a no-op on
    every ordinary call, and when argcomplete is not installed."""
    import os

    if "_ARGCOMPLETE" not in os.environ:
        return
    try:
        import argcomplete
    except ImportError:
        return
    argcomplete.autocomplete(parser)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    _autocomplete(parser)
    try:
        args = parser.parse_args(argv)
    except CommandLineError as exc:
        from optimizer.cli.suggest import did_you_mean

        hint = did_you_mean(parser, sys.argv[1:] if argv is None else argv, str(exc))
        print(f"{exc}{hint or ''}", file=sys.stderr)
        return 2
    module_name, func_name = args.handler.split(":")
    try:
        handler = getattr(importlib.import_module(module_name), func_name)
        return int(handler(args) or 0)
    except UserError as exc:
        print(f"judgeloop: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        # The last line of defence for files written outside the ledger and cache seams (verdict
        # files, reports, the lock): a full disk, a read-only folder, a refused permission only.
        from optimizer.workspace.storage import os_fault

        fault = os_fault(exc, Path(getattr(args, "workspace", None) or ".").resolve())
        if fault is None:
            raise
        print(f"judgeloop: error: {fault}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("judgeloop: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
