"""The judge's editable surface: ``prompts/judge.md``, ``rubric.md``, ``judge.toml``, ``library.md``.

Templates use ``{{name}}`` placeholders from a fixed set (see ``PLACEHOLDERS``); any other name is a
`UserError` naming the file and line. HTML comments (``<!-- ... -->``) are notes for people: they
are removed before the prompt is sent and placeholders inside them are ignored. Two kinds of marker
comments structure the files:

- ``<!-- judgeloop:protected:begin -->`` / ``<!-- judgeloop:protected:end -->`` fence text the
  optimiser may not edit (the output contract in judge.md); see `protected_line_ranges`.
- ``<!-- judgeloop:library:begin -->`` / ``<!-- judgeloop:library:end -->`` in rubric.md hold the
  instruction-library entries currently enabled; see `parse_library`, `enabled_entries`,
  `with_entries`.

``judge.toml``'s optional ``[panel]`` (`PanelSettings`) names panel members; a named member's
instructions are ``prompts/members/<name>.md``, validated like judge.md and read only when named.

Everything here is pure except `PromptSet.from_dir` / `PromptSet.from_rev`, which read the files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, model_validator

from optimizer.errors import UserError, first_error
from optimizer.judge.cascade import CascadeSettings, cascade_files, cascade_templates
from optimizer.judge.memory import EMPTY_MEMORY, MEMORY_FILES, Memory, memory_from_files
from optimizer.judge.types import CacheTTL, Layout, Sampling
from optimizer.models import MISTAKE_TYPES
from optimizer.structure import MOVABLE_KEYS
from optimizer.workspace.paths import JUDGE_TOML, check_unlinked

# The largest panel a library entry may name (the run's [optimizer] max_members caps it further).
MAX_PANEL = 15

if TYPE_CHECKING:
    from optimizer.workspace.workspace import Workspace

JUDGE_MD = "prompts/judge.md"
RUBRIC_MD = "prompts/rubric.md"
LIBRARY_MD = "prompts/library.md"
# Optional instructions of the criteria and review calls (`optimizer.judge.criteria`); built-in
# defaults when absent.
CRITERIA_MD = "prompts/criteria.md"
REVIEW_MD = "prompts/review.md"
REQUIRED_FILES: tuple[str, ...] = (JUDGE_MD, RUBRIC_MD, JUDGE_TOML)
# The files whose content determines the judge's requests (library.md only feeds the optimiser); the
# optional ones (criteria.md, review.md, and the memory files under prompts/memory/) count in the prompt
# hash only when present.
JUDGE_FILES: tuple[str, ...] = (JUDGE_MD, RUBRIC_MD, JUDGE_TOML, CRITERIA_MD, REVIEW_MD)
# Every file a prompt set is read from besides the required ones.
OPTIONAL_FILES: tuple[str, ...] = (LIBRARY_MD, CRITERIA_MD, REVIEW_MD, *MEMORY_FILES)
# A panel member's own instructions: prompts/members/<name>.md (see `PanelSettings`); they count as
# judge files (prompt hash, guards) once judge.toml's [panel] names them.
MEMBERS_DIR = "prompts/members"
MAX_PANEL_MEMBERS = 9
_MEMBER_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")

PROTECTED_BEGIN = "<!-- judgeloop:protected:begin -->"
PROTECTED_END = "<!-- judgeloop:protected:end -->"
LIBRARY_BEGIN = "<!-- judgeloop:library:begin -->"
LIBRARY_END = "<!-- judgeloop:library:end -->"
LIBRARY_HEADING = "## Additional rules"

# The documented placeholder set, and which file may use which.
PLACEHOLDERS: dict[str, str] = {
    "rubric": "the text of prompts/rubric.md with its own placeholders filled in (judge.md only)",
    "mistake_types": "the three mistake types, quoted and comma-separated",
    "screenshots": "one sentence describing how screenshots are sent, from judge.toml",
}
_ALLOWED: dict[str, frozenset[str]] = {
    JUDGE_MD: frozenset({"rubric", "mistake_types", "screenshots"}),
    RUBRIC_MD: frozenset({"mistake_types", "screenshots"}),
    LIBRARY_MD: frozenset({"mistake_types", "screenshots"}),
    CRITERIA_MD: frozenset({"mistake_types"}),
    REVIEW_MD: frozenset({"mistake_types", "screenshots"}),
}

# The system prompt of the trajectory-first layout. Deliberately code, not a file under prompts/: no
# candidate, allowed_files setting or hand edit of the prompt files can change it, so it stays the
# start of every cached prefix. Changing it here re-pays every trajectory once (and the render-code
# hash in the request memo picks the change up).
STATIC_SYSTEM_PROMPT = """\
You evaluate recorded runs of computer-use agents. An agent was given an instruction and operated a \
desktop computer to carry it out. The user message gives you, in this order: the instruction (the \
goal); the recorded trajectory, as numbered steps, each with the action the agent took and, when \
included, a screenshot of the screen just before that action; then the judging instructions and the \
rubric to apply, which end with the exact output format. Read the whole trajectory, then judge it \
exactly as the judging instructions after it say, and answer only in the output format they set.
"""
STATIC_AGENTIC_SYSTEM_PROMPT = """\
You evaluate recorded runs of computer-use agents. An agent was given an instruction and operated a \
desktop computer to carry it out. The user message gives you, in this order: the instruction (the \
goal); an index of the recorded trajectory, one line per numbered step with the action the agent \
took; then the judging instructions and the rubric to apply, which end with the exact output format. \
Tools give you the full record of steps and the screenshots. Investigate as the judging instructions \
after the index say, and give your answer only as they set.
"""

_PLACEHOLDER_RE = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
_COMMENT_RE = re.compile(r"<!--.*?-->", re.DOTALL)
_ENTRY_MARK_RE = re.compile(r"^\s*<!-- judgeloop:entry ([a-z0-9][a-z0-9-]*) -->\s*$")
_LIBRARY_ID_RE = re.compile(r"^lib-[a-z0-9]+(?:-[a-z0-9]+)*$")


# --------------------------------------------------------------------------- settings


def member_file(name: str) -> str:
    """The workspace path of panel member ``name``'s instructions (a name `PanelSettings` accepted)."""
    return f"{MEMBERS_DIR}/{name}.md"


