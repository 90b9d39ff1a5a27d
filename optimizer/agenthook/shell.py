"""The paths a shell command names, checked against the fence.

Read as bash would split it (quotes removed, ``;``, ``&&``, ``|``, ``(``, ``<``, ``>`` between commands):
every word and every path-like piece inside a word (``HEAD:devset/x``, ``--file=x``, ``open('x')`` in a
``python -c`` script), each read from the current folder and from every folder a ``cd``, ``pushd`` or ``-C``
moves to; the folders a recursive program walks (``grep -r``, ``find``, ``rg``, ``cp -r``, ``tar``); and
git's readers of committed files (``cat-file``, ``show``, ``diff``, ``log -p``), which need paths that stay
outside the protected places. A command built at run time (``$(echo ... | base64 -d)``, a variable set by
another program) is out of its reach: see docs/integrations/agent-hosts.md.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from optimizer.agenthook.fence import PROTECTED, Fence, Reach
from optimizer.workspace.paths import CORRECTIONS_FILE, DEVSET_DIR

SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "fish"})
# Words that run the command after them: the program is the next word that is not an option.
WRAPPERS = frozenset(
    {"sudo", "doas", "env", "nice", "ionice", "nohup", "time", "command", "builtin", "exec", "xargs", "timeout",
     "stdbuf", "watch", "strace", "unbuffer"}
)  # fmt: skip
# Programs that walk every folder they are given, or the current one when given none.
WALKERS = frozenset({"find", "rg", "ag", "ack", "tree", "du", "fd", "fdfind", "rgrep"})
# Programs that walk the folders they are given as a whole.
ARCHIVERS = frozenset({"tar", "zip", "7z", "rsync", "cpio"})
# Programs that walk folders with a recursive option (the letters of its short form).
RECURSIVE_WITH = {
    "grep": "rR", "egrep": "rR", "fgrep": "rR", "zgrep": "rR", "ls": "R", "cp": "rRa", "scp": "r",
    "chmod": "R", "chown": "R", "chgrp": "R", "rm": "rR", "diff": "r",
}  # fmt: skip
RECURSIVE_LONG = frozenset({"--recursive", "--dereference-recursive", "--archive", "--directories=recurse"})
# Programs whose recursive form searches the current folder when given none.
DEFAULTS_TO_HERE = frozenset({"grep", "egrep", "fgrep", "zgrep", "ls"})
CHANGE_DIR = frozenset({"cd", "pushd"})
DIR_OPTIONS = frozenset({"-C", "--directory", "--git-dir", "--work-tree", "--cwd"})

# git subcommands that read objects straight from the repository (any committed file, devset/ included).
GIT_OBJECT_READERS = frozenset(
    {"cat-file", "archive", "bundle", "fast-export", "format-patch", "unpack-file", "show-index", "verify-pack",
     "get-tar-commit-id"}
)  # fmt: skip
# git subcommands that always print committed or changed files' text.
GIT_CONTENT = frozenset({"show", "diff", "grep", "blame", "annotate", "difftool", "range-diff"})
# git subcommands that print files' text with a patch option.
GIT_PATCH_OPTIONAL = frozenset({"log", "whatchanged", "reflog", "stash"})
GIT_PATCH_FLAGS = (
    "-p",
    "-u",
    "--patch",
    "--patch-with-stat",
    "--patch-with-raw",
    "--cc",
    "-c",
    "--word-diff",
    "-L",
)
# With one of these and no patch option, show/diff print names and counts, not text.
GIT_NO_TEXT = frozenset(
    {"--stat", "--shortstat", "--numstat", "--name-only", "--name-status", "-s", "--no-patch", "--summary",
     "--dirstat", "--raw", "--quiet", "--exit-code"}
)  # fmt: skip
# git subcommands that rewrite files of the working tree from history (their paths are checked as folders).
GIT_WRITERS = frozenset({"checkout", "restore", "reset", "stash", "clean", "rm", "mv", "add", "apply"})
# git subcommands that rewrite the whole working tree when given no paths: devset/ too, a person's uncommitted
# corrections lost (`reset` only with these options; `stash` but its list and show).
GIT_TREE_WRITERS = frozenset(
    {"checkout", "switch", "restore", "reset", "stash", "clean", "merge", "rebase", "pull", "cherry-pick", "revert",
     "am", "apply"}
)  # fmt: skip
GIT_RESET_TREE = frozenset({"--hard", "--merge", "--keep"})
GIT_GLOBAL_WITH_VALUE = frozenset({"-C", "-c", "--git-dir", "--work-tree", "--namespace", "--exec-path"})
# judgeloop's own commands read the labels, the ledger and the held-out splits (report, devset show, confirm):
# the agent reaches the engine through the MCP server's tools. Only these stay open to it.
JUDGELOOP_OPEN = frozenset({"hook", "completion"})
JUDGELOOP_FLAGS_OPEN = frozenset({"--version", "-h", "--help"})
PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")

# Characters that end a path-like piece inside a word.
PIECE_SPLIT = re.compile(r"[\s'\"`;|&<>()=,:\\]+")
COMPONENT_SPLIT = re.compile(r"[/\s'\"`;|&<>()=,:\\{}$]+")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# More folders than this from `cd` and `-C` are not followed (a long chain of cd's is checked from the first).
MAX_BASES = 32


@dataclass(frozen=True)
class Blocked:
    """Why a shell command is blocked: the word that reaches a protected place, and the place (None for a
    git form refused whatever its paths, with `rule` saying why)."""

    word: str
    reach: Reach | None
    rule: str = ""

    def why(self) -> str:
        """One clause: what the word reaches, or the rule it breaks."""
        if self.reach is not None:
            return f"{self.word!r} reaches {self.reach.why()}"
        return f"{self.word!r}: {self.rule}"


def split_words(script: str) -> list[str]:
    """``script`` as bash splits it into words and operators (quotes removed, ``;`` ``&&`` ``|`` ``(`` ``)``
    ``<`` ``>`` separate words, a newline ends a command); an unbalanced quote splits on white space."""
    lexer = shlex.shlex(script.replace("\n", " ; "), posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    lexer.commenters = ""  # a comment's words are checked too: `#` also sits inside words
    try:
        return list(lexer)
    except ValueError:
        return script.replace("\n", " ; ").split()


def _is_operator(word: str) -> bool:
    return bool(word) and all(c in ";&|()<>" for c in word)


def _commands(words: Sequence[str]) -> list[list[str]]:
    """The simple commands among ``words`` (operators dropped), each from its program on: leading
    assignments and wrappers (``sudo``, ``env``, ``xargs``) removed."""
    commands: list[list[str]] = []
    current: list[str] = []
    for word in [*words, ";"]:
        if _is_operator(word):
            if current:
                commands.append(_program_first(current))
            current = []
        else:
            current.append(word)
    return [c for c in commands if c]


def _program_first(words: list[str]) -> list[str]:
    index = 0
    while index < len(words):
        word = words[index]
        wrapped = index > 0 and (
            word.startswith("-") or (words[index - 1] == "timeout" and word[:1].isdigit())
        )
        if ASSIGNMENT.match(word) or os.path.basename(word) in WRAPPERS or wrapped:
            index += 1
        else:
            break
    return words[index:]


def pieces(word: str) -> list[str]:
    """The path-like pieces of one word: the word itself, and its parts between quotes, ``:``, ``=``, ``,``,
    parentheses and the like (``HEAD:devset/x`` → ``devset/x``); ``file://`` and a leading ``@`` dropped."""
    found = [word]
    for piece in PIECE_SPLIT.split(word):
        piece = piece.removeprefix("@")
        if piece and piece not in found and piece not in ("$", "-", "--"):
            found.append(piece)
    return [p.removeprefix("file://") for p in found]


