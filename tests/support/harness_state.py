"""The state folder of the fake harness CLIs, served over HTTP on 127.0.0.1 (`StateServer`).

A confined harness sees no folder of the test: it reaches its state (switches such as ``no-late``, the
oracle, the log it appends to) the one way a confined CLI reaches anything outside, the network. The
fakes name it ``--state http://127.0.0.1:<port>``; `StateClient` reads a plain folder path the same way.
"""

from __future__ import annotations

import re
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.waits import EVENT_WAIT_S

_NAME = re.compile(r"^/([A-Za-z0-9_.+-]{1,200})$")


class StateServer:
    """Serves ``folder`` on 127.0.0.1: GET a file (404: absent), PUT to write it, POST to append,
    DELETE to remove. Use as a context manager; `url` is what the fakes take as ``--state``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _path(self) -> Path | None:
                match = _NAME.match(self.path)
                return folder / match.group(1) if match else None

            def _reply(self, status: int, body: bytes = b"") -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                path = self._path()
                if path is None or not path.is_file():
                    self._reply(404)
                else:
                    self._reply(200, path.read_bytes())

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def do_PUT(self) -> None:
                path, body = self._path(), self._body()
                if path is None:
                    self._reply(400)
                    return
                with lock:
                    path.write_bytes(body)
                self._reply(204)

            def do_POST(self) -> None:
                path, body = self._path(), self._body()
                if path is None:
                    self._reply(400)
                    return
                with lock, path.open("ab") as f:
                    f.write(body)
                self._reply(204)

            def do_DELETE(self) -> None:
                path = self._path()
                if path is not None:
                    path.unlink(missing_ok=True)
                self._reply(204)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> StateServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


class StateClient:
    """The fakes' view of their state: ``--state`` a URL (`StateServer`) or a folder."""

    def __init__(self, where: str) -> None:
        self.where = where
        self._http = where.startswith("http://")
        # No proxy: the server is on this machine.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _request(self, method: str, name: str, body: bytes | None = None) -> bytes | None:
        request = urllib.request.Request(f"{self.where}/{name}", data=body, method=method)
        try:
            with self._opener.open(request, timeout=EVENT_WAIT_S) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def read(self, name: str) -> str | None:
        if self._http:
            data = self._request("GET", name)
            return None if data is None else data.decode("utf-8")
        path = Path(self.where) / name
        return path.read_text(encoding="utf-8") if path.is_file() else None

    def exists(self, name: str) -> bool:
        return self.read(name) is not None

    def write(self, name: str, text: str) -> None:
        if self._http:
            self._request("PUT", name, text.encode())
        else:
            (Path(self.where) / name).write_text(text, encoding="utf-8")

    def append(self, name: str, text: str) -> None:
        if self._http:
            self._request("POST", name, text.encode())
        else:
            with (Path(self.where) / name).open("a", encoding="utf-8") as f:
                f.write(text)