class PanelSettings(BaseModel):
    """``[panel]`` of judge.toml: several judge calls per verdict, combined by a vote.

    ``members``: names of ``prompts/members/<name>.md`` files (each a member's own instructions,
    written like judge.md) or a count of independent calls with judge.md's instructions. ``vote``:
    "unanimous" (success only if every member says so), "majority", or "at_least:K" successes.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    members: list[StrictStr] | StrictInt = Field(
        description=f"names of {MEMBERS_DIR}/<name>.md files, each a member's own instructions written like judge.md, "
        f"or a number 2-{MAX_PANEL_MEMBERS} of independent calls with judge.md's instructions"
    )
    vote: str = Field(
        description='"unanimous" (success only if every member says so), "majority" or "at_least:K" (K members, '
        "1 <= K <= members); a member whose reply does not parse votes against"
    )

    @model_validator(mode="after")
    def _valid(self) -> PanelSettings:
        if isinstance(self.members, int):
            if not 2 <= self.members <= MAX_PANEL_MEMBERS:
                raise ValueError(
                    f"members = {self.members}: a panel of identical members has 2 to {MAX_PANEL_MEMBERS} members "
                    "(remove [panel] for a single judge)"
                )
        else:
            if not 1 <= len(self.members) <= MAX_PANEL_MEMBERS:
                raise ValueError(
                    f"members names {len(self.members)} members; a panel has 1 to {MAX_PANEL_MEMBERS}"
                )
            for name in self.members:
                if not _MEMBER_NAME_RE.match(name):
                    raise ValueError(
                        f"member {name[:60]!r} is not a member name; use lower-case letters, digits, '-' and '_' "
                        f"(the file is {MEMBERS_DIR}/<name>.md)"
                    )
            if len(set(self.members)) != len(self.members):
                raise ValueError("members names a member twice; each name once")
        self.required()  # the vote must be valid for this many members
        return self

    @property
    def size(self) -> int:
        return self.members if isinstance(self.members, int) else len(self.members)

    def labels(self) -> list[str]:
        """Each member's label (the ledger, the TUI and the report show it): its name, or m1, m2..."""
        if isinstance(self.members, int):
            return [f"m{i + 1}" for i in range(self.members)]
        return list(self.members)

    def named(self) -> list[str]:
        """The member names that are files (none for ``members = N``)."""
        return [] if isinstance(self.members, int) else list(self.members)

    def required(self) -> int:
        """Success votes a success verdict needs."""
        n = self.size
        if self.vote == "unanimous":
            return n
        if self.vote == "majority":
            return n // 2 + 1
        head, _, count = self.vote.partition(":")
        if head != "at_least" or not count.isdigit():
            raise ValueError(f'vote = {self.vote[:40]!r}: use "unanimous", "majority" or "at_least:K"')
        k = int(count)
        if not 1 <= k <= n:
            raise ValueError(f"vote = {self.vote!r}: K must be between 1 and the {n} members")
        return k


