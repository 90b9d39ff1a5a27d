"""The ``reflect`` strategy: one LLM call rewrites one section of one allowed prompt file.

The request holds the incumbent's allowed files, a direction-aware sample of its dev
disagreements (missed failures and rejected successes balanced, capped), the human guidance and a
short history. The reply must be one JSON object
``{"file", "section_heading", "new_section", "rationale"}``; the section under that Markdown heading
is replaced (`optimizer.strategies.common.splice_section`). Anything else is a `ProposalError`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from optimizer.config import OptimizerSection, Price

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
    parts.extend(format_disagreement(d) for d in sample)
    guidance = ctx.guidance.strip()
    parts.append("\n# Human guidance\n\n" + (guidance if guidance else "(none)"))
    parts.append("\n# Past experiments in this run (do not repeat what was rolled back)\n\n"
                 + format_history(ctx.history, limit=HISTORY_LIMIT, diff_chars=800))
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
        system = SYSTEM_PROMPT.format(max_diff_lines=self.cfg.max_diff_lines)
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
        opening = (build_user_message(ctx, self.sample_cap)
                   + f"\n\nThis round judges a wave of {k} candidates together against the same incumbent; "
                   f"you will be asked for each in this conversation. Candidate 1 of {k}:")
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
                tokens_in, tokens_out = now.input_tokens - before.input_tokens, now.output_tokens - before.output_tokens
                try:
                    files, rationale = apply_reply(ctx, turn.text, model)
                except ProposalError as exc:
                    out.append(ProposalError(exc.reason, calls=calls, input_tokens=tokens_in, output_tokens=tokens_out,
                                             cost_usd=cost))
                    continue
                out.append(Proposal(files=files, rationale=rationale, calls=calls, input_tokens=tokens_in,
                                    output_tokens=tokens_out, cost_usd=cost))
        return out


WAVE_NEXT = ("Candidate {i} of {k}: propose a different edit from every one above (another section, or another "
             "rule for the same disagreements); it is judged beside them. Answer with the JSON object only.")


def apply_reply(ctx: ProposalContext, text: str, model: OptimiserModel) -> tuple[dict[str, str], str]:
    """Validate the reply JSON and splice its section; any defect is a `ProposalError` naming it."""
    data = extract_json_object(text)
    if data is None:
        raise model.error("the optimiser's reply is not a JSON object")
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
    return {path: spliced}, rationale


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
