"""A scriptable fake LLM server on 127.0.0.1 speaking the Anthropic and OpenAI wire formats.

Tests drive the *real* ``anthropic`` and ``openai`` SDK clients against it, so request building,
retries, timeouts, usage accounting and error handling all run for real.

Routes:
- ``POST /v1/messages`` — Anthropic Messages.
- ``POST /v1/chat/completions`` and ``POST <any base path>/chat/completions`` — OpenAI Chat Completions.
- ``GET /v1/models`` (and ``<base>/models``) — the OpenAI model list (``models`` or one fake model).
- Anthropic Message Batches: ``POST /v1/messages/batches``, ``GET /v1/messages/batches/{id}``
  (``processing_status`` ``in_progress`` until ``batch_polls`` retrievals, then ``ended`` with a
  ``results_url``), ``GET /v1/messages/batches/{id}/results`` (JSONL; per entry ``succeeded``,
  ``errored``, ``expired`` or ``canceled``).
- OpenAI Batch: ``POST /v1/files`` (multipart, ``purpose=batch``), ``POST /v1/batches``,
  ``GET /v1/batches/{id}`` (``validating`` → ``in_progress`` → ``completed``, or ``expired`` when an
  entry expired, or ``failed`` for the next ``fail_batches`` batches), ``GET /v1/files/{id}/content``
  (the output and error files, JSONL).

Each batch entry takes its behaviour from the script (in submission order) or ``default`` exactly
like a direct call, when the batch is created; it is recorded as an inference request with
``batch_id`` set. `expired` and `canceled` behaviours exist only for batch entries (a direct call
given one gets a 500). ``batch_creations`` lists every batch created, in order.

Every inference request pops the next scripted behaviour (FIFO, see `FakeLLMServer.script`); when
the script is empty the ``default`` callable chooses one from the request (by default a valid
judge verdict). Every request is recorded (`RecordedRequest`) with API keys redacted.

Behaviours are built with `reply`, `error`, `rate_limited`, `server_error`, `not_found`,
`malformed`, `hang`. A behaviour may also be a callable ``(RecordedRequest) -> Behaviour``.

Usage::

    with FakeLLMServer() as server:
        server.script(rate_limited(retry_after=0.01), reply('{"success": true, ...}'))
        client = AsyncAnthropic(api_key="k", base_url=server.anthropic_base_url)

or the pytest fixture ``fake_llm`` (import it: ``from tests.support.fakeserver import fake_llm``).
"""

from __future__ import annotations

import collections
import email.parser
import email.policy
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, cast

import pytest

from tests.support.fakecache import CacheRequestError, CacheTicket, PromptCache
from tests.support.fakewire import (
    Usage as Usage,  # re-exported: tests build scripted usages from here
)
from tests.support.fakewire import (
    Wire,
    anthropic_batch,
    anthropic_message,
    anthropic_results,
    error_body,
    openai_batch,
    openai_completion,
    price,
)

# Headers that carry a credential; their values never reach a record.
SECRET_HEADERS = ("x-api-key", "authorization", "api-key")
REDACTED = "<redacted>"

DEFAULT_VERDICT: dict[str, Any] = {
    "success": True,
    "reasoning": "fake server verdict",
    "confidence": "medium",
    "mistake_type": None,
}


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server saw it. Credential headers are replaced by ``<redacted>``."""

    method: str
    path: str
    wire: Wire | None
    headers: dict[str, str]
    api_key_present: bool
    body: Any  # parsed JSON, or None when the body was empty or not JSON
    batch_id: str | None = None  # an entry of this batch (its body is the entry's request body)

    @property
    def model(self) -> str | None:
        return self.body.get("model") if isinstance(self.body, dict) else None


@dataclass(frozen=True)
class ToolCall:
    """A tool call the fake model makes (tool_use block for Anthropic, tool_calls entry for OpenAI)."""

    name: str
    arguments: dict[str, Any]
    id: str | None = None


@dataclass(frozen=True)
class Behaviour:
    """What the server does with one inference request. Build it with the helper functions below."""

    kind: Literal["reply", "error", "malformed", "hang", "expired", "canceled"]
    text: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    blocks: tuple[dict[str, Any], ...] | None = None  # raw Anthropic content blocks (override text/tools)
    message: dict[str, Any] | None = None  # raw OpenAI assistant message (override text/tools)
    usage: Usage | None = None
    stop_reason: str | None = None
    status: int = 200
    error_type: str = ""
    error_message: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    delay_s: float = 0.0


BehaviourSource = Behaviour | Callable[[RecordedRequest], Behaviour]


def reply(
    text: str | None = None,
    *,
    tool_calls: list[ToolCall] | None = None,
    blocks: list[dict[str, Any]] | None = None,
    message: dict[str, Any] | None = None,
    usage: Usage | None = None,
    stop_reason: str | None = None,
    delay_s: float = 0.0,
) -> Behaviour:
    """A successful completion: text and/or tool calls (or raw blocks / a raw message), after ``delay_s``."""
    return Behaviour(
        kind="reply",
        text=text,
        tool_calls=tuple(tool_calls or ()),
        blocks=tuple(blocks) if blocks is not None else None,
        message=message,
        usage=usage,
        stop_reason=stop_reason,
        delay_s=delay_s,
    )


def verdict_reply(verdict: dict[str, Any] | None = None, **kwargs: Any) -> Behaviour:
    """A reply whose text is a judge verdict JSON (default: a valid "success" verdict)."""
    return reply(json.dumps(DEFAULT_VERDICT if verdict is None else verdict), **kwargs)


def error(
    status: int,
    *,
    error_type: str = "api_error",
    message: str = "fake error",
    headers: dict[str, str] | None = None,
    delay_s: float = 0.0,
) -> Behaviour:
    """An HTTP error with the provider's error body shape."""
    return Behaviour(
        kind="error",
        status=status,
        error_type=error_type,
        error_message=message,
        headers=tuple((headers or {}).items()),
        delay_s=delay_s,
    )