class JudgeSettings(BaseModel):
    """``prompts/judge.toml``: judge mode, screenshot policy, image size, tiling, budget, sampling.

    Image sizes are pixels; ``token_budget`` is estimated input tokens per request.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["direct", "agentic"] = Field(
        default="direct",
        description="direct: one request holding the whole trajectory, one verdict; agentic: a tool-using "
        "conversation per verdict (anthropic, openai)",
    )
    # Where the editable instructions go. "rubric-first" (what a judge.toml without the key means):
    # judge.md + rubric as the system prompt, then the trajectory. "trajectory-first" (the bundled
    # default): a fixed system prompt no candidate can change, the trajectory, a cache breakpoint, then
    # the instructions, so every candidate after the first re-reads the trajectory from the provider's
    # prompt cache. See `optimizer.judge.render`.
    layout: Layout = Field(
        default="rubric-first",
        description="where the editable instructions go: trajectory-first (the bundled default: after the cached "
        "trajectory) or rubric-first (in the system prompt; what a judge.toml without the key means)",
    )
    # Anthropic cache lifetime of the trajectory prefix (trajectory-first only): a loop revisits each item
    # once per candidate, usually more than 5 minutes apart.
    cache_ttl: CacheTTL = Field(
        default="1h",
        description="Anthropic: how long the cached trajectory lives (1h: writes cost 2x input; 5m: 1.25x)",
    )
    agent_max_turns: int = Field(default=12, ge=2, le=100, description="agentic: model calls per verdict")
    # A conversation re-sends every screenshot it has shown; the Anthropic API takes at most 100 per request.
    agent_max_screenshots: int = Field(
        default=24, ge=0, le=100, description="agentic: screenshots the judge may view per verdict"
    )
    screenshots: Literal["all", "every_k", "spaced", "none"] = Field(
        default="all",
        description="which steps get their screenshot: every step, every k-th (and the last), max_images evenly "
        "spaced, or none",
    )
    every_k: int = Field(default=5, ge=1, description='the step stride of screenshots = "every_k"')
    max_images: int | None = Field(  # the Anthropic API caps images per request at 100
        default=100,
        ge=2,
        description="the most screenshots per request, for every policy (required by spaced; unset: no limit)",
    )
    image_width: int = Field(
        default=512, ge=16, le=4096, description="every screenshot is resized to this width, pixels"
    )
    image_height: int = Field(default=332, ge=16, le=4096, description="... and this height, pixels")
    jpeg_quality: int = Field(default=80, ge=1, le=95, description="the JPEG quality screenshots are sent at")
    tiling: bool = Field(
        default=False, description="four consecutive screenshots in one 2x2 image, read row by row"
    )
    token_budget: int | None = Field(
        default=None,
        ge=256,
        description="estimated input tokens per request; over it the renderer drops middle screenshots, then "
        "shortens and elides middle steps (unset: no budget)",
    )
    max_tokens: int = Field(default=1024, ge=16, description="the longest verdict, output tokens")
    temperature: float | None = Field(
        default=None, ge=0.0, le=2.0, description="sampling temperature (unset: the provider's default)"
    )
    top_p: float | None = Field(
        default=None, gt=0.0, le=1.0, description="nucleus sampling (unset: the provider's default)"
    )
    replicates: int = Field(
        default=1,
        ge=1,
        le=15,
        description="independent judge calls per item; the majority verdict is scored (--replicates overrides)",
    )
    # Judging with memory (prompts/memory/, `optimizer.judge.memory`): "off" sends no memory (requests
    # exactly as without the key); "retrieve" adds principles.md and the memory_k cases most similar to the
    # instruction after the trajectory, never a case from the item's own fold of the memory_folds
    # pair-aware folds (cross-fitting).
    memory: Literal["off", "retrieve"] = Field(
        default="off",
        description="retrieve: send prompts/memory/principles.md and the memory_k most similar cases after the "
        "trajectory; off: no memory",
    )
    memory_k: int = Field(default=4, ge=1, le=16, description="cases sent per item under memory = retrieve")
    memory_folds: int = Field(
        default=5,
        ge=2,
        le=20,
        description="pair-aware folds the judged split is dealt into: an item never gets a case from, or about, "
        "an item of its own fold (cross-fitting)",
    )
    # A panel of judge calls per verdict (None: the single judge), see `PanelSettings`.
    panel: PanelSettings | None = Field(
        default=None, description="several judge calls per verdict, combined by a vote (see [panel])"
    )
    # How a verdict is reached: "single" (one call) or "criteria" (one call derives the instruction's
    # requirements from the instruction alone, a second checks each against the trajectory).
    structure: Literal["single", "criteria", "cascade"] = Field(
        default="single",
        description="single: one call per verdict; criteria: one call derives the instruction's requirements, a "
        "second checks each against the trajectory; cascade: a second judge on the escalated verdicts ([cascade])",
    )
    cascade: CascadeSettings | None = Field(default=None, description="the cascade's rule and second judge")
    # "success": every success verdict gets a review call that may turn it into a failure with cited steps.
    review: Literal["off", "success"] = Field(
        default="off",
        description="success: every success verdict gets a review call that may turn it into a failure citing steps",
    )

    @model_validator(mode="after")
    def _spaced_needs_a_count(self) -> JudgeSettings:
        if self.screenshots == "spaced" and self.max_images is None:
            raise ValueError('screenshots = "spaced" needs max_images (how many screenshots in total)')
        return self

    def dump(self) -> dict[str, object]:
        """The settings as results record them; the memory keys only when memory is on, [cascade] only when
        set (so results of a judge without them read exactly as before the keys existed)."""
        data = self.model_dump(mode="json")
        if self.memory == "off":
            for key in ("memory", "memory_k", "memory_folds"):
                data.pop(key)
        if self.cascade is None:
            data.pop("cascade")
        return data

    def sampling(self) -> Sampling:
        """The sampling parameters the user set (None values are not sent to the provider)."""
        return Sampling(max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p)

    def screenshot_sentence(self) -> str:
        """What the ``{{screenshots}}`` placeholder expands to."""
        if self.mode == "agentic":
            if self.screenshots == "none" or self.agent_max_screenshots == 0:
                return "No screenshots are available: judge from the recorded actions alone."
            return (
                "No screenshot is sent up front. Look at the screens you need with the view_screenshots "
                f"tool (each shows the screen just before that step's action, {self.image_width}x"
                f"{self.image_height} pixels; at most {self.agent_max_screenshots} per trajectory)."
            )
        if self.screenshots == "none":
            return "No screenshots are sent: judge from the recorded actions alone."
        which = {
            "all": "Every step has its screenshot",
            "every_k": f"Every {self.every_k}th step (and the last step) has its screenshot",
            "spaced": f"Up to {self.max_images} evenly spaced steps, always including the first and last, "
            "have their screenshot",
        }[self.screenshots]
        size = f"resized to {self.image_width}x{self.image_height} pixels"
        if self.tiling:
            return (
                f"{which}, {size}; four consecutive screenshots are combined into one 2x2 image, read "
                "row by row (top-left, top-right, bottom-left, bottom-right), and the text before each "
                "such image says which step is in which position."
            )
        return f"{which}, {size}, placed right after that step's text."


def parse_settings(text: str, source: str) -> JudgeSettings:
    """Validate the text of a ``judge.toml``; any problem is one `UserError` naming ``source``."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{source}: not valid TOML ({exc}); fix the file and retry") from None
    try:
        return JudgeSettings.model_validate(data)
    except ValidationError as exc:
        first = first_error(exc)
        raise UserError(f"{source}: [{first.where('file')}] {first.reason}; fix the file and retry") from None


