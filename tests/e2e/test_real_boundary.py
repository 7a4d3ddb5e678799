"""A key is a boundary in front of a real Ollama (docs/behaviour.md §14.1): the engine itself reads
requests the way ``tests/golike.py`` simulates (checked here, directly), and through the proxy the
same tricks meet a refusal instead of the engine.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.realnodes import ProxyProcess, RealOllama

pytestmark = [pytest.mark.e2e, pytest.mark.real_engine, pytest.mark.timeout(180)]

MODEL = "smollm2"
SCOPED = "sk-scoped-real-0123456789"
KEYS = f"""
[[key]]
name = "scoped"
key = "{SCOPED}"
models = ["llama3*"]
"""


@pytest.fixture(scope="module")
def proxy(
    real_ollama: RealOllama, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    workdir = tmp_path_factory.mktemp("boundary")
    keys = workdir / "keys.toml"
    keys.write_text(KEYS)
    keys.chmod(0o600)
    started = ProxyProcess(
        ["--engine", "ollama", "--node", f"o={real_ollama.url}", "--keys", str(keys)], workdir
    )
    started.wait_ready(1)
    yield started
    log = started.stop()
    assert "Traceback" not in log, log
    assert SCOPED not in log, "a key reached the log"


def raw(url: str, method: str, target: str, body: bytes, key: str | None = None) -> httpx.Response:
    """One request with its target sent exactly as written (httpx would normalise it)."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    with httpx.Client(timeout=60) as client:
        request = client.build_request(method, url + "/", content=body, headers=headers)
        request.url = request.url.copy_with(raw_path=target.encode("ascii"))
        return client.send(request)


def test_the_real_engine_reads_as_a_go_engine_does(real_ollama: RealOllama) -> None:
    """Directly: Ollama routes a percent-encoded path, takes the first JSON value, and matches
    ``MODEL`` to its ``model`` field with the last match winning. These are the readings the
    proxy's one strict rule is built against."""
    tags = raw(real_ollama.url, "GET", "/api/%74ags", b"")
    assert tags.status_code == 200 and MODEL in tags.text
    folded = raw(
        real_ollama.url, "POST", "/api/show", b'{"model": "nope", "MODEL": "%s"}' % MODEL.encode()
    )
    assert folded.status_code == 200, folded.text
    trailing = raw(
        real_ollama.url, "POST", "/api/show", b'{"model": "%s"} trailing' % MODEL.encode()
    )
    assert trailing.status_code == 200, trailing.text


def test_through_the_proxy_the_same_tricks_are_refused(proxy: ProxyProcess) -> None:
    """A key scoped to ``llama3*`` cannot reach ``smollm2`` by any of them."""
    show = b'{"model": "%s"}' % MODEL.encode()
    encoded = raw(proxy.url, "POST", "/api/%73how", show, SCOPED)
    assert (encoded.status_code, encoded.json()["code"]) == (403, "model-not-allowed")
    folded = raw(proxy.url, "POST", "/api/show", b'{"model": "llama3", "MODEL": "smollm2"}', SCOPED)
    assert (folded.status_code, folded.json()["code"]) == (400, "bad-body")
    trailing = raw(proxy.url, "POST", "/api/show", show + b" trailing", SCOPED)
    assert (trailing.status_code, trailing.json()["code"]) == (400, "bad-body")
    chat = raw(proxy.url, "POST", "/api/%63hat", b'{"MODEL": "%s"}' % MODEL.encode(), SCOPED)
    assert (chat.status_code, chat.json()["code"]) == (403, "model-not-allowed")
    pull = raw(proxy.url, "POST", "/api/pull", show, SCOPED)
    assert (pull.status_code, pull.json()["code"]) == (403, "route-not-allowed")


def test_the_local_caller_still_reaches_the_model_on_an_encoded_path(proxy: ProxyProcess) -> None:
    """The normalised path is forwarded: the engine answers what the proxy classified."""
    show = raw(proxy.url, "POST", "/api/%73how", b'{"model": "%s"}' % MODEL.encode())
    assert show.status_code == 200, show.text
    assert "x-nvpair-node" in show.headers
