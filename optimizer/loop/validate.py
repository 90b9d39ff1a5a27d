"""A candidate checked completely before it is committed: what the judge would be sent must exist.

The guards (`optimizer.loop.guards`) decide what an edit may *change*; this decides whether the
edited prompt set can be *used*: ``judge.toml`` parses, every placeholder and library marker is
valid, every file stays under the size cap, the judge mode suits the provider, and the prompts
render into a real request for a real item of the split. A candidate that fails is a guard
rejection with this reason, so an optimiser writing ``{{value}}`` into a rule costs one rejected
candidate, never the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from optimizer.devset.split import Split
from optimizer.errors import UserError
from optimizer.evaluation.batch import batching_provider
from optimizer.evaluation.refusals import judge_refusal
from optimizer.judge.memory import check_sources
from optimizer.judge.prompts import OPTIONAL_FILES, REQUIRED_FILES, PromptSet, structure_files
from optimizer.judge.render import RenderOptions, build_request
from optimizer.judge.types import Provider
from optimizer.workspace import gitops
from optimizer.workspace.paths import MAX_PROMPT_FILE_CHARS


def candidate_files(root: Path, base_rev: str, changed: Mapping[str, str | None]) -> dict[str, str]:
    """The prompt files at ``base_rev`` with the candidate's ``changed`` texts (canonical names) laid over."""
    files: dict[str, str] = {}
    for name in (*REQUIRED_FILES, *OPTIONAL_FILES):
        text = gitops.read_file_at(root, base_rev, name)
        if text is not None:
            files[name] = text
    for name, text in changed.items():
        if text is None:
            files.pop(name, None)
        else:
            files[name] = text
    # The panel's member files and the cascade's files the (edited) judge.toml names, as committed, unless the candidate changed them.
    for name in structure_files(files):
        if name not in changed:
            text = gitops.read_file_at(root, base_rev, name)
            if text is not None:
                files[name] = text
    return files


def validate_prompts(
    files: Mapping[str, str],
    split: Split,
    provider: Provider,
    *,
    batch: bool = False,
    image_cache_dir: Path | None = None,
    source: str = "prompts",
) -> str | None:
    """None when ``files`` form a usable prompt set for ``provider`` on ``split``; else why not (one line)."""
    for name, text in sorted(files.items()):
        if len(text) > MAX_PROMPT_FILE_CHARS:
            return (
                f"{name} would be {len(text):,} characters, over the cap of {MAX_PROMPT_FILE_CHARS:,}; "
                "keep prompt files short"
            )
    try:
        prompts = PromptSet.from_files(files, source=source)
        # A case names the dev items it was distilled from, or folds could not keep it from them.
        check_sources(prompts.memory, split.ids, split.name, source=f"{source}/memory/cases.jsonl")
        traits = provider.traits
        if prompts.settings.mode == "agentic" and not traits.tool_use:
            return (
                f'{source}: judge.toml sets mode = "agentic", which the {provider.name} provider cannot run '
                '(it has no tool use); keep mode = "direct"'
            )
        if batch:
            batching_provider(provider, prompts.settings.mode)
        refusal = judge_refusal(prompts, provider, batch=batch)
        if refusal is not None:
            return f"{source}: {refusal}"
        # Render what the judge would be sent for one real item (its text and placements; the
        # screenshots come from the image cache the evaluation fills).
        if split.ids:
            traj = split.trajectory(split.ids[0])
            if prompts.settings.mode == "agentic":
                prompts.instructions()
            else:
                build_request(
                    traj,
                    split,
                    prompts,
                    options=RenderOptions(
                        text_only=traits.text_only,
                        image_cache_dir=image_cache_dir,
                        layout=traits.layout,
                    ),
                )
    except UserError as exc:
        return str(exc)
    except (KeyError, ValueError) as exc:  # a template the checks let through but fill() cannot use
        return f"{source}: the prompts cannot be rendered ({type(exc).__name__}: {exc})"
    return None
