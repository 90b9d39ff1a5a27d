"""The ``reflect`` strategy: one LLM call rewrites one section of one allowed prompt file.

The request holds the incumbent's allowed files, a direction-aware sample of its dev
disagreements (missed failures and rejected successes balanced, capped), the human guidance and a
short history. The reply must be one JSON object
``{"file", "section_heading", "new_section", "rationale"}``; the section under that Markdown heading
is replaced (`optimizer.strategies.common.splice_section`). When the memory files are allowed the
reply may instead be ``{"memory": [{"tool": "add_case", "arguments": {...}}, ...], "rationale"}``: the
edits run through the agent's memory tools (`optimizer.loop.strategies.tools`), with their checks.
Anything else is a `ProposalError`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from optimizer.judge.memory import MEMORY_FILES
from optimizer.judge.providers import check_optimizer_key
from optimizer.judge.types import ConversationMessage, TextPart, UserMessage
from optimizer.loop.strategies import Proposal, ProposalContext, ProposalError
from optimizer.loop.strategies.common import (
    allowed_path,
    balanced_sample,
    counts_by_direction,
    format_disagreement,
    format_history,
    headings,
    rng_for,
    splice_section,
)
from optimizer.loop.strategies.llm import DEFAULT_MAX_OUTPUT_TOKENS, OptimiserModel
from optimizer.loop.strategies.tools import MEMORY_TOOL_SPECS, ToolState, run_tool
from optimizer.structure import MOVABLE_KEYS, current_value, set_key
from optimizer.workspace.paths import JUDGE_TOML

if TYPE_CHECKING:
    from optimizer.workspace.config import OptimizerSection, Price

MEMORY_TOOL_NAMES: tuple[str, ...] = tuple(t.name for t in MEMORY_TOOL_SPECS)
SAMPLE_CAP = 12
HISTORY_LIMIT = 8

SYSTEM_PROMPT = """\
You improve the prompt of an LLM judge of computer-use trajectories (an instruction plus ~120 steps of \
screenshots and actions). Negatives are coherent executions of a close but different instruction, so the \
judge must check the trajectory against the exact request. A candidate is kept only if agreement with human \
labels (Cohen's kappa) rises on the dev split without raising the false-positive rate.

Rewrite exactly ONE section (the text under one Markdown heading, up to the next heading of the same or a \
higher level) of ONE of the files shown, to fix the judge's disagreements in a way that generalises. Write \
general rules; never quote trajectory ids or phrases of 8+ words from the instructions shown (such \
candidates are rejected unevaluated). Keep the change small (at most {max_diff_lines} changed lines). Do \
not choose a section holding judgeloop protected or library markers, and keep every {{{{placeholder}}}} \
you find in the section.

Answer with one JSON object and nothing else:
{{"file": "<one of the files shown>", "section_heading": "<the heading line of the section, as written>", \
"new_section": "<the full new text of the section, heading line first>", "rationale": "<one paragraph: \
what you changed and which disagreements it should fix>"}}
"""


MEMORY_NOTE = """
The judge also has a memory (prompts/memory/principles.md: general rules sent with every item; \
prompts/memory/cases.jsonl: adjudicated cases, each naming the dev items it comes from, retrieved by \
similarity and never shown for their own items' fold). Instead of a section you may answer \
{{"memory": [{{"tool": "add_case", "arguments": {{"text": "<what the instruction required, what to check, the \
verdict and why>", "source_items": ["<dev trajectory id>", ...]}}}}, ...], "rationale": "<one paragraph>"}} \
with tools add_case (text, source_items, optional id), edit_case (id, text and/or source_items), retire_case \
(id) and edit_principles (text: the whole new principles). Never copy a case or a dev item into the principles.
"""


def system_prompt(ctx: ProposalContext, max_diff_lines: int) -> str:
    """The system prompt; it offers the memory edits when a memory file is allowed."""
    memory = any(f in MEMORY_FILES for f in ctx.allowed_files)
    return SYSTEM_PROMPT.format(max_diff_lines=max_diff_lines) + (MEMORY_NOTE.format() if memory else "")


def build_user_message(ctx: ProposalContext, sample_cap: int = SAMPLE_CAP) -> str:
    """The request text: files, disagreement sample, guidance and history (pure, deterministic)."""
    counts = counts_by_direction(ctx.disagreements)
    sample = balanced_sample(ctx.disagreements, sample_cap, rng_for(ctx.rng_seed, ctx.experiment_seq))
    parts = ["# The incumbent prompt files\n"]
    for path in ctx.allowed_files:
        text = ctx.current_files.get(path, "")
        heads = ", ".join(headings(text)) or "(no headings)"
        parts.append(f"## File {path}\nSections: {heads}\n\n````markdown\n{text}\n````\n")
    parts.append(
        f"# Disagreements on the dev split\n\nThe incumbent disagrees with the labels on {len(ctx.disagreements)} "
        f"items: {counts['missed_failure']} missed failures (judge too lenient) and "
        f"{counts['rejected_success']} rejected successes (judge too strict). A sample of {len(sample)}:\n"
    )
    # Ids only when the memory is allowed: a case names its source items (the guards keep ids out of prompts).
    memory = any(f in MEMORY_FILES for f in ctx.allowed_files)
    parts.extend(
        format_disagreement(d)
        + (f"\n  trajectory id (for source_items): {d.trajectory_id}" if memory else "")
        for d in sample
    )
    guidance = ctx.guidance.strip()
    parts.append("\n# Human guidance\n\n" + (guidance if guidance else "(none)"))
    parts.append(
        "\n# Past experiments in this run (do not repeat what was rolled back)\n\n"
        + format_history(ctx.history, limit=HISTORY_LIMIT, diff_chars=800)
    )
    if ctx.structure_moves:
        toml = ctx.current_files.get(JUDGE_TOML, "")
        moves = "\n".join(
            f"- {key} = {json.dumps(current_value(toml, key))} (allowed: "
            f"{MOVABLE_KEYS[key].allowed(ctx.max_members)}; {MOVABLE_KEYS[key].help})"
            for key in ctx.structure_moves
        )
        parts.append(
            "\n# Structure moves\n\nYou may also (or instead) move these keys of prompts/judge.toml, which "
            'set how the judge is run (null = the default); add "structure": {"<key>": <value>} to '
            "your JSON object, and leave out file/section_heading/new_section for a structure move "
            "alone:\n" + moves
        )
    parts.append(f"\nThis is experiment {ctx.experiment_seq}. Answer with the JSON object only.")
    return "\n".join(parts)


class ReflectStrategy:
    """One LLM call → one rewritten section of one allowed file."""

    name = "reflect"

    def __init__(
        self,
        cfg: OptimizerSection,
        prices: Mapping[str, Price],
        *,
        max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
        sample_cap: int = SAMPLE_CAP,
    ) -> None:
        check_optimizer_key(cfg)
        self.cfg = cfg
        self.prices = prices
        self.max_output_tokens = max_output_tokens
        self.sample_cap = sample_cap

    async def propose(self, ctx: ProposalContext) -> Proposal:
        """Ask once, splice the returned section; `ProposalError` on a reply that cannot be applied."""
        system = system_prompt(ctx, self.cfg.max_diff_lines)
        user = UserMessage((TextPart(build_user_message(ctx, self.sample_cap)),))
        async with OptimiserModel(self.cfg, self.prices, max_output_tokens=self.max_output_tokens) as model:
            turn = await model.turn(system, [user], last=True)
        files, rationale = apply_reply(ctx, turn.text, model)
        return model.proposal(files, rationale)

    async def propose_wave(self, ctx: ProposalContext, k: int) -> list[Proposal | ProposalError]:
        """``k`` proposals in one conversation (`[loop] wave`): the first as `propose`'s, each next one
        asked after the model's earlier answers, to differ from them; each carries its own turn's usage.
        A reply that cannot be applied is that candidate's `ProposalError`; the conversation goes on."""
        system = SYSTEM_PROMPT.format(max_diff_lines=self.cfg.max_diff_lines)
        opening = (
            build_user_message(ctx, self.sample_cap)
            + f"\n\nThis round judges a wave of {k} candidates together against the same incumbent; "
            f"you will be asked for each in this conversation. Candidate 1 of {k}:"
        )
        messages: list[ConversationMessage] = [UserMessage((TextPart(opening),))]
        out: list[Proposal | ProposalError] = []
        async with OptimiserModel(self.cfg, self.prices, max_output_tokens=self.max_output_tokens) as model:
            for i in range(1, k + 1):
                if i > 1:
                    messages.append(UserMessage((TextPart(WAVE_NEXT.format(i=i, k=k)),)))
                before = model.usage
                try:
                    turn = await model.turn(system, messages, last=i == k)
                except ProposalError as exc:  # the transport failed: no later candidate either
                    out += [exc] + [ProposalError(f"not proposed: {exc.reason}") for _ in range(k - i)]
                    break
                messages.append(turn)
                now = model.usage
                calls, cost = now.calls - before.calls, now.cost_usd - before.cost_usd
                tokens_in, tokens_out = (
                    now.input_tokens - before.input_tokens,
                    now.output_tokens - before.output_tokens,
                )
                try:
                    files, rationale = apply_reply(ctx, turn.text, model)
                except ProposalError as exc:
                    out.append(
                        ProposalError(
                            exc.reason,
                            calls=calls,
                            input_tokens=tokens_in,
                            output_tokens=tokens_out,
                            cost_usd=cost,
                        )
                    )
                    continue
                out.append(
                    Proposal(
                        files=files,
                        rationale=rationale,
                        calls=calls,
                        input_tokens=tokens_in,
                        output_tokens=tokens_out,
                        cost_usd=cost,
                    )
                )
        return out


WAVE_NEXT = (
    "Candidate {i} of {k}: propose a different edit from every one above (another section, or another "
    "rule for the same disagreements); it is judged beside them. Answer with the JSON object only."
)


def apply_reply(ctx: ProposalContext, text: str, model: OptimiserModel) -> tuple[dict[str, str], str]:
    """Validate the reply JSON and splice its section; any defect is a `ProposalError` naming it."""
    data = extract_json_object(text)
    if data is None:
        raise model.error("the optimiser's reply is not a JSON object")
    if "memory" in data and "section_heading" not in data:
        return _apply_memory(ctx, data, model)
    files: dict[str, str] = {}
    structure = data.get("structure")
    if structure is not None and ctx.structure_moves:
        files[JUDGE_TOML] = _apply_structure(ctx, structure, model)
        if not any(data.get(k) for k in ("file", "section_heading", "new_section")):
            rationale = data.get("rationale")
            if not isinstance(rationale, str) or not rationale.strip():
                raise model.error("the optimiser's reply lacks a non-empty string for: rationale")
            return files, " ".join(rationale.split())
    fields = {k: data.get(k) for k in ("file", "section_heading", "new_section", "rationale")}
    missing = [k for k, v in fields.items() if not isinstance(v, str) or not v.strip()]
    if missing:
        raise model.error(f"the optimiser's reply lacks a non-empty string for: {', '.join(missing)}")
    path = allowed_path(fields["file"], ctx.allowed_files)  # type: ignore[arg-type]
    if path is None:
        raise model.error(f"the optimiser chose {fields['file']!r}, which is not an allowed file")
    current = ctx.current_files.get(path, "")
    spliced = splice_section(current, fields["section_heading"], fields["new_section"])  # type: ignore[arg-type]
    if spliced is None:
        raise model.error(f"{path} has no section headed {fields['section_heading']!r}")
    if spliced == current:
        raise model.error("the optimiser's new section is identical to the incumbent's")
    rationale = " ".join(fields["rationale"].split())  # type: ignore[union-attr]
    return {**files, path: spliced}, rationale


def _apply_structure(ctx: ProposalContext, structure: object, model: OptimiserModel) -> str:
    """judge.toml with the reply's ``structure`` moves applied; a key or value out of bounds is a `ProposalError`."""
    if not isinstance(structure, dict) or not structure:
        raise model.error('the optimiser\'s "structure" is not a non-empty object of judge.toml keys')
    text = ctx.current_files.get(JUDGE_TOML, "")
    for key, value in structure.items():
        spec = MOVABLE_KEYS.get(key)
        if spec is None or key not in ctx.structure_moves:
            raise model.error(f"the optimiser moved {key!r}, which is not in [optimizer] structure_moves")
        bad = spec.check(value, ctx.max_members)
        if bad is not None:
            raise model.error(f"the optimiser set {key} out of bounds: {bad}")
        try:
            text = set_key(text, key, value)
        except ValueError as exc:
            raise model.error(f"the optimiser's move of {key} cannot be written: {exc}") from None
    if text == ctx.current_files.get(JUDGE_TOML, ""):
        raise model.error("the optimiser's structure moves change nothing")
    return text


def _apply_memory(
    ctx: ProposalContext, data: dict[str, Any], model: OptimiserModel
) -> tuple[dict[str, str], str]:
    """Run a reply's memory edits through the memory tools; the first refusal is a `ProposalError` naming it."""
    edits, rationale = data.get("memory"), data.get("rationale")
    if not isinstance(edits, list) or not edits or not all(isinstance(e, dict) for e in edits):
        raise model.error("the optimiser's memory reply is not a non-empty list of {tool, arguments} edits")
    if not isinstance(rationale, str) or not rationale.strip():
        raise model.error("the optimiser's reply lacks a non-empty string for: rationale")
    state = ToolState(ctx)
    for n, edit in enumerate(edits, start=1):
        tool = edit.get("tool")
        if tool not in MEMORY_TOOL_NAMES:
            raise model.error(
                f"memory edit {n} names tool {tool!r}; use one of {', '.join(MEMORY_TOOL_NAMES)}"
            )
        out = run_tool(state, str(tool), edit.get("arguments", {}))
        if out.is_error:
            raise model.error(f"memory edit {n} ({tool}) was refused: {out.text.removeprefix('error: ')}")
    files = state.changed_files()
    if not files:
        raise model.error("the optimiser's memory edits change nothing")
    return files, " ".join(rationale.split())


_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)\n```", re.DOTALL)


def extract_json_object(text: str) -> dict[str, Any] | None:
    """The JSON object in a reply: the whole text, a fenced block, or the outermost ``{...}``.

    Lenient on purpose, unlike the judge's strict `optimizer.judge.verdicts.parse_verdict`: a
    proposal wrapped in prose is still a usable proposal.
    """
    candidates = [text.strip()]
    candidates += [m.group(1) for m in _FENCE.finditer(text)]
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None