# --------------------------------------------------------------------------- templates


def _strip_comments_keep_lines(text: str) -> str:
    """Blank out HTML comments but keep their newlines, so line numbers stay right."""
    return _COMMENT_RE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def check_placeholders(text: str, source: str, allowed: Iterable[str]) -> None:
    """Raise `UserError` ``"<source>:<line>: unknown placeholder {{x}} ..."`` for the first bad one."""
    allowed_set = frozenset(allowed)
    for lineno, line in enumerate(_strip_comments_keep_lines(text).splitlines(), start=1):
        for m in _PLACEHOLDER_RE.finditer(line):
            if m.group(1) not in allowed_set:
                known = ", ".join("{{" + n + "}}" for n in sorted(allowed_set)) or "none"
                raise UserError(
                    f"{source}:{lineno}: unknown placeholder {m.group(0)}; the placeholders allowed in "
                    f"this file are {known}"
                )


def check_markers(text: str, source: str) -> None:
    """Protected and library markers must each come in begin/end pairs, not nested, on their own line."""
    for kind, begin, end in (
        ("protected", PROTECTED_BEGIN, PROTECTED_END),
        ("library", LIBRARY_BEGIN, LIBRARY_END),
    ):
        open_line: int | None = None
        regions = 0
        for lineno, line in enumerate(text.splitlines(), start=1):
            stripped = line.strip()
            if (begin in line and stripped != begin) or (end in line and stripped != end):
                raise UserError(f"{source}:{lineno}: a judgeloop {kind} marker must stand alone on its line")
            if stripped == begin:
                if open_line is not None:
                    raise UserError(
                        f"{source}:{lineno}: {kind} region opened again before the one at line {open_line} "
                        f"was closed; add {end}"
                    )
                open_line = lineno
            elif stripped == end:
                if open_line is None:
                    raise UserError(
                        f"{source}:{lineno}: {end} without a matching {begin}; remove it or add one"
                    )
                open_line = None
                regions += 1
        if open_line is not None:
            raise UserError(f"{source}:{open_line}: {kind} region is never closed; add {end}")
        if kind == "library" and regions > 1:
            raise UserError(f"{source}: more than one library region; keep exactly one")


