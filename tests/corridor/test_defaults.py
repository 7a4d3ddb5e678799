"""Per-model defaults (docs/behaviour.md §16.1): the served model's table applied to the request
once, before translation, without a duplicate key; checked on the edit itself and on what a node
received over a real socket."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import pytest_twisted
from hypothesis import given, settings
from hypothesis import strategies as st

from nvpair_tw.core import RouteKind, outline_body
from nvpair_tw.corridor._defaults import served
from nvpair_tw.corridor._head import Head
from nvpair_tw.corridor._inbound import Inbound
from nvpair_tw.inbound import Parsed, parse_document
from nvpair_tw.nodes import ModelPolicy
from nvpair_tw.simulated import SimulatedEngine
from nvpair_tw.testing import Clusters
from tests.corridor.catalogued import CataloguedCluster, folded_duplicates

pytestmark = pytest.mark.timeout(30)

POLICY = ModelPolicy(
    defaults={"keep_alive": "30m", "think": False, "options": {"num_ctx": 16384, "seed": 7}},
    force={"options": {"num_gpu": 99}, "Top_K": 5},
)


def inbound(body: bytes, kind: RouteKind = RouteKind.INFERENCE) -> Inbound:
    parsed = parse_document(body)
    assert isinstance(parsed, Parsed)
    # Only the kind is read here; an Inbound keeps the head's other fields it serves.
    head = cast(Head, SimpleNamespace(kind=kind, path=None, caller=None, node=None, priority=None))
    return Inbound(head, body, parsed.doc, parsed.doc.get("model"), parsed)


def consistent(result: Inbound) -> dict[str, Any]:
    """The edited body is one JSON object equal to the new document, with the new outline."""
    assert result.outline is not None
    assert outline_body(result.body).outline == result.outline
    decoded: dict[str, Any] = json.loads(result.body)
    assert decoded == result.doc
    assert folded_duplicates(result.body) == []
    return decoded


def test_defaults_fill_what_the_client_did_not_set_and_keep_what_it_did() -> None:
    body = b'{"model":"m", "keep_alive": "5m", "options": {"seed": 1, "temperature": 0.2}}'
    result = consistent(served(inbound(body), POLICY))
    assert result == {
        "model": "m",
        "keep_alive": "5m",
        "think": False,
        "Top_K": 5,
        "options": {"seed": 1, "temperature": 0.2, "num_ctx": 16384, "num_gpu": 99},
    }


def test_a_null_is_not_set_and_is_replaced_where_it_stands() -> None:
    body = b'{"model":"m","keep_alive":null,"options":null}'
    out = served(inbound(body), POLICY)
    consistent(out)
    assert out.body.startswith(b'{"think":false,"Top_K":5,"model":"m","keep_alive":"30m",')


def test_a_table_key_replaces_the_clients_key_in_place_under_its_spelling() -> None:
    """Go engines match keys case-insensitively and keep the last: ``KEEP_ALIVE`` and
    ``keep_alive`` would be one field twice."""
    body = b'{"KEEP_ALIVE":"1m","model":"m","top_k":40,"Options":{"NUM_GPU":1}}'
    out = served(inbound(body), POLICY)
    decoded = consistent(out)
    assert decoded == {
        "think": False,
        "KEEP_ALIVE": "1m",
        "model": "m",
        "top_k": 5,
        "Options": {"NUM_GPU": 99, "num_ctx": 16384, "seed": 7},
    }


def test_force_replaces_an_options_value_that_is_not_a_table() -> None:
    out = served(inbound(b'{"model":"m","options":"x"}'), ModelPolicy(force={"options": {"a": 1}}))
    assert consistent(out)["options"] == {"a": 1}
    kept = served(inbound(b'{"model":"m","options":"x"}'), ModelPolicy(defaults={"options": {}}))
    assert kept.body == b'{"model":"m","options":"x"}'


def test_an_untouched_body_is_the_clients_own_bytes() -> None:
    body = b'{"model":"m",  "keep_alive":"1m"}'
    original = inbound(body)
    assert served(original, ModelPolicy()) is original
    assert served(original, ModelPolicy(defaults={"keep_alive": "9m"})) is original


def test_a_fallback_renames_the_model_and_a_route_that_is_not_inference_gets_no_defaults() -> None:
    body = b'{"Name":"big","verbose":true}'
    out = served(inbound(body, RouteKind.MODEL_ROUTED), POLICY, "small")
    assert out.body == b'{"Name":"small","verbose":true}'
    assert out.model == "small" and consistent(out)["Name"] == "small"


_KEYS = st.sampled_from(["model", "keep_alive", "KEEP_ALIVE", "think", "options", "Options", "x"])
_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=3))
_OPTIONS = st.dictionaries(st.sampled_from(["num_ctx", "NUM_CTX", "seed", "t"]), _VALUES)


@settings(max_examples=150, deadline=None)
@given(
    client=st.dictionaries(_KEYS, st.one_of(_VALUES, _OPTIONS), max_size=5),
    defaults=st.dictionaries(st.sampled_from(["keep_alive", "think", "x"]), _VALUES, max_size=3),
    options=_OPTIONS,
)
def test_no_edit_ever_makes_a_duplicate_key(
    client: dict[str, Any], defaults: dict[str, Any], options: dict[str, Any]
) -> None:
    folded: dict[str, tuple[str, Any]] = {}
    for key, value in client.items():
        folded.setdefault(key.casefold(), (key, value))
    doc = dict(folded.values())
    policy = ModelPolicy(defaults={**defaults, "options": options}, force={"Think": True})
    out = served(inbound(json.dumps(doc).encode()), policy)
    decoded = consistent(out)
    assert [v for k, v in decoded.items() if k.casefold() == "think"] == [True]


@pytest_twisted.ensureDeferred
async def test_the_node_receives_the_defaults_with_the_clients_keys(
    reactor: Any, clusters: Clusters, tmp_path: Path
) -> None:
    """Native Ollama route: the defaults reach the node, the client's own fields stay, no key is
    twice; a field the client set keeps its value."""
    cluster = clusters(CataloguedCluster)
    engine = SimulatedEngine(reactor, ("qwen3:8b",), kind="ollama")
    tables = (
        '[[model]]\nname = "qwen3:8b"\n'
        'defaults = { keep_alive = "30m", options = { num_ctx = 8192 } }\n'
        "force = { think = false }\n"
    )
    await cluster.start_catalogued({"o": engine}, tables, tmp_path)
    sent = b'{"model":"qwen3:8b","Think":true,"messages":[],"options":{"temperature":0}}'
    status, _, _ = await cluster.post(sent, "/api/chat")
    assert status == 200
    received = cluster.bodies("o")[-1]
    assert folded_duplicates(received) == []
    assert json.loads(received) == {
        "keep_alive": "30m",
        "model": "qwen3:8b",
        "Think": False,
        "messages": [],
        "options": {"temperature": 0, "num_ctx": 8192},
    }


@pytest_twisted.ensureDeferred
async def test_defaults_are_applied_before_translation(
    reactor: Any, clusters: Clusters, tmp_path: Path
) -> None:
    """An Ollama request to an OpenAI-kind node: ``options.temperature`` from the table becomes
    ``temperature``; ``num_ctx`` and ``keep_alive`` have no counterpart and are dropped."""
    cluster = clusters(CataloguedCluster)
    engine = SimulatedEngine(reactor, ("qwen",), kind="openai")
    tables = (
        '[[model]]\nname = "qwen"\n'
        'defaults = { keep_alive = "30m", options = { num_ctx = 8192, temperature = 0.25 } }\n'
    )
    await cluster.start_catalogued({"l": engine}, tables, tmp_path)
    status, _, _ = await cluster.post(b'{"model":"qwen","messages":[],"stream":false}', "/api/chat")
    assert status == 200
    received = json.loads(cluster.bodies("l")[-1])
    assert received["temperature"] == 0.25
    assert "num_ctx" not in json.dumps(received) and "keep_alive" not in received
