"""A fake router on 127.0.0.1 in front of several fake servers, as LiteLLM, llm-d or SGLang's router stand
in front of replicas behind one base URL.

A request carrying the affinity ``header`` goes to the upstream its value hashes to (the same key, the
same upstream: a router honouring session affinity). One without goes where a hash of its body says: a
balancer that knows nothing of items, so an item's next call (another candidate's request) lands on any
upstream, evenly. Every forwarded request is recorded (`Routed`); the upstreams answer as
`tests.support.fakeserver.FakeLLMServer` does.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

# Hop-by-hop headers and the ones the forwarder sets itself.
_NOT_FORWARDED = {"host", "connection", "content-length", "transfer-encoding", "keep-alive"}


@dataclass(frozen=True)
class Routed:
    """One forwarded request: the upstream's index, the affinity key it carried (None: none), its JSON body."""

    upstream: int
    key: str | None
    body: Any


def _pick(text: bytes, n: int) -> int:
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") % n


class FakeRouter:
    """Forwards every request to one of ``upstreams`` (root URLs, e.g. ``FakeLLMServer.url``)."""

    def __init__(self, upstreams: list[str], header: str) -> None:
        self.upstreams = upstreams
        self.header = header
        self.routed: list[Routed] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._httpd is not None
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def openai_base_url(self) -> str:
        return self.url + "/v1"

    def __enter__(self) -> FakeRouter:
        router = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                router.forward(self, b"")

            def do_POST(self) -> None:
                router.forward(self, self.rfile.read(int(self.headers.get("content-length") or 0)))

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._httpd is not None and self._thread is not None
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def forward(self, handler: BaseHTTPRequestHandler, body: bytes) -> None:
        """Send the request on to its upstream and its answer back."""
        key = handler.headers.get(self.header)
        index = _pick(key.encode(), len(self.upstreams)) if key else _pick(body, len(self.upstreams))
        if body:
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = None
            with self._lock:
                self.routed.append(Routed(index, key, parsed))
        target = urlsplit(self.upstreams[index])
        conn = http.client.HTTPConnection(target.hostname or "127.0.0.1", target.port, timeout=60)
        try:
            headers = {k: v for k, v in handler.headers.items() if k.lower() not in _NOT_FORWARDED}
            conn.request(handler.command, handler.path, body=body or None, headers=headers)
            answer = conn.getresponse()
            data = answer.read()
            handler.send_response(answer.status)
            for name, value in answer.getheaders():
                if name.lower() not in _NOT_FORWARDED:
                    handler.send_header(name, value)
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
        finally:
            conn.close()
