"""`judgeloop mcp`'s resources through the MCP SDK's own client: the disagreements, a dev item (its steps
and screenshot links, a screenshot), the history and the latest certificate; reading them starts nothing;
held-out items, paths and unknown URIs are "resource not found"; the certificate's held-out confirmations
never reach the client; tool results link the resources.

Every server is a child of `stdio_client`, which closes its stdin and kills it at the end of the
``async with``; every call is bounded by `anyio.fail_after`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import pytest
from mcp import ClientSession, types
from mcp.shared.exceptions import MCPError

from optimizer.devset.split import open_split
from optimizer.workspace import gitops
from optimizer.workspace.workspace import Workspace
from tests.support.loop import git, labels_of
from tests.support.mcp_client import call, data, drive, judged_session
from tests.support.mcp_workspace import ledger_state, make_mcp_template
from tests.support.scripted import assert_clean

NOT_FOUND = -32002


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_mcp_template(tmp_path_factory.mktemp("template"))


async def _read(session: ClientSession, uri: str) -> types.ReadResourceResult | MCPError:
    with anyio.fail_after(60):
        try:
            return await session.read_resource(uri)
        except MCPError as exc:
            return exc


def _json(result: types.ReadResourceResult | MCPError) -> Any:
    assert isinstance(result, types.ReadResourceResult), result
    (content,) = result.contents
    assert isinstance(content, types.TextResourceContents)
    return json.loads(content.text)


@pytest.mark.slow
def test_resources_read_dev_items_history_and_certificate_and_refuse_held_out_items(
    ws: Path, tmp_path: Path
) -> None:
    labels = labels_of(ws)
    dev_id = sorted(labels)[0]
    held = open_split(Workspace.open(ws), "held")
    held_id = held.ids[0]
    held_instruction = held.trajectory(held_id).task.instruction.strip()
    start, branches = gitops.rev_parse(ws, "HEAD"), git(ws, "for-each-ref", "refs/heads/")
    certificates = ws / "experiments" / "certificates"
    certificates.mkdir(parents=True)
    secret = {"status": "recorded", "splits": [{"split": "held", "kappa": 0.4242, "ids": [held_id]}]}
    (certificates / "abc-1.json").write_text(
        json.dumps({"certificate_version": 1, "revision": start, "confirm": secret}), encoding="utf-8"
    )
    seen: dict[Any, Any] = {}

    async def body() -> None:
        async with judged_session(ws, tmp_path) as session:
            seen["list"] = [r.uri for r in (await session.list_resources()).resources]
            seen["templates"] = [
                t.uri_template for t in (await session.list_resource_templates()).resource_templates
            ]
            for uri in ("disagreements", "history", "certificate/latest", f"items/{quote(dev_id)}"):
                seen[uri] = await _read(session, f"judgeloop://{uri}")
            for tid in (held_id, f"../held/{held_id}", "..%2F..%2Fjudgeloop.toml", "nope"):
                seen[("item", tid)] = await _read(session, f"judgeloop://items/{tid}")
                seen[("shot", tid)] = await _read(session, f"judgeloop://items/{tid}/screenshots/0")
            seen["elsewhere"] = await _read(session, "file:///etc/passwd")
            seen["no_run"] = ledger_state(ws)[0], git(ws, "for-each-ref", "refs/heads/")
            seen["head"] = gitops.rev_parse(ws, "HEAD")
            listing = await call(session, "disagreements")
            seen["links"] = [c.uri for c in listing.content if isinstance(c, types.ResourceLink)]
            seen["listing"] = data(listing)
            seen["after"] = await _read(session, "judgeloop://disagreements")
            item = await call(session, "read_item", trajectory_id=dev_id)
            seen["item_links"] = [c.uri for c in item.content if isinstance(c, types.ResourceLink)]
            shots = _json(seen[f"items/{quote(dev_id)}"])["screenshot_links"]
            assert shots, "the sample's first dev item has screenshots"
            seen["shot"] = await _read(session, shots[0])

    drive(body)
    assert seen["list"] == [
        "judgeloop://disagreements",
        "judgeloop://history",
        "judgeloop://certificate/latest",
    ]
    assert seen["templates"] == [
        "judgeloop://items/{trajectory_id}",
        "judgeloop://items/{trajectory_id}/screenshots/{step}",
    ]
    # Reading started nothing: no run, no branch, HEAD where it was.
    assert seen["no_run"] == ([], branches) and seen["head"] == start
    assert _json(seen["disagreements"])["items"] == []
    assert _json(seen["history"])["experiments"] == []
    cert = _json(seen["certificate/latest"])
    assert cert["revision"] == start and cert["confirm"]["status"] == "withheld"
    assert "0.4242" not in json.dumps(cert) and held_id not in json.dumps(cert)
    item = _json(seen[f"items/{quote(dev_id)}"])
    assert item["trajectory_id"] == dev_id and "step 0:" in item["steps_text"]
    for tid in (held_id, f"../held/{held_id}", "..%2F..%2Fjudgeloop.toml", "nope"):
        for kind in ("item", "shot"):
            refused = seen[(kind, tid)]
            assert isinstance(refused, MCPError) and refused.code == NOT_FOUND, (kind, tid, refused)
            assert held_instruction not in refused.message
    assert isinstance(seen["elsewhere"], MCPError) and seen["elsewhere"].code == NOT_FOUND
    assert seen["links"] == ["judgeloop://disagreements"]
    assert seen["item_links"] == [f"judgeloop://items/{quote(dev_id, safe='')}"]
    assert {d["trajectory_id"] for d in _json(seen["after"])["items"]} == {
        d["trajectory_id"] for d in seen["listing"]["items"]
    }
    shot = seen["shot"]
    assert isinstance(shot, types.ReadResourceResult), shot
    (blob,) = shot.contents
    assert isinstance(blob, types.BlobResourceContents) and blob.blob
    assert blob.mime_type is not None and blob.mime_type.startswith("image/")
    assert_clean(ws)
