# -*- test-case-name: tests.dialects.test_requests, tests.dialects.test_messages_request -*-
"""One request translated for a node of another kind (docs/behaviour.md §11.3, §17.3): the
upstream route and body (:func:`translate`, the table in ``_requests`` and, for Anthropic
Messages, ``_messages_request``), and a fresh transducer per attempt for its answer
(:meth:`Translation.answer`, the answers in ``_answers``, ``_ollama_stream`` and
``_messages_answer``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from attrs import field, frozen

from nvpair_tw.dialects._answers import (
    EmbedAnswer,
    EmbedRoute,
    ErrorAnswer,
    ErrorShape,
    V0Stream,
    V0Whole,
)
from nvpair_tw.dialects._common import Transducer, Untranslatable, media_type
from nvpair_tw.dialects._messages_answer import MessagesError, MessagesStream, MessagesWhole
from nvpair_tw.dialects._messages_request import MESSAGES_PATH
from nvpair_tw.dialects._ollama_stream import (
    Framing,
    OllamaRoute,
    OllamaStream,
    OpenAIRoute,
    StreamShape,
    UpstreamBody,
)
from nvpair_tw.dialects._rename import renamer
from nvpair_tw.dialects._requests import OLLAMA_ROUTES, V0_ROUTES, translate_request

__all__ = ["TRANSLATED_ROUTES", "Translation", "translate", "untranslatable_field"]

TRANSLATED_ROUTES: frozenset[str] = OLLAMA_ROUTES | frozenset(V0_ROUTES) | {MESSAGES_PATH}
"""The client routes :func:`translate` handles (all ``POST``)."""


@frozen
class Translation:
    """A request translated for an OpenAI-compatible node.

    :ivar path: the upstream route, e.g. ``"/v1/chat/completions"``.
    :ivar body: the upstream JSON body, compact UTF-8 (an LM Studio body: the client's bytes).
    :ivar streams: whether the client asked for a stream.
    :ivar client_path: the client's route.
    :ivar client_model: the model as the client named it (every ``model`` of the answer).
    :ivar local_model: the node's name for it.
    :ivar limit: the cap, in bytes or characters, on what is held of one answer.
    """

    path: str
    body: bytes = field(repr=False)
    streams: bool
    client_path: str
    client_model: str
    local_model: str
    limit: int = 8 << 20

    def answer(
        self, status: int, content_type: bytes | None, clock: Callable[[], float]
    ) -> Transducer:
        """A fresh transducer for one attempt's answer, created when its status and headers
        arrive: a 2xx becomes the client's dialect, anything else an error answer (see
        ``_answers`` and ``_ollama_stream``). ``clock`` gives seconds since the epoch (the
        reactor's ``seconds``)."""
        if self.client_path == MESSAGES_PATH:
            return self._messages(status, content_type)
        if not 200 <= status < 300:
            ollama = self.client_path in OLLAMA_ROUTES
            return ErrorAnswer(
                content_type, ErrorShape.OLLAMA if ollama else ErrorShape.AS_IS, limit=self.limit
            )
        path = self.client_path
        if path in V0_ROUTES:
            if path.endswith("/embeddings"):
                return renamer(self.local_model, self.client_model, content_type)
            if self.streams:
                return V0Stream(renamer(self.local_model, self.client_model, content_type))
            return V0Whole(self.client_model, clock, content_type, self.limit)
        if path in ("/api/embed", "/api/embeddings"):
            return EmbedAnswer(self.client_model, clock, EmbedRoute(path), limit=self.limit)
        shape = StreamShape(
            OllamaRoute.GENERATE if path == "/api/generate" else OllamaRoute.CHAT,
            OpenAIRoute.COMPLETIONS if self.path == "/v1/completions" else OpenAIRoute.CHAT,
            Framing.STREAM if self.streams else Framing.WHOLE,
            UpstreamBody.JSON
            if media_type(content_type) == b"application/json"
            else UpstreamBody.SSE,
        )
        return OllamaStream(self.client_model, clock, shape, limit=self.limit)

    def _messages(self, status: int, content_type: bytes | None) -> Transducer:
        """An Anthropic Messages client's answer (docs/behaviour.md §17.3)."""
        if not 200 <= status < 300:
            return MessagesError(status, content_type, self.limit)
        if self.streams:
            return MessagesStream(self.client_model, content_type, limit=self.limit)
        return MessagesWhole(self.client_model, content_type, limit=self.limit)


def translate(
    client_path: str,
    parsed: Mapping[str, Any],
    *,
    local_model: str,
    client_model: str,
    limit: int = 8 << 20,
    body: bytes | None = None,
) -> Translation:
    """Translate an Ollama or LM Studio ``/api/v0`` request for an OpenAI-compatible node.

    :param client_path: the client's route, one of :data:`TRANSLATED_ROUTES` (else
        ``ValueError``).
    :param parsed: the client's body, parsed.
    :param local_model: the node's name for the model (named in the upstream body).
    :param client_model: the name the client sent (named by every ``model`` of the answer).
    :param limit: the cap on an answer held whole (past it the transducer raises
        :class:`~nvpair_tw.dialects._common.AnswerTooLarge`, a ``StreamCut``).
    :param body: the client's own bytes: an LM Studio body is sent as they are but for ``model``
        (without them, ``parsed`` is dumped compactly).
    :raises Untranslatable: the request cannot be translated faithfully.
    """
    path, upstream, streams = translate_request(client_path, parsed, body, local_model)
    return Translation(path, upstream, streams, client_path, client_model, local_model, limit)


def untranslatable_field(client_path: str, parsed: Mapping[str, Any]) -> str | None:
    """The field that makes this request untranslatable, or None.

    The same rules as :func:`translate` (it runs the translation), so a node of another kind is a
    candidate exactly when its attempt can be translated. ``ValueError`` for a route outside
    :data:`TRANSLATED_ROUTES`.
    """
    try:
        translate_request(client_path, parsed, None, "model")
    except Untranslatable as error:
        return error.field
    return None
