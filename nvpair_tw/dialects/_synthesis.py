# -*- test-case-name: tests.dialects.test_synthesis -*-
"""Model-routed answers for a node of another kind (docs/behaviour.md §11.3, last row).

Ollama's ``POST /api/show`` and LM Studio's ``GET /api/v0/models/{id}`` name one model. A node
whose kind does not serve the route is asked for its own model list instead, and the answer is
synthesised from what that list says of the model: :func:`synthesis` gives the request to send and
a :class:`Synthesis` transducer folding the node's list into the client's answer. A model the list
does not hold is answered from its name alone; nothing is invented.
"""

from __future__ import annotations

import json
from typing import Any

from attrs import frozen

from nvpair_tw.dialects._common import AnswerTooLarge, MalformedAnswer, dump
from nvpair_tw.dialects._models import ModelFacts, facts_from, record_for, show_answer

__all__ = ["SYNTHESISED_ROUTES", "Synthesis", "synthesis"]

SYNTHESISED_ROUTES = ("/api/show", "/api/v0/models/")
"""The model-routed client routes answered from a node's own list (the second is a prefix)."""

_JSON = b"application/json; charset=utf-8"


class Synthesis:
    """Buffers a node's model list (capped) and, at its end, answers the client's route for
    ``model`` (the node's local name; the answer names ``client_model``). A non-2xx list is passed
    through as it is."""

    def __init__(
        self, route: str, list_path: str, model: str, client_model: str, status: int, limit: int
    ) -> None:
        self._route = route
        self._list_path = list_path
        self._model = model
        self._client_model = client_model
        self._ok = 200 <= status < 300
        self._limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self.content_type = _JSON

    @property
    def tokens(self) -> tuple[int | None, int | None]:
        return None, None

    def feed(self, data: bytes) -> bytes:
        self._size += len(data)
        if self._size > self._limit:
            raise AnswerTooLarge("the node's model list is larger than the cap")
        self._parts.append(data)
        return b""

    def end(self) -> bytes:
        body = b"".join(self._parts)
        if not self._ok:
            return body
        try:
            facts = facts_from(self._list_path, json.loads(body))
        except (ValueError, RecursionError) as error:
            raise MalformedAnswer(f"the node's model list is unusable: {error}") from None
        found = next((f for f in facts if f.name == self._model), ModelFacts(self._model))
        if self._route == "/api/show":
            return dump(show_answer(found))
        record: dict[str, Any] = record_for("/api/v0/models", found)
        return dump({**record, "id": self._client_model})


@frozen
class SynthesisPlan:
    """What to ask the node (a GET of its own list), and how to answer the client."""

    route: str
    list_path: str
    model: str
    client_model: str
    limit: int

    def answer(self, status: int, content_type: bytes | None) -> Synthesis:
        return Synthesis(
            self.route, self.list_path, self.model, self.client_model, status, self.limit
        )


def synthesis(
    route: str, list_path: str, *, local_model: str, client_model: str, limit: int = 8 << 20
) -> SynthesisPlan:
    """The plan for a model-routed ``route`` answered from the node's list at ``list_path``."""
    if not route.startswith(SYNTHESISED_ROUTES):
        raise ValueError(f"{route} is not answered from a model list")
    return SynthesisPlan(
        route if route == "/api/show" else "/api/v0/models/",
        list_path,
        local_model,
        client_model,
        limit,
    )