def protected_line_ranges(text: str) -> list[tuple[int, int]]:
    """1-based inclusive line ranges of protected regions, markers included (for the loop's guards)."""
    ranges: list[tuple[int, int]] = []
    start: int | None = None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip() == PROTECTED_BEGIN:
            start = lineno
        elif line.strip() == PROTECTED_END and start is not None:
            ranges.append((start, lineno))
            start = None
    return ranges


def protected_blocks(text: str) -> list[str]:
    """The text of each protected region, markers included: a guard compares these before/after an edit."""
    lines = text.splitlines()
    return ["\n".join(lines[a - 1 : b]) for a, b in protected_line_ranges(text)]


def fill(text: str, values: Mapping[str, str]) -> str:
    """Remove HTML comments, substitute placeholders, and tidy blank lines. Names must be checked first."""
    body = _COMMENT_RE.sub("", text)
    body = _PLACEHOLDER_RE.sub(lambda m: values[m.group(1)], body)
    # A removed comment leaves an empty line (or trailing spaces); collapse the gaps it leaves.
    body = "\n".join(line.rstrip() for line in body.splitlines())
    body = re.sub(r"\n{3,}", "\n\n", body)
    return body.strip() + "\n"


def mistake_types_text() -> str:
    """The three mistake types as the prompt lists them: quoted, comma-separated."""
    return ", ".join(f'"{t}"' for t in MISTAKE_TYPES)


# --------------------------------------------------------------------------- the prompt set