class ShellCheck:
    """One shell command checked against a fence, from the folder ``cwd``."""

    def __init__(self, fence: Fence, cwd: Path) -> None:
        self.fence = fence
        self.cwd = cwd

    def check(self, command: str | Sequence[str]) -> Blocked | None:
        """The first reason to block ``command`` (a script, or an argument vector such as Codex's
        ``["bash", "-lc", "..."]``), or None when it names nothing protected."""
        words = self._words(command)
        bases = self._bases(words)
        commands = _commands(words)
        # A program's name is no path (`cat` after `cd devset` is not a file there); `cd` and `-C` neither.
        names = {c[0] for c in commands if "/" not in c[0]} | CHANGE_DIR | DIR_OPTIONS
        for word in words:
            if _is_operator(word) or word in names:
                continue
            for piece in pieces(word):
                reach = self.fence.path_reach(piece, bases)
                if reach is not None:
                    return Blocked(word, reach)
            reach = self._named_after_substitution(word)
            if reach is not None:
                return Blocked(word, reach)
        for simple in commands:
            blocked = self._walks(simple, bases) or self._git(simple, bases) or _judgeloop(simple)
            if blocked is not None:
                return blocked
        return None

    def _named_after_substitution(self, word: str) -> Reach | None:
        """A word whose folder comes from the shell at run time (``$(pwd)/devset/x``, ``$DIR/.git``): a
        protected name among its parts is taken as the workspace's."""
        if "$" not in word and "`" not in word:
            return None
        for part in COMPONENT_SPLIT.split(word):
            if part in PROTECTED or part == CORRECTIONS_FILE:
                kind = part if part in PROTECTED else DEVSET_DIR
                return Reach(kind, (self.fence.workspace or self.cwd) / part)
        return None

    def _words(self, command: str | Sequence[str]) -> list[str]:
        if isinstance(command, str):
            return split_words(command)
        argv = [str(a) for a in command]
        # ["bash", "-lc", script]: the script is what runs.
        if (
            len(argv) >= 3
            and os.path.basename(argv[0]) in SHELLS
            and argv[1].startswith("-")
            and "c" in argv[1]
        ):
            return [*argv[:2], *split_words(argv[2]), *argv[3:]]
        return argv

    def _bases(self, words: Sequence[str]) -> list[Path]:
        """The folders relative paths are read from: the current one and every folder ``cd``, ``pushd`` or a
        ``-C``-like option names (each from every folder known before it: control flow is not followed)."""
        bases = [self.cwd]
        for index, word in enumerate(words):
            target = None
            if word in CHANGE_DIR or word in DIR_OPTIONS:
                target = words[index + 1] if index + 1 < len(words) else None
                if word in CHANGE_DIR and (target is None or _is_operator(target)):
                    target = "~"
            elif any(word.startswith(f"{option}=") for option in DIR_OPTIONS if option.startswith("--")):
                target = word.split("=", 1)[1]
            if target is None or _is_operator(target) or target == "-":
                continue
            target = os.path.expanduser(os.path.expandvars(target))
            for base in list(bases):
                folder = Path(os.path.normpath(os.path.join(base, target)))
                if folder not in bases and len(bases) < MAX_BASES:
                    bases.append(folder)
        return bases

    def _walks(self, simple: Sequence[str], bases: Sequence[Path]) -> Blocked | None:
        """A recursive program's folders (or the current folders, when it names none) that hold a protected
        place below them."""
        program, args = os.path.basename(simple[0]), simple[1:]
        if program not in WALKERS and program not in ARCHIVERS:
            letters = set(RECURSIVE_WITH.get(program, ""))
            short = [a[1:] for a in args if a.startswith("-") and not a.startswith("--")]
            recursive = any(a in RECURSIVE_LONG for a in args) or any(set(s) & letters for s in short)
            if not letters or not (recursive or (program.endswith("grep") and "recurse" in args)):
                return None
        operands = [a for a in args if not a.startswith("-")]
        for operand in operands:
            for piece in pieces(operand):
                reach = self.fence.tree_reach(piece, bases)
                if reach is not None:
                    return Blocked(operand, reach)
        # Given no file or folder that exists, the program searches where it runs.
        named = any(
            os.path.lexists(os.path.join(base, os.path.expanduser(operand)))
            for operand in operands
            for base in bases
        )
        if (program in WALKERS or program in DEFAULTS_TO_HERE) and not named:
            for base in bases:
                reach = self.fence.tree_reach(".", [base])
                if reach is not None:
                    return Blocked(" ".join(simple), reach)
        return None

    def _git(self, simple: Sequence[str], bases: Sequence[Path]) -> Blocked | None:
        """git's readers of committed files: object readers are refused; the commands that print files'
        text need paths (``-- prompts/``), none of them a protected place or a folder above one."""
        if os.path.basename(simple[0]) != "git":
            return None
        index = 1
        while index < len(simple) and simple[index].startswith("-"):
            index += 2 if simple[index] in GIT_GLOBAL_WITH_VALUE else 1
        if index >= len(simple):
            return None
        sub, args = simple[index], list(simple[index + 1 :])
        shown = f"git {sub}"
        if sub in GIT_OBJECT_READERS:
            return Blocked(
                shown, None, "it reads git's objects, where devset/ is committed; use the MCP tool history"
            )
        prints_text = sub in GIT_CONTENT and not (set(args) & GIT_NO_TEXT and not _patch_flag(args))
        prints_text = prints_text or (sub in GIT_PATCH_OPTIONAL and _patch_flag(args))
        if not prints_text and sub not in GIT_WRITERS | GIT_TREE_WRITERS:
            return None
        limits = _git_paths(args)
        if prints_text and not limits:
            return Blocked(
                shown,
                None,
                f"without paths it prints committed files, devset/ included; name them: {shown} -- prompts/",
            )
        if not limits and _rewrites_tree(sub, args):
            return Blocked(
                shown,
                None,
                "without paths it rewrites the whole working tree, devset/ and a person's corrections included; "
                "the session's git is judgeloop's (name files in prompts/ to restore them)",
            )
        top = [*bases, *([self.fence.workspace] if self.fence.workspace is not None else [])]
        for limit in limits:
            if limit.startswith(":") and limit[1:2] in ("(", "!", "^", "/"):
                return Blocked(
                    limit, None, "git's pathspec magic can widen the paths; name the files plainly"
                )
            reach = self.fence.tree_reach(limit or ".", top)
            if reach is not None:
                return Blocked(limit, reach)
        return None


