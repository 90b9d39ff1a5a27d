"""The judge-call cache: keys, round trips, concurrency across threads, schema refusal."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from optimizer.errors import UserError
from optimizer.evaluation.cache import JudgeCache, NewCall, cache_key
from optimizer.judge.types import VERDICT_SCHEMA, ImagePart, JudgeRequest, Sampling, TextPart


def _request(text: str = "goal", image: bytes = b"img") -> JudgeRequest:
    return JudgeRequest(system="judge", parts=(TextPart(text), ImagePart(image)))


def _key(**overrides: object) -> str:
    args: dict[str, object] = {
        "provider": "openai",
        "model": "m",
        "sampling": Sampling(),
        "schema": VERDICT_SCHEMA,
        "request": _request(),
        "replicate": 0,
    }
    args.update(overrides)
    return cache_key(**args)  # type: ignore[arg-type]


def test_key_changes_with_everything_that_determines_the_call() -> None:
    base = _key()
    variants = [
        _key(provider="anthropic"),
        _key(model="m2"),
        _key(sampling=Sampling(max_tokens=10)),
        _key(sampling=Sampling(temperature=0.0)),
        _key(schema={"type": "object"}),
        _key(request=_request(text="other goal")),
        _key(request=_request(image=b"other image")),
        _key(replicate=1),
    ]
    assert len({base, *variants}) == len(variants) + 1
    # Notes are run bookkeeping, not request content; a fingerprint string is accepted as well.
    assert _key(request=JudgeRequest(system="judge", parts=_request().parts, notes=("x",))) == base
    assert _key(request=_request().fingerprint()) == base


def test_put_then_get_round_trips_and_counts(tmp_path: Path) -> None:
    with JudgeCache(tmp_path / "c.sqlite") as cache:
        assert cache.get("k") is None
        cache.put(
            "k",
            NewCall(
                provider="openai",
                model="m",
                replicate=2,
                request_fingerprint="f",
                reply_text="not json at all",
                reply_model="m-2024",
                input_tokens=100,
                output_tokens=20,
                cost_usd=0.25,
                duration_s=1.5,
            ),
        )
        got = cache.get("k")
        assert got is not None
        assert (got.reply_text, got.reply_model, got.input_tokens, got.output_tokens, got.replicate) == (
            "not json at all",
            "m-2024",
            100,
            20,
            2,
        )
        assert got.cost_usd == pytest.approx(0.25)
        stats = cache.stats()
        assert (stats.entries, stats.hits, stats.misses, stats.writes) == (1, 1, 1, 1)
        assert stats.cost_usd == pytest.approx(0.25)
    # Persisted: a new object on the same file sees the row.
    with JudgeCache(tmp_path / "c.sqlite") as again:
        assert again.get_many(["k", "absent"]).keys() == {"k"}


def test_writes_from_several_threads_all_land(tmp_path: Path) -> None:
    cache = JudgeCache(tmp_path / "c.sqlite")

    def writer(n: int) -> None:
        for i in range(20):
            cache.put(
                f"{n}-{i}",
                NewCall(
                    provider="p",
                    model="m",
                    replicate=0,
                    request_fingerprint="f",
                    reply_text="{}",
                    reply_model="m",
                    input_tokens=1,
                    output_tokens=1,
                ),
            )

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.stats().entries == 80
    cache.close()
    with sqlite3.connect(tmp_path / "c.sqlite") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_newer_schema_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    JudgeCache(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    conn.close()
    with pytest.raises(UserError, match="newer judgeloop"):
        JudgeCache(path)


# Today's key for `_key()`, before the endpoint entered the key material: entries cached against a
# provider's default endpoint must keep hitting.
DEFAULT_ENDPOINT_KEY = "c1358dafed0958c954162835c5d95a870fe7afbf57b6bce3ae3577a0994fc4ba"


def test_the_endpoint_enters_the_key_only_when_it_is_not_the_default() -> None:
    from optimizer.evaluation.cache import endpoint_of

    assert _key() == _key(endpoint=None) == DEFAULT_ENDPOINT_KEY
    one = _key(endpoint=endpoint_of("http://127.0.0.1:8000/v1", "https://api.openai.com/v1"))
    other = _key(endpoint=endpoint_of("http://127.0.0.1:8001/v1", "https://api.openai.com/v1"))
    assert len({DEFAULT_ENDPOINT_KEY, one, other}) == 3
    # Normalised: case, a trailing slash, a default port, credentials, a query make no other endpoint.
    for same in ("HTTP://127.0.0.1:8000/v1/", "http://user:pw@127.0.0.1:8000/v1?api-version=1"):
        assert endpoint_of(same, "https://api.openai.com/v1") == endpoint_of("http://127.0.0.1:8000/v1", None)
    assert endpoint_of("https://Example.com:443/v1", None) == endpoint_of("https://example.com/v1", None)
    # The provider's default endpoint, given or not, is the endpoint of the old keys.
    for default in (None, "https://api.openai.com/v1", "https://API.openai.com/v1/"):
        assert endpoint_of(default, "https://api.openai.com/v1") is None


def test_provider_endpoint_follows_the_configured_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    from optimizer.evaluation.cache import provider_endpoint
    from optimizer.judge.providers import make_provider
    from optimizer.workspace.config import JudgeSection, ProviderName

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    defaults: tuple[tuple[ProviderName, str], ...] = (
        ("openai", "https://api.openai.com/v1"),
        ("anthropic", "https://api.anthropic.com"),
    )
    for provider, default in defaults:
        assert provider_endpoint(make_provider(JudgeSection(provider=provider, model="m"))) is None
        assert (
            provider_endpoint(make_provider(JudgeSection(provider=provider, model="m", base_url=default)))
            is None
        )
        elsewhere = make_provider(
            JudgeSection(provider=provider, model="m", base_url="http://127.0.0.1:9/v1")
        )
        assert provider_endpoint(elsewhere) == "http://127.0.0.1:9/v1"
    # The local judge's server listens on a new port each start: its port is no part of the key.
    assert provider_endpoint(make_provider(JudgeSection(provider="local"))) is None