@dataclass(frozen=True)
class PromptSet:
    """One revision of the judge's editable surface, validated.

    ``files`` maps workspace-relative paths (``prompts/judge.md``...) to their text; ``source`` says
    where they were read from, for messages.
    """

    judge_md: str
    rubric_md: str
    settings: JudgeSettings
    files: dict[str, str]
    source: str = "prompts"
    memory: Memory = EMPTY_MEMORY

    @classmethod
    def from_files(cls, files: Mapping[str, str], *, source: str = "prompts") -> PromptSet:
        """Validate a mapping of ``prompts/...`` paths to text (placeholders, markers, settings, library)."""

        def where(name: str) -> str:
            return f"{source}/{name.removeprefix('prompts/')}"

        for name in REQUIRED_FILES:
            if name not in files:
                raise UserError(f"{where(name)} is missing; restore it (e.g. from a fresh `judgeloop init`)")
        for name, allowed in _ALLOWED.items():
            if name in files:
                check_placeholders(files[name], where(name), allowed)
                check_markers(files[name], where(name))
        if LIBRARY_MD in files:
            parse_library(files[LIBRARY_MD], where(LIBRARY_MD))
        settings = parse_settings(files[JUDGE_TOML], where(JUDGE_TOML))
        for name in settings.panel.named() if settings.panel is not None else []:
            path = member_file(name)
            if path not in files:
                raise UserError(
                    f"{where(path)} is missing: judge.toml's [panel] names member {name!r}; write that file "
                    "(a member's instructions, like judge.md) or remove the name"
                )
            check_placeholders(files[path], where(path), _ALLOWED[JUDGE_MD])
            check_markers(files[path], where(path))
        for path, like in cascade_templates(settings.structure, settings.cascade, files, where):
            check_placeholders(files[path], where(path), _ALLOWED[like])
            check_markers(files[path], where(path))
        return cls(
            judge_md=files[JUDGE_MD],
            rubric_md=files[RUBRIC_MD],
            settings=settings,
            files=dict(files),
            source=source,
            memory=memory_from_files(files, source),
        )

    @classmethod
    def from_dir(cls, path: Path | str) -> PromptSet:
        """Read ``judge.md``, ``rubric.md``, ``judge.toml`` (and ``library.md`` if present) from a folder."""
        folder = Path(path)
        if not folder.is_dir():
            raise UserError(
                f"{folder} is not a folder of judge prompts; pass the workspace's prompts/ folder"
            )
        files: dict[str, str] = {}
        memory_dir = folder / "memory"
        if memory_dir.is_symlink():  # a linked folder would let the judge send any file as memory
            raise UserError(
                f"{memory_dir} is a symbolic link (to {memory_dir.readlink()}); make it a real folder"
            )
        for name in (*REQUIRED_FILES, *OPTIONAL_FILES):
            file = folder / name.removeprefix("prompts/")
            if file.is_symlink() or file.is_file():
                # A link could make the judge read (and send) any file, held-out labels included.
                check_unlinked(file, name if folder.name == "prompts" else str(file))
                try:
                    files[name] = file.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError) as exc:
                    raise UserError(f"{file}: cannot read it as UTF-8 text ({exc}); fix the file") from None
        for name in structure_files(files):
            file = folder / name.removeprefix("prompts/")
            if file.parent.is_symlink():  # prompts/members/ or the cascade's folder
                check_unlinked(file.parent, name.rpartition("/")[0])
            if file.is_symlink() or file.is_file():
                check_unlinked(file, name if folder.name == "prompts" else str(file))
                try:
                    files[name] = file.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError) as exc:
                    raise UserError(f"{file}: cannot read it as UTF-8 text ({exc}); fix the file") from None
        return cls.from_files(files, source=str(folder))

    @classmethod
    def from_rev(cls, ws: Workspace, rev: str) -> PromptSet:
        """Read the prompt files as committed at git revision ``rev`` of the workspace (not the tree)."""
        from optimizer.workspace.gitops import resolve_commit
        from optimizer.workspace.workspace import repo_at

        files: dict[str, str] = {}
        with repo_at(ws.root) as repo:
            commit = resolve_commit(repo, rev)
            for names in ((*REQUIRED_FILES, *OPTIONAL_FILES), None):
                for name in names if names is not None else structure_files(files):
                    try:
                        blob = commit.tree / name
                    except KeyError:
                        continue
                    try:
                        files[name] = blob.data_stream.read().decode("utf-8")
                    except UnicodeDecodeError:
                        raise UserError(f"{name}@{rev}: not UTF-8 text; fix the file and commit it") from None
        return cls.from_files(files, source=f"prompts@{rev}")

    def prompt_hash(self) -> str:
        """sha256 over judge.md, rubric.md, judge.toml, the panel's member files, and criteria.md,
        review.md and the memory files when present (the files that determine requests; without a
        [panel] or any optional file, exactly the first three as before they existed)."""
        h = hashlib.sha256()
        for name in self.judge_files():
            h.update(name.encode() + b"\0" + self.files[name].encode() + b"\0")
        return h.hexdigest()

    def judge_files(self) -> tuple[str, ...]:
        """The files that determine this judge's requests, those present: `JUDGE_FILES`, the panel's
        member files and the memory files."""
        panel = self.settings.panel
        named = (member_file(n) for n in (panel.named() if panel is not None else []))
        second = cascade_files(self.files)
        return tuple(n for n in (*JUDGE_FILES, *named, *second, *MEMORY_FILES) if n in self.files)

    def for_member(self, index: int) -> PromptSet:
        """The prompt set panel member ``index`` judges with: its member file in judge.md's place
        (``members = [...]``), or this one (``members = N``). Its settings have no panel."""
        panel = self.settings.panel
        if panel is None:
            raise ValueError("for_member: this prompt set has no [panel]")
        settings = self.settings.model_copy(update={"panel": None})
        named = panel.named()
        judge_md = self.files[member_file(named[index])] if named else self.judge_md
        return dataclasses.replace(self, judge_md=judge_md, settings=settings)

    def placeholder_values(self) -> dict[str, str]:
        """Values of the placeholders shared by every template."""
        return {"mistake_types": mistake_types_text(), "screenshots": self.settings.screenshot_sentence()}

    @property
    def trajectory_first(self) -> bool:
        """Whether requests put the trajectory before the editable instructions (``layout``)."""
        return self.settings.layout == "trajectory-first"

    def instructions(self) -> str:
        """The editable judge instructions: judge.md with the rubric inserted (the output contract at
        its end). The system prompt under ``rubric-first``; after the trajectory under ``trajectory-first``."""
        return self.system_prompt()

    def system_prompt(self) -> str:
        """judge.md with the rubric inserted, comments and markers removed, placeholders filled."""
        values = self.placeholder_values()
        rubric = fill(self.rubric_md, values).rstrip("\n")
        return fill(self.judge_md, {**values, "rubric": rubric})

    def library(self) -> list[LibraryEntry]:
        """The instruction library's entries ([] when the prompt set has no library.md)."""
        text = self.files.get(LIBRARY_MD)
        return [] if text is None else parse_library(text, f"{self.source}/library.md")