def rate_limited(retry_after: float | None = 0.01) -> Behaviour:
    """HTTP 429 with a ``retry-after`` header in seconds (omitted when None)."""
    headers = {} if retry_after is None else {"retry-after": f"{retry_after:g}"}
    return error(429, error_type="rate_limit_error", message="rate limited (fake)", headers=headers)


def server_error(status: int = 500) -> Behaviour:
    """HTTP 5xx. Without retry-after the SDK backs off ~0.5 s before its retry."""
    return error(status, error_type="api_error", message="internal error (fake)")


def not_found(model: str = "") -> Behaviour:
    """HTTP 404 for an unknown model, shaped like the providers' own answer."""
    return error(404, error_type="not_found_error", message=f"model: {model} not found")


def unauthorized() -> Behaviour:
    """HTTP 401 (a rejected key)."""
    return error(401, error_type="authentication_error", message="invalid x-api-key")


def malformed(status: int = 200) -> Behaviour:
    """A response whose body is not JSON although it claims to be."""
    return Behaviour(kind="malformed", status=status)


def hang(seconds: float = 5.0) -> Behaviour:
    """Accept the request and answer nothing for ``seconds`` (bounded, cut short at shutdown), then drop it."""
    return Behaviour(kind="hang", delay_s=seconds)


def expired() -> Behaviour:
    """A batch entry the provider did not run before the batch's window closed."""
    return Behaviour(kind="expired")


def canceled() -> Behaviour:
    """A batch entry canceled before it ran."""
    return Behaviour(kind="canceled")


def default_verdict(request: RecordedRequest) -> Behaviour:
    """Default behaviour when the script is empty: a valid verdict JSON."""
    return verdict_reply()