def _rewrites_tree(sub: str, args: Sequence[str]) -> bool:
    if sub == "reset":
        return bool(set(args) & GIT_RESET_TREE)
    if sub == "stash":
        return not args or args[0] not in ("list", "show")
    return sub in GIT_TREE_WRITERS


def _patch_flag(args: Sequence[str]) -> bool:
    return any(a in GIT_PATCH_FLAGS or (a.startswith("-L") and len(a) > 2) for a in args)


def _git_paths(args: Sequence[str]) -> list[str]:
    """The paths a git command is limited to: the words after ``--``, the path of each ``REV:path``, and the
    words before ``--`` that are not options and look like paths (hold a ``/`` or a ``.``)."""
    if "--" in args:
        cut = args.index("--")
        before, after = args[:cut], args[cut + 1 :]
    else:
        before, after = list(args), []
    paths = list(after)
    for word in before:
        if word.startswith("-"):
            continue
        if ":" in word and not word.startswith(":"):
            paths.append(word.split(":", 1)[1])
        elif "/" in word or word in (".", "..") or word.startswith(":"):
            paths.append(word)
    return paths


def _judgeloop(simple: Sequence[str]) -> Blocked | None:
    """judgeloop's command line (``judgeloop``, ``python -m optimizer.cli``) but `JUDGELOOP_OPEN`."""
    program, args = os.path.basename(simple[0]), list(simple[1:])
    if PYTHON.match(program) and args[:2] == ["-m", "optimizer.cli"]:
        args = args[2:]
    elif program != "judgeloop":
        return None
    index = 0
    while index < len(args) and args[index].startswith("-"):
        index += 2 if args[index] in ("-w", "--workspace") else 1
    if index >= len(args):
        if set(args) <= JUDGELOOP_FLAGS_OPEN:
            return None
        sub = " ".join(args)
    else:
        sub = args[index]
    if sub in JUDGELOOP_OPEN:
        return None
    return Blocked(
        f"judgeloop {sub}",
        None,
        "the agent's judgeloop goes through the MCP server's tools; the command line reads the labels, "
        "the ledger and the held-out splits, and is the person's",
    )