def structure_files(files: Mapping[str, str]) -> list[str]:
    """The member files judge.toml's [panel] names and the second judge's files its [cascade] names ([]
    when none or it does not parse: `PromptSet.from_files` reports that). Names are validated before any
    path is built."""
    text = files.get(JUDGE_TOML)
    if text is None:
        return []
    try:
        panel = parse_settings(text, JUDGE_TOML).panel
    except UserError:
        return []
    return [*([member_file(n) for n in panel.named()] if panel is not None else []), *cascade_files(files)]


# --------------------------------------------------------------------------- the instruction library


STRUCTURE_PREFIX = "judge.toml:"


@dataclass(frozen=True)
class LibraryEntry:
    """One entry of the instruction library: a stable id and one paragraph of text. A *structural*
    entry's paragraph is ``judge.toml: key = value, key = value`` (keys of `optimizer.structure`'s
    table): enabling it sets those judge.toml keys instead of adding a rubric rule."""

    id: str
    text: str

    @property
    def structure(self) -> dict[str, object] | None:
        """A structural entry's judge.toml settings (dotted key → value); None for a rubric rule."""
        if not self.text.startswith(STRUCTURE_PREFIX):
            return None
        return _structure_settings(self.text.removeprefix(STRUCTURE_PREFIX))


def _structure_settings(assignments: str) -> dict[str, object]:
    """``key = value, key = value`` as an inline TOML table, flattened to dotted keys (ValueError if not)."""
    try:
        table = tomllib.loads("v = {" + assignments.strip() + "}")["v"]
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"not TOML assignments ({exc})") from None
    out: dict[str, object] = {}

    def walk(node: Mapping[str, object], prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, Mapping):
                walk(value, f"{prefix}{key}.")
            else:
                out[f"{prefix}{key}"] = value

    walk(table, "")
    return out