class FakeLLMServer:
    """The server. Use as a context manager; it binds 127.0.0.1 on an ephemeral port.

    ``models``: when given, a request naming any other model gets a 404 (like a real server), and
    ``GET /v1/models`` lists them. ``max_hang_s`` bounds every hang and delay. ``keep_alive``: keep
    a connection open after an answer, as real servers do (the default closes each one, so no
    handler thread outlives a test); benchmarks use it so they time the client, not reconnects.
    ``parse_bodies=False`` records bodies as None (and replies name the model "fake-model") to keep
    JSON decoding of large image requests out of a benchmark's CPU budget. ``prompt_cache``: a
    `tests.support.fakecache.PromptCache` that bills replies as the provider's prompt cache would:
    a request is priced when it arrives (before its reply's ``delay_s``) and what it writes becomes
    readable just before its response is sent; a batch's entries are all priced before any of their
    writes becomes readable (they run together).
    """

    def __init__(
        self,
        default: Callable[[RecordedRequest], Behaviour] = default_verdict,
        *,
        models: list[str] | None = None,
        max_hang_s: float = 10.0,
        keep_alive: bool = False,
        parse_bodies: bool = True,
        batch_polls: int = 1,
        prompt_cache: PromptCache | None = None,
    ) -> None:
        self.default = default
        # Status retrievals a batch answers "in progress" before it ends (0: ended at once).
        self.batch_polls = batch_polls
        self.fail_batches = 0  # OpenAI wire: the next N batches fail validation (status "failed")
        self.batch_creations: list[str] = []
        self._batches: dict[str, _FakeBatch] = {}
        self._files: dict[str, bytes] = {}
        self.models = models
        self.max_hang_s = max_hang_s
        self.keep_alive = keep_alive
        self.parse_bodies = parse_bodies
        # Off by default (usage is then the scripted one, or a size estimate with no caching): with a
        # `tests.support.fakecache.PromptCache`, replies without scripted usage bill what the provider's prompt
        # cache would, and markers the provider rejects are answered with its 400.
        self.prompt_cache = prompt_cache
        self.requests: list[RecordedRequest] = []
        # Every answered inference request with the usage it reported, in answer order.
        self.replies: list[tuple[RecordedRequest, Usage]] = []
        self._script: collections.deque[BehaviourSource] = collections.deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._ids = itertools.count(1)
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> FakeLLMServer:
        handler = type("_BoundHandler", (_Handler,), {"fake": self})
        self._httpd = _Server(("127.0.0.1", 0), handler)
        # Non-daemon request threads so server_close() joins them; hangs end at the stop event and
        # every socket read is bounded by _Handler.timeout.
        self._httpd.daemon_threads = False
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-llm-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Cut every hang short, stop serving, close the socket and join the serving thread."""
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._httpd is not None, "server not started"
        host, port = cast(tuple[str, int], self._httpd.server_address[:2])
        return f"http://{host}:{port}"

    @property
    def anthropic_base_url(self) -> str:
        return self.url

    @property
    def openai_base_url(self) -> str:
        return self.url + "/v1"

    # -- scripting -------------------------------------------------------------------------------

    def script(self, *behaviours: BehaviourSource) -> None:
        """Queue behaviours for the next inference requests, in order."""
        with self._lock:
            self._script.extend(behaviours)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._script)

    def inference_requests(self) -> list[RecordedRequest]:
        """The recorded POSTs to an inference route, in arrival order."""
        with self._lock:
            return [r for r in self.requests if r.wire is not None]

    def _next_behaviour(self, request: RecordedRequest) -> Behaviour:
        with self._lock:
            self.requests.append(request)
            source = self._script.popleft() if self._script else None
        if source is None:
            source = self.default
        return source(request) if callable(source) else source

    def _record_only(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def _sleep(self, seconds: float) -> None:
        self._stopping.wait(min(seconds, self.max_hang_s))

    def next_id(self) -> int:
        return next(self._ids)

    # -- batches ---------------------------------------------------------------------------------

    def _create_batch(
        self, wire: Wire, entries: list[tuple[str, Any]], headers: dict[str, str], key_present: bool
    ) -> _FakeBatch:
        """Create a batch: each entry's behaviour is chosen now, as for a direct call."""
        n = self.next_id()
        batch_id = f"msgbatch_fake_{n}" if wire == "anthropic" else f"batch_fake_{n}"
        path = "/v1/messages" if wire == "anthropic" else "/v1/chat/completions"
        with self._lock:
            failed = wire == "openai" and self.fail_batches > 0
            if failed:
                self.fail_batches -= 1
            self.batch_creations.append(batch_id)
        batch = _FakeBatch(batch_id, wire, polls_left=self.batch_polls, failed=failed)
        if not failed:
            for custom_id, body in entries:
                request = RecordedRequest("POST", path, wire, headers, key_present, body, batch_id=batch_id)
                behaviour = self._next_behaviour(request)
                if self.models is not None and request.model not in self.models and behaviour.kind == "reply":
                    behaviour = not_found(str(request.model))
                batch.entries.append((custom_id, request, behaviour))
        else:
            batch.entries = [(custom_id, None, None) for custom_id, _ in entries]  # type: ignore[misc]
        with self._lock:
            self._batches[batch.id] = batch
        return batch

    def end_batches(self) -> None:
        """Let every batch created so far end at its next status request."""
        with self._lock:
            for batch in self._batches.values():
                batch.polls_left = 0

    def batch_entries(self, batch_id: str) -> list[RecordedRequest]:
        """The recorded entries of one batch, in submission order."""
        return [r for r in self.inference_requests() if r.batch_id == batch_id]

    def _poll_batch(self, batch_id: str) -> _FakeBatch | None:
        with self._lock:
            batch = self._batches.get(batch_id)
            if batch is not None and batch.polls_left > 0:
                batch.polls_left -= 1
        return batch

    def _add_file(self, data: bytes) -> str:
        file_id = f"file-fake-{self.next_id()}"
        with self._lock:
            self._files[file_id] = data
        return file_id


