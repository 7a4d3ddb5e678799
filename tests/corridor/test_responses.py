"""A stored response is its owner's (docs/behaviour.md §2.1, §14.2): ``nvpair_tw.corridor._responses``
on a real affinity table and an injected clock — who may name a response, what keeps it
remembered, and what an LRU that evicts one of its two entries leaves. Over sockets:
tests/corridor/test_boundary_edges.py."""

from __future__ import annotations

from typing import Any, cast

import pytest
from attrs import define, field
from twisted.internet.task import Clock

from nvpair_tw.corridor._inbound import Inbound
from nvpair_tw.corridor._responses import _owned, _placement, stored_response
from nvpair_tw.corridor._state import FacadeState
from nvpair_tw.fleet._sharing import SharedAffinityTable
from nvpair_tw.inbound import LOCAL, Caller, Rejection
from nvpair_tw.selection import AffinityTable

pytestmark = pytest.mark.timeout(10)

ALICE, BOB = Caller("alice"), Caller("bob")


@define
class _Stalls:
    def cooling(self) -> frozenset[str]:
        return frozenset()


@define
class _Facade:
    """What :func:`stored_response` reads of a facade: its response table."""

    responses: AffinityTable
    stalls: _Stalls = field(factory=_Stalls)


@define
class _Head:
    caller: Caller


@define
class _Asked:
    """What it reads of a request: its path, body and caller."""

    path: str
    doc: dict[str, Any] | None
    head: _Head

    @property
    def caller(self) -> Caller:
        return self.head.caller


def asked(caller: Caller, path: str = "/v1/responses", **doc: Any) -> Inbound:
    return cast(Inbound, _Asked(path, doc if path == "/v1/responses" else None, _Head(caller)))


def stored(facade: _Facade, inbound: Inbound) -> str | Rejection | None:
    return stored_response(cast(FacadeState, facade), inbound)


def made(table: AffinityTable, response_id: str, owner: Caller, node: str = "n1") -> None:
    """What :func:`remember_response` records for a 200 from ``node``."""
    table.record(_placement(response_id), node)
    table.record(_owned(response_id, owner.name), node)


@pytest.mark.parametrize(
    "inbound",
    [
        asked(BOB, previous_response_id="resp_1"),
        asked(BOB, "/v1/responses/resp_1"),
        asked(BOB, "/v1/responses/resp_1/input_items"),
        asked(BOB, "/v1/responses/resp_1/cancel"),
        asked(LOCAL, "/v1/responses/resp_1"),
    ],
)
def test_another_caller_naming_a_known_response_is_refused(inbound: Inbound) -> None:
    clock = Clock()
    facade = _Facade(AffinityTable(clock))
    made(facade.responses, "resp_1", ALICE)
    refused = stored(facade, inbound)
    assert isinstance(refused, Rejection)
    assert (refused.status, refused.code) == (404, "response-not-found")
    assert "resp_1" not in refused.message


@pytest.mark.parametrize(
    "inbound",
    [
        asked(ALICE, previous_response_id="resp_1"),
        asked(ALICE, "/v1/responses/resp_1"),
        asked(ALICE, "/v1/responses/resp_1/input_items"),
    ],
)
def test_its_owner_is_sent_to_its_node(inbound: Inbound) -> None:
    facade = _Facade(AffinityTable(Clock()))
    made(facade.responses, "resp_1", ALICE, "n7")
    assert stored(facade, inbound) == "n7"


@pytest.mark.parametrize(
    "inbound",
    [
        asked(BOB, previous_response_id="resp_unknown"),
        asked(BOB, "/v1/responses"),
        asked(BOB, previous_response_id=""),
        asked(BOB, previous_response_id=5),
        asked(BOB, "/v1/responses/"),
        asked(BOB, "/v1/chat/completions"),
    ],
)
def test_a_request_naming_no_known_response_goes_its_usual_way(inbound: Inbound) -> None:
    facade = _Facade(AffinityTable(Clock()))
    made(facade.responses, "resp_1", ALICE)
    assert stored(facade, inbound) is None


def test_local_callers_are_one_principal() -> None:
    facade = _Facade(AffinityTable(Clock()))
    made(facade.responses, "resp_1", LOCAL)
    assert stored(facade, asked(LOCAL, "/v1/responses/resp_1")) == "n1"
    assert isinstance(stored(facade, asked(ALICE, "/v1/responses/resp_1")), Rejection)


def test_only_the_owners_use_keeps_a_response_remembered() -> None:
    """The owner's use refreshes both entries; another's look refreshes neither, so it cannot
    keep the placement alive past the owner's entry."""
    clock = Clock()
    facade = _Facade(AffinityTable(clock, idle_ttl=300.0))
    made(facade.responses, "resp_1", ALICE)
    clock.advance(200)
    assert stored(facade, asked(ALICE, "/v1/responses/resp_1")) == "n1"
    clock.advance(200)  # 400 s after it was made, 200 after its owner's use
    assert isinstance(stored(facade, asked(BOB, "/v1/responses/resp_1")), Rejection)
    clock.advance(200)  # the other's look did not refresh it
    assert stored(facade, asked(BOB, "/v1/responses/resp_1")) is None
    assert stored(facade, asked(ALICE, "/v1/responses/resp_1")) is None


def test_an_lru_that_evicts_one_entry_never_refuses_the_owner() -> None:
    """The placement is recorded first, so it is the one an LRU bound evicts first."""
    facade = _Facade(AffinityTable(Clock(), max_entries=3))
    made(facade.responses, "resp_1", ALICE, "n1")
    made(facade.responses, "resp_2", BOB, "n2")  # 4 entries: resp_1's placement goes
    assert stored(facade, asked(ALICE, "/v1/responses/resp_1")) == "n1"
    assert stored(facade, asked(BOB, "/v1/responses/resp_1")) is None


def test_a_fleets_table_keeps_the_same_rule_under_its_seal() -> None:
    """Both entries are digests, shared and sealed like any affinity entry."""
    shared: list[tuple[str, bytes, str]] = []
    table = SharedAffinityTable(
        Clock(),
        seal=lambda digest: b"sealed" + digest,
        share=lambda model, digest, node: shared.append((model, digest, node)),
    )
    facade = _Facade(table)
    made(table, "resp_1", ALICE, "n3")
    assert stored(facade, asked(ALICE, previous_response_id="resp_1")) == "n3"
    assert isinstance(stored(facade, asked(BOB, previous_response_id="resp_1")), Rejection)
    assert len(shared) == 2 and all(d.startswith(b"sealed") for _, d, _ in shared)
    assert not any(b"resp_1" in d or b"alice" in d for _, d, _ in shared)
