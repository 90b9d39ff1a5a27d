"""`devset import --format NAME`: the formats judgeloop reads, and the one import entry point."""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path

from optimizer.devset.formats import agentrewardbench, osreward
from optimizer.devset.formats.common import (
    AGENTHORIZON,
    Converted,
    ImportRequest,
    check_request,
    import_converted,
)
from optimizer.devset.importer import import_split
from optimizer.devset.split import Split, read_manifest
from optimizer.errors import UserError
from optimizer.workspace.workspace import Workspace

Converter = Callable[[Path, Collection[str] | None], Converted]

CONVERTERS: dict[str, Converter] = {
    agentrewardbench.FORMAT: agentrewardbench.convert,
    osreward.FORMAT: osreward.convert,
}
FORMAT_NAMES = (AGENTHORIZON, *CONVERTERS)  # optimizer.vocab.IMPORT_FORMATS spells them for the CLI


def import_benchmark(ws: Workspace, src: Path, name: str, request: ImportRequest) -> Split:
    """Import SRC, in ``request.format``, as split ``devset/NAME``: an AgentHorizon release through
    `import_split`, any other benchmark converted (`CONVERTERS`) then imported the same way."""
    if request.format == AGENTHORIZON:
        return import_split(
            ws,
            src,
            name,
            manifest=request.manifest,
            all_items=request.all_items,
            rebuild_ahd=request.rebuild_ahd,
            link=request.link,
            warn=request.warn,
        )
    convert = CONVERTERS.get(request.format)
    if convert is None:
        raise UserError(f"unknown format {request.format!r}; use one of {', '.join(FORMAT_NAMES)}")
    if sum((request.manifest is not None, request.all_items, request.rebuild_ahd)) != 1:
        raise UserError("choose the items with exactly one of --manifest FILE or --all")
    check_request(ws, name, request)
    wanted = None if request.manifest is None else set(read_manifest(request.manifest))
    return import_converted(ws, convert(Path(src), wanted), name, request)