@dataclass
class _FakeBatch:
    id: str
    wire: Wire
    polls_left: int
    failed: bool = False
    entries: list[tuple[str, RecordedRequest, Behaviour]] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    output_file_id: str | None = None
    error_file_id: str | None = None

    @property
    def ended(self) -> bool:
        return self.polls_left <= 0

    def outcome(self, behaviour: Behaviour) -> str:
        if behaviour.kind == "reply":
            return "succeeded"
        if behaviour.kind in ("expired", "canceled"):
            return behaviour.kind
        return "errored"


class _Server(ThreadingHTTPServer):
    # socketserver's default listen backlog is 5: a burst of concurrent clients (an evaluation at
    # concurrency 8+) would see connection resets that look like provider outages.
    request_queue_size = 128

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that vanished mid-exchange (killed, timed out, early-stopped) is normal here:
        no traceback on stderr. Anything else is still reported."""
        import sys

        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    fake: FakeLLMServer
    protocol_version = "HTTP/1.1"
    timeout = 10  # seconds; bounds every socket read so no handler thread can block forever
    # Headers and body go out as two writes; with Nagle on, the body waits for the client's delayed ACK.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default stderr access log."""

    # -- request parsing -------------------------------------------------------------------------

    def _record(self, wire: Wire | None, *, parse: bool | None = None) -> RecordedRequest:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        self.raw_body = raw
        try:
            body = json.loads(raw) if raw and (self.fake.parse_bodies if parse is None else parse) else None
        except ValueError:
            body = None
        headers: dict[str, str] = {}
        key_present = False
        for name, value in self.headers.items():
            if name.lower() in SECRET_HEADERS:
                key_present = key_present or (bool(value.strip()) and value.strip().lower() != "bearer")
                headers[name.lower()] = REDACTED
            else:
                headers[name.lower()] = value
        return RecordedRequest(
            method=self.command,
            path=self.path,
            wire=wire,
            headers=headers,
            api_key_present=key_present,
            body=body,
        )

    def _send(
        self,
        status: int,
        payload: bytes,
        headers: tuple[tuple[str, str], ...] = (),
        content_type: str = "application/json",
    ) -> None:
        try:
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(payload)))
            if not self.fake.keep_alive:
                self.send_header("connection", "close")
            for name, value in headers:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up on this call: nothing to answer
            return
        self.close_connection = not self.fake.keep_alive

    # -- routes ----------------------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        request = self._record(None)
        self.fake._record_only(request)
        parts = path.split("/")
        if "/messages/batches/" in path:
            batch = self.fake._batches.get(parts[parts.index("batches") + 1])
            if batch is None:
                self._send(404, error_body("anthropic", not_found()))
            elif path.endswith("/results"):
                if not batch.ended:
                    self._send(
                        400,
                        error_body(
                            "anthropic",
                            error(400, error_type="invalid_request_error", message="batch has not ended"),
                        ),
                    )
                else:
                    self._send(200, anthropic_results(self.fake, batch), content_type="application/binary")
            else:
                self._send(
                    200,
                    json.dumps(anthropic_batch(self.fake, self.fake._poll_batch(batch.id) or batch)).encode(),
                )
        elif len(parts) >= 3 and parts[-2] == "batches":
            batch = self.fake._poll_batch(parts[-1])
            if batch is None:
                self._send(404, error_body("openai", not_found()))
            else:
                self._send(200, json.dumps(openai_batch(self.fake, batch)).encode())
        elif len(parts) >= 4 and parts[-1] == "content" and parts[-3] == "files":
            data = self.fake._files.get(parts[-2])
            if data is None:
                self._send(404, error_body("openai", not_found()))
            else:
                self._send(200, data, content_type="application/octet-stream")
        elif path.endswith("/models"):
            names = self.fake.models or ["fake-model"]
            models = [{"id": n, "object": "model", "created": 0, "owned_by": "fake"} for n in names]
            self._send(200, json.dumps({"object": "list", "data": models}).encode())
        else:
            self._send(
                404, json.dumps({"error": {"message": f"no route {path}", "type": "not_found"}}).encode()
            )

    def _batch_post(self, path: str) -> bool:
        """The batch routes (create a batch, upload a file); False for any other path."""
        fake = self.fake
        if path.endswith("/v1/messages/batches"):
            request = self._record(None, parse=True)
            fake._record_only(request)
            entries = [(e["custom_id"], e["params"]) for e in (request.body or {}).get("requests", [])]
            batch = fake._create_batch("anthropic", entries, request.headers, request.api_key_present)
            self._send(200, json.dumps(anthropic_batch(fake, batch)).encode())
            return True
        if path.endswith("/files"):
            request = self._record(None, parse=False)
            fake._record_only(request)
            content_type = self.headers.get("content-type", "")
            message = email.parser.BytesParser(policy=email.policy.default).parsebytes(
                b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + self.raw_body
            )
            fields: dict[str, bytes] = {}
            filename = "upload"
            for part in message.iter_parts():
                name = part.get_param("name", header="content-disposition")
                payload = part.get_payload(decode=True)
                if isinstance(name, str) and isinstance(payload, bytes):
                    fields[name] = payload
                    filename = part.get_filename() or filename
            data = fields.get("file", b"")
            file_id = fake._add_file(data)
            self._send(
                200,
                json.dumps(
                    {
                        "id": file_id,
                        "object": "file",
                        "bytes": len(data),
                        "created_at": int(time.time()),
                        "filename": filename,
                        "purpose": fields.get("purpose", b"").decode(),
                        "status": "processed",
                    }
                ).encode(),
            )
            return True
        if path.endswith("/batches"):
            request = self._record(None, parse=True)
            fake._record_only(request)
            body = request.body or {}
            lines = fake._files.get(str(body.get("input_file_id")), b"").decode().splitlines()
            entries = [(d["custom_id"], d["body"]) for d in (json.loads(x) for x in lines if x.strip())]
            batch = fake._create_batch("openai", entries, request.headers, request.api_key_present)
            self._send(
                200,
                json.dumps(openai_batch(fake, batch, input_file_id=str(body.get("input_file_id")))).encode(),
            )
            return True
        return False

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if self._batch_post(path):
            return
        if path.endswith("/v1/messages"):
            wire: Wire | None = "anthropic"
        elif path.endswith("/chat/completions"):
            wire = "openai"
        else:
            wire = None
        request = self._record(wire)
        if wire is None:
            self.fake._record_only(request)
            self._send(
                404, json.dumps({"error": {"message": f"no route {path}", "type": "not_found"}}).encode()
            )
            return
        behaviour = self.fake._next_behaviour(request)
        models = self.fake.models
        if models is not None and request.model not in models and behaviour.kind == "reply":
            behaviour = not_found(str(request.model))
        ticket: CacheTicket | None = None
        usage: Usage | None = None
        if behaviour.kind == "reply":
            # Priced as it arrives; what it writes is readable once its response begins (below).
            try:
                usage, ticket = price(self.fake, wire, request, behaviour)
            except CacheRequestError as exc:
                bad = error(400, error_type="invalid_request_error", message=str(exc))
                self._send(400, error_body(wire, bad))
                return
        if behaviour.delay_s and behaviour.kind != "hang":
            self.fake._sleep(behaviour.delay_s)
        if behaviour.kind == "hang":
            self.fake._sleep(behaviour.delay_s)
            self.close_connection = True  # drop the connection without an answer
            return
        if behaviour.kind == "malformed":
            self._send(behaviour.status, b'{"id": "broken", "content": [ this is not json')
            return
        if behaviour.kind == "error":
            self._send(behaviour.status, error_body(wire, behaviour), behaviour.headers)
            return
        if behaviour.kind in ("expired", "canceled"):  # batch-only behaviours: a direct call gets a 500
            self._send(500, error_body(wire, server_error()))
            return
        assert usage is not None
        if ticket is not None:
            ticket.commit()
        with self.fake._lock:
            self.fake.replies.append((request, usage))
        payload = (
            anthropic_message(self.fake, request, behaviour, usage)
            if wire == "anthropic"
            else (openai_completion(self.fake, request, behaviour, usage))
        )
        self._send(200, json.dumps(payload).encode(), behaviour.headers)


# -- pytest fixtures -------------------------------------------------------------------------------


@dataclass
class _FixtureState:
    servers: list[FakeLLMServer] = field(default_factory=list)


@pytest.fixture
def fake_llm() -> Iterator[FakeLLMServer]:
    """A started `FakeLLMServer` (default: valid verdicts), stopped and joined at teardown."""
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def fake_llm_factory() -> Iterator[Callable[..., FakeLLMServer]]:
    """Build started servers with custom options (``default=``, ``models=``); all stopped at teardown."""
    state = _FixtureState()

    def build(**kwargs: Any) -> FakeLLMServer:
        server = FakeLLMServer(**kwargs).start()
        state.servers.append(server)
        return server

    yield build
    for server in state.servers:
        server.stop()
