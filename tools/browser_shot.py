"""Screenshot a web page once it shows a given text: ``python -m tools.browser_shot URL OUT.png --wait-for TEXT``.

Made for docs/integrations/inspect.md's picture of ``inspect view``: the viewer is a JavaScript app that
reads the log in the page, and ``chromium --headless --screenshot`` (even with ``--virtual-time-budget``)
captures its loading spinner. This drives a headless Chromium (``apt-get install chromium``; any binary via
``--chromium``) over the DevTools protocol with aiohttp (installed with ``judgeloop[inspect]``): it opens
URL, waits in real time until the page's text contains every ``--wait-for`` text, then captures the page.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

LISTENING = re.compile(r"DevTools listening on (ws://\S+)")


class ShotError(Exception):
    """The browser did not start or the page never showed the texts: the one line to print."""


async def _devtools_url(proc: asyncio.subprocess.Process) -> str:
    assert proc.stderr is not None
    while line := await proc.stderr.readline():
        if found := LISTENING.search(line.decode(errors="replace")):
            return found.group(1)
    raise ShotError("chromium exited before it opened its DevTools port (run it by hand to see why)")


async def _page_socket_url(browser_ws: str) -> str:
    port = browser_ws.split("//", 1)[1].split("/", 1)[0]
    async with aiohttp.ClientSession() as http, http.get(f"http://{port}/json/list") as response:
        targets = await response.json()
    pages = [t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page"]
    if not pages:
        raise ShotError("chromium opened no page to drive")
    return str(pages[0])


async def _capture(page_ws: str, url: str, texts: list[str], timeout: float) -> bytes:
    ids = itertools.count(1)
    async with aiohttp.ClientSession() as http, http.ws_connect(page_ws, max_msg_size=0) as ws:

        async def call(method: str, **params: Any) -> dict[str, Any]:
            n = next(ids)
            await ws.send_json({"id": n, "method": method, "params": params})
            async for message in ws:
                body = json.loads(message.data)
                if body.get("id") == n:
                    if "error" in body:
                        raise ShotError(f"chromium refused {method}: {body['error'].get('message')}")
                    return dict(body.get("result", {}))
            raise ShotError("chromium closed the page's connection")

        await call("Page.enable")
        await call("Page.navigate", url=url)
        check = " && ".join(f"document.body.innerText.includes({json.dumps(t)})" for t in texts)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            result = await call("Runtime.evaluate", expression=f"!!document.body && {check}")
            if result.get("result", {}).get("value") is True:
                break
            if loop.time() > deadline:
                raise ShotError(f"the page did not show {texts} within {timeout:g} s; is the URL right?")
            await asyncio.sleep(0.5)
        # The texts are in; let the layout and fonts settle before the picture.
        await asyncio.sleep(1.0)
        shot = await call("Page.captureScreenshot", format="png")
        return base64.b64decode(shot["data"])


async def screenshot(url: str, out: Path, texts: list[str], options: argparse.Namespace) -> None:
    """Capture ``url`` into ``out`` once its text holds every one of ``texts``."""
    with tempfile.TemporaryDirectory(prefix="browser-shot-") as profile:
        proc = await asyncio.create_subprocess_exec(
            options.chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--window-size={options.width},{options.height}",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "about:blank",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            page_ws = await _page_socket_url(await _devtools_url(proc))
            out.write_bytes(await _capture(page_ws, url, texts, options.timeout))
        finally:
            proc.terminate()
            await proc.wait()


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.browser_shot", description=__doc__.split("\n")[0])
    parser.add_argument("url")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--wait-for", action="append", required=True, metavar="TEXT", help="repeatable")
    parser.add_argument("--chromium", default="chromium", help="the browser binary (default: chromium)")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=900)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the texts")
    options = parser.parse_args(argv)
    try:
        asyncio.run(screenshot(options.url, options.out, options.wait_for, options))
    except ShotError as error:
        print(f"browser_shot: {error}", file=sys.stderr)
        return 2
    except FileNotFoundError:
        print(
            f"browser_shot: no browser at {options.chromium!r}: apt-get install chromium, or name it with --chromium",
            file=sys.stderr,
        )
        return 2
    print(f"wrote {options.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
