"""What judge.toml asks that a provider cannot judge with: memory, a [panel], criteria or review on a
harness, agentic or batch judge. Each check returns one line saying what to change, or None; `judge_refusal`
is the one every entry point makes (evaluation, a judge, a candidate's validation). Judge-input side:
never reads labels."""

from __future__ import annotations

from optimizer.judge.prompts import PromptSet
from optimizer.judge.types import Provider


def memory_refusal(prompts: PromptSet, provider: Provider) -> str | None:
    """Why ``memory = "retrieve"`` cannot be judged with (one line), or None: the request that carries the
    memory is built in common code for the direct judge (every provider but a harness, batches too)."""
    if prompts.settings.memory == "off":
        return None
    if prompts.settings.mode == "agentic":
        return (
            'judge.toml sets memory = "retrieve" with mode = "agentic"; memory is sent with the direct judge '
            'only (and batches of it): set mode = "direct" or memory = "off"'
        )
    if provider.traits.sandbox is not None:
        return (
            f'judge.toml sets memory = "retrieve", which the {provider.name} provider (a harness judge reading '
            'its own files) cannot carry; set memory = "off" or judge with anthropic, openai or local'
        )
    return None


def panel_refusal(prompts: PromptSet, provider: Provider, *, batch: bool = False) -> str | None:
    """Why ``prompts``' [panel] cannot run on ``provider`` (one sentence), or None: it can (or there is none)."""
    if prompts.settings.panel is None:
        return None
    if prompts.settings.mode == "agentic":
        return (
            'judge.toml has a [panel] and mode = "agentic"; panels run direct judges only: set '
            'mode = "direct" or remove [panel]'
        )
    if provider.traits.sandbox is not None:
        return (
            f"judge.toml has a [panel], which the {provider.name} provider (a harness judge that reads "
            "its own files) cannot run; remove [panel] or use an API or local provider"
        )
    if batch:
        return "judge.toml has a [panel], which --batch does not send yet; drop --batch or remove [panel]"
    if prompts.settings.structure != "single" or prompts.settings.review != "off":
        return (
            'judge.toml has a [panel] and structure = "criteria" or review = "success"; a panel of '
            'structured judges is not built yet: remove [panel] or set structure = "single", review = "off"'
        )
    return None


def judge_refusal(prompts: PromptSet, provider: Provider, *, batch: bool = False) -> str | None:
    """Why judge.toml's structure (memory, a [panel], criteria or review) cannot be judged with on
    ``provider`` (with ``batch``: through its batch API), in one line; None: it can. The one check every
    entry point makes (evaluation, a judge, a candidate's validation)."""
    from optimizer.judge.criteria import structure_refusal

    return (
        memory_refusal(prompts, provider)
        or panel_refusal(prompts, provider, batch=batch)
        or structure_refusal(prompts.settings, provider.name, provider.traits, batch=batch)
    )
