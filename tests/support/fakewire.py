"""The fake LLM server's wire formats (`tests.support.fakeserver`): the Anthropic and OpenAI response
bodies, their error bodies, the batch objects and result files, and what each answer is billed (`Usage`:
the scripted usage, the prompt cache's bill or a size estimate). Moved out of fakeserver.py, which keeps
the server, its request handler and the fixtures; `Usage` is still importable from there."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from tests.support.fakecache import CacheTicket
    from tests.support.fakeserver import Behaviour, FakeLLMServer, RecordedRequest, _FakeBatch

Wire = Literal["anthropic", "openai"]


@dataclass(frozen=True)
class Usage:
    """Token counts to report. ``input_tokens`` excludes cache reads and writes (Anthropic's convention);
    on the OpenAI wire ``prompt_tokens = input + cache_read`` and ``cached_tokens = cache_read``.
    ``cache_write_1h_tokens`` is the part of the writes with the 1-hour TTL (Anthropic's
    ``cache_creation`` breakdown; the rest is reported as 5-minute writes)."""

    input_tokens: int
    output_tokens: int
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0


def price(
    fake: FakeLLMServer, wire: Wire, request: RecordedRequest, behaviour: Behaviour
) -> tuple[Usage, CacheTicket | None]:
    """The scripted usage, else the prompt cache's bill (when enabled; with the ticket whose
    ``commit()`` makes its writes readable), else a size estimate."""
    if behaviour.usage is not None:
        return behaviour.usage, None
    out = (behaviour.text or "") + "".join(json.dumps(t.arguments) for t in behaviour.tool_calls)
    output_tokens = max(1, len(out) // 4)
    if fake.prompt_cache is not None and isinstance(request.body, dict):
        cache = fake.prompt_cache
        ticket = (
            cache.begin_anthropic(request.body) if wire == "anthropic" else cache.begin_openai(request.body)
        )
        bill = ticket.usage
        return Usage(
            input_tokens=bill.input_tokens,
            output_tokens=output_tokens,
            cache_read_tokens=bill.cache_read_tokens,
            cache_write_tokens=bill.cache_write_tokens,
            cache_write_1h_tokens=bill.cache_write_1h_tokens,
        ), ticket
    prompt = json.dumps(request.body) if request.body is not None else ""
    return Usage(input_tokens=max(1, len(prompt) // 4), output_tokens=output_tokens), None


def batch_usages(fake: FakeLLMServer, batch: _FakeBatch) -> dict[str, Usage]:
    """The usage of every succeeded entry of a batch: the entries run together, so each is priced
    before any of their writes becomes readable (a cold batch reads nothing of its own items)."""
    priced: dict[str, Usage] = {}
    tickets: list[CacheTicket] = []
    for custom_id, request, behaviour in batch.entries:
        if batch.outcome(behaviour) == "succeeded":
            usage, ticket = price(fake, batch.wire, request, behaviour)
            priced[custom_id] = usage
            if ticket is not None:
                tickets.append(ticket)
    for ticket in tickets:
        ticket.commit()
    return priced


def error_body(wire: Wire, behaviour: Behaviour) -> bytes:
    if wire == "anthropic":
        body: dict[str, Any] = {
            "type": "error",
            "error": {"type": behaviour.error_type, "message": behaviour.error_message},
        }
    else:
        body = {"error": {"message": behaviour.error_message, "type": behaviour.error_type, "code": None}}
    return json.dumps(body).encode()


def anthropic_message(
    fake: FakeLLMServer, request: RecordedRequest, behaviour: Behaviour, usage: Usage
) -> dict[str, Any]:
    n = fake.next_id()
    if behaviour.blocks is not None:
        content = list(behaviour.blocks)
    else:
        content = []
        if behaviour.text is not None:
            content.append({"type": "text", "text": behaviour.text})
        for i, call in enumerate(behaviour.tool_calls):
            content.append(
                {
                    "type": "tool_use",
                    "id": call.id or f"toolu_fake_{n}_{i}",
                    "name": call.name,
                    "input": call.arguments,
                }
            )
    has_tool = any(block.get("type") == "tool_use" for block in content)
    return {
        "id": f"msg_fake_{n}",
        "type": "message",
        "role": "assistant",
        "model": request.model or "fake-model",
        "content": content,
        "stop_reason": behaviour.stop_reason or ("tool_use" if has_tool else "end_turn"),
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cache_read_input_tokens": usage.cache_read_tokens,
            "cache_creation_input_tokens": usage.cache_write_tokens,
            "cache_creation": {
                "ephemeral_5m_input_tokens": usage.cache_write_tokens - usage.cache_write_1h_tokens,
                "ephemeral_1h_input_tokens": usage.cache_write_1h_tokens,
            },
        },
    }


def openai_completion(
    fake: FakeLLMServer, request: RecordedRequest, behaviour: Behaviour, usage: Usage
) -> dict[str, Any]:
    n = fake.next_id()
    if behaviour.message is not None:
        message = dict(behaviour.message)
        message.setdefault("role", "assistant")
    else:
        message = {"role": "assistant", "content": behaviour.text}
        if behaviour.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id or f"call_fake_{n}_{i}",
                    "type": "function",
                    "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
                }
                for i, call in enumerate(behaviour.tool_calls)
            ]
    prompt_tokens = usage.input_tokens + usage.cache_read_tokens
    return {
        "id": f"chatcmpl-fake-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.model or "fake-model",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": behaviour.stop_reason
                or ("tool_calls" if message.get("tool_calls") else "stop"),
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": usage.output_tokens,
            "total_tokens": prompt_tokens + usage.output_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cache_read_tokens},
        },
    }


# -- batch wire formats ----------------------------------------------------------------------------


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def anthropic_batch(fake: FakeLLMServer, batch: _FakeBatch) -> dict[str, Any]:
    counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
    if batch.ended:
        for _, _, behaviour in batch.entries:
            counts[batch.outcome(behaviour)] += 1
    else:
        counts["processing"] = len(batch.entries)
    return {
        "id": batch.id,
        "type": "message_batch",
        "processing_status": "ended" if batch.ended else "in_progress",
        "request_counts": counts,
        "created_at": iso(batch.created),
        "expires_at": iso(batch.created + timedelta(hours=24).total_seconds()),
        "ended_at": iso(time.time()) if batch.ended else None,
        "archived_at": None,
        "cancel_initiated_at": None,
        "results_url": f"{fake.url}/v1/messages/batches/{batch.id}/results" if batch.ended else None,
    }


def anthropic_results(fake: FakeLLMServer, batch: _FakeBatch) -> bytes:
    lines = []
    usages = batch_usages(fake, batch)
    for custom_id, request, behaviour in batch.entries:
        outcome = batch.outcome(behaviour)
        result: dict[str, Any]
        if outcome == "succeeded":
            result = {
                "type": "succeeded",
                "message": anthropic_message(fake, request, behaviour, usages[custom_id]),
            }
        elif outcome == "errored":
            result = {"type": "errored", "error": json.loads(error_body("anthropic", behaviour))}
        else:
            result = {"type": outcome}
        lines.append(json.dumps({"custom_id": custom_id, "result": result}))
    return ("\n".join(lines) + "\n").encode()


def openai_batch(fake: FakeLLMServer, batch: _FakeBatch, input_file_id: str = "") -> dict[str, Any]:
    outcomes = [batch.outcome(b) for _, _, b in batch.entries] if not batch.failed else []
    status = "validating"
    if batch.failed and batch.ended:
        status = "failed"
    elif batch.ended:
        status = "expired" if "expired" in outcomes else "completed"
        if batch.output_file_id is None and batch.error_file_id is None:
            openai_files(fake, batch)
    elif batch.polls_left < fake.batch_polls:
        status = "in_progress"
    done = batch.ended and not batch.failed
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": "/v1/chat/completions",
        "input_file_id": input_file_id or "file-fake",
        "completion_window": "24h",
        "status": status,
        "created_at": int(batch.created),
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "errors": {
            "object": "list",
            "data": [{"code": "invalid_request", "message": "fake validation failure"}],
        }
        if batch.failed and batch.ended
        else None,
        "request_counts": {
            "total": len(batch.entries),
            "completed": sum(o == "succeeded" for o in outcomes) if done else 0,
            "failed": sum(o != "succeeded" for o in outcomes) if done else 0,
        },
    }


def openai_files(fake: FakeLLMServer, batch: _FakeBatch) -> None:
    output, errors = [], []
    usages = batch_usages(fake, batch)
    for custom_id, request, behaviour in batch.entries:
        n = fake.next_id()
        outcome = batch.outcome(behaviour)
        line: dict[str, Any] = {"id": f"batch_req_fake_{n}", "custom_id": custom_id}
        if outcome == "succeeded":
            body = openai_completion(fake, request, behaviour, usages[custom_id])
            output.append(
                {
                    **line,
                    "response": {"status_code": 200, "request_id": f"req_{n}", "body": body},
                    "error": None,
                }
            )
        elif outcome == "expired":
            errors.append(
                {
                    **line,
                    "response": None,
                    "error": {
                        "code": "batch_expired",
                        "message": "This request could not be executed before the completion window expired.",
                    },
                }
            )
        elif outcome == "canceled":
            errors.append(
                {
                    **line,
                    "response": None,
                    "error": {"code": "batch_cancelled", "message": "This request was cancelled."},
                }
            )
        else:
            errors.append(
                {
                    **line,
                    "response": {
                        "status_code": behaviour.status or 500,
                        "request_id": f"req_{n}",
                        "body": json.loads(error_body("openai", behaviour)),
                    },
                    "error": None,
                }
            )
    if output:
        batch.output_file_id = fake._add_file(("\n".join(json.dumps(x) for x in output) + "\n").encode())
    if errors:
        batch.error_file_id = fake._add_file(("\n".join(json.dumps(x) for x in errors) + "\n").encode())