def parse_library(text: str, source: str = LIBRARY_MD) -> list[LibraryEntry]:
    """Entries of a library file: ``## lib-id`` headings each followed by one paragraph (see library.md)."""
    entries: list[LibraryEntry] = []
    seen: dict[str, int] = {}
    current: tuple[str, int] | None = None
    body: list[str] = []

    def close() -> None:
        if current is None:
            return
        entry_id, line = current
        words = " ".join(" ".join(body).split())
        if not words:
            raise UserError(
                f"{source}:{line}: library entry {entry_id} has no text; write its rule below the heading"
            )
        entry = LibraryEntry(entry_id, words)
        try:
            settings = entry.structure
        except ValueError as exc:
            raise UserError(
                f"{source}:{line}: structural entry {entry_id} is {exc}; write "
                "'judge.toml: key = value, key = value'"
            ) from None
        if settings is not None:
            bad = _bad_structure(settings)
            if bad:
                raise UserError(f"{source}:{line}: structural entry {entry_id}: {bad}")
        entries.append(entry)

    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.startswith("## "):
            close()
            entry_id = line[3:].strip()
            if not _LIBRARY_ID_RE.match(entry_id):
                raise UserError(
                    f"{source}:{lineno}: {entry_id!r} is not a library id; use lower-case words joined by "
                    "hyphens starting with lib- (e.g. lib-final-state)"
                )
            if entry_id in seen:
                raise UserError(
                    f"{source}:{lineno}: library id {entry_id} repeats line {seen[entry_id]}; ids are unique"
                )
            seen[entry_id] = lineno
            current, body = (entry_id, lineno), []
        elif current is not None:
            if line.startswith("#"):
                raise UserError(f"{source}:{lineno}: only '## lib-id' headings may follow the first entry")
            body.append(line)
    close()
    return entries


def _bad_structure(settings: Mapping[str, object]) -> str | None:
    """Why a structural entry's settings are not moves of `optimizer.structure`'s table (None: they are)."""
    if not settings:
        return "it sets no key"
    for key, value in settings.items():
        spec = MOVABLE_KEYS.get(key)
        if spec is None:
            return f"{key} is not a movable judge.toml key ({', '.join(MOVABLE_KEYS)})"
        # The panel cap is the run's ([optimizer] max_members): the guards check it; here only the form.
        bad = spec.check(value, MAX_PANEL)
        if bad is not None:
            return f"{key} {bad}"
    return None


def _library_region(rubric_text: str) -> tuple[list[str], int, int]:
    lines = rubric_text.splitlines()
    stripped = [line.strip() for line in lines]
    if LIBRARY_BEGIN not in stripped or LIBRARY_END not in stripped:
        raise UserError(
            f"rubric.md has no library region; add the lines {LIBRARY_BEGIN} and {LIBRARY_END} where library "
            "rules should go"
        )
    begin = stripped.index(LIBRARY_BEGIN)
    end = stripped.index(LIBRARY_END)
    if end < begin:
        raise UserError(f"rubric.md: {LIBRARY_END} comes before {LIBRARY_BEGIN}; swap them")
    return lines, begin, end


def enabled_entries(rubric_text: str) -> list[str]:
    """Ids of the library entries enabled in the rubric's library region, in the order they appear."""
    lines, begin, end = _library_region(rubric_text)
    ids = []
    for line in lines[begin + 1 : end]:
        m = _ENTRY_MARK_RE.match(line)
        if m:
            ids.append(m.group(1))
    return ids


def render_entries(entries: Sequence[LibraryEntry]) -> str:
    """The text that goes between the library markers: a heading and one marked bullet per entry."""
    if not entries:
        return ""
    out = [LIBRARY_HEADING, ""]
    for entry in entries:
        out.append(f"<!-- judgeloop:entry {entry.id} -->")
        out.append(f"- {entry.text}")
    return "\n".join(out)


def with_entries(rubric_text: str, library: Sequence[LibraryEntry], enabled_ids: Iterable[str]) -> str:
    """Rubric text whose library region holds exactly ``enabled_ids``, in library order.

    Everything outside the region is unchanged. An id not in ``library`` is a ValueError (a caller bug).
    """
    wanted = set(enabled_ids)
    known = {e.id for e in library}
    unknown = sorted(wanted - known)
    if unknown:
        raise ValueError(f"unknown library ids: {', '.join(unknown)}")
    lines, begin, end = _library_region(rubric_text)
    block = render_entries([e for e in library if e.id in wanted])
    middle = block.splitlines() if block else []
    new_lines = [*lines[: begin + 1], *middle, *lines[end:]]
    trailing = "\n" if rubric_text.endswith("\n") else ""
    return "\n".join(new_lines) + trailing
