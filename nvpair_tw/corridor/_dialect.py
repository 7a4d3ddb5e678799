# -*- test-case-name: tests.corridor.test_dialect -*-
"""Every attempt speaks its node's dialect (docs/behaviour.md §11.3, §11.4).

What a request's attempts send is one value, :data:`Sends`, decided once before the first
attempt: :class:`AsIs` when every candidate speaks the route natively under the client's name for
the model (one :class:`Wire` for all), else a :class:`Speech`, whose :meth:`Speech.wire` gives
each candidate its :class:`Wire`: the client's own request when the node's kind speaks the route
natively (with only the ``model`` value replaced when the node knows the model by another name),
or the request translated from the client's original body. A node found to lack a route its kind
speaks (it answered a missing-route 404, docs/behaviour.md §17.3: ``selection.RouteGaps``) is sent
the translation, as a node of a kind without the route is; until then its native wire carries
:attr:`Wire.lacking`, which the attempt calls to learn it. A :class:`Speech` builds each distinct
wire once (per node kind, local name and whether the node speaks the route), however many
candidates share it. The node's answer reaches the attempt loop through a
:class:`TranscodedResponse`, so the gates, the commit point and the relay see the client's
dialect, and nothing else in the corridor changes: commit at the first translated byte, failover,
deadlines, truncation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from attrs import define, evolve, field, frozen
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone, ResponseFailed
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH, IResponse
from zope.interface import implementer

from nvpair_tw.assembly import Assembly, plan_assembly
from nvpair_tw.core import EngineProfile, Outline, Outlined, ProxyBug, StreamCut, outline_body
from nvpair_tw.dialects import (
    MESSAGES_PATH,
    SYNTHESISED_ROUTES,
    TRANSLATED_ROUTES,
    Chain,
    Transducer,
    UsageStripper,
    rename_outlined,
    renamer,
    synthesis,
    translate,
    untranslatable_field,
)
from nvpair_tw.nodes import Node
from nvpair_tw.selection import RouteGaps

__all__ = [
    "Answer",
    "AsIs",
    "Reach",
    "Sends",
    "Speech",
    "TranscodedResponse",
    "UsageCell",
    "Wire",
    "may_lack",
    "reach",
    "speaks",
]

Answer = Callable[[int, bytes | None], Transducer]
UsageNoted = Callable[[dict[str, Any]], None]
"""Takes the usage chunk a native OpenAI stream was asked for on the client's behalf (§12.2)."""


@define
class UsageCell:
    """Keeps the usage chunk removed from one answer (§12.2): a fact of the relay, read once
    the answer ended."""

    frame: dict[str, Any] | None = None

    def __call__(self, frame: dict[str, Any]) -> None:
        self.frame = frame


@frozen
class Wire:
    """What one attempt sends to its node, and how the node's answer becomes the client's.

    ``answer`` is None when the node's bytes are relayed as they come; ``translated`` says whether
    the route was translated for the node's kind; ``local_model`` is the name the node was asked
    for (None: no model).
    """

    method: bytes
    target: bytes
    body: bytes
    assembly: Assembly | None
    answer: Answer | None = None
    translated: bool = False
    local_model: str | None = None
    lacking: Callable[[Node], None] | None = None
    """For a native wire of a route a node may be found to lack (:func:`may_lack`): learns that the
    node lacks it (it answered a missing-route 404), after which the node's wire is the
    translation; None: nothing to learn."""


@frozen
class Reach:
    """Whether a node can take a request: natively, translated, or not (``field`` names why not
    when the request itself is untranslatable)."""

    native: bool
    translated: bool
    field: str | None = None

    @property
    def ok(self) -> bool:
        return self.native or self.translated


_NATIVE = Reach(native=True, translated=False)
_SYNTHESISED = Reach(native=False, translated=True)
_UNREACHABLE = Reach(native=False, translated=False)
"""The answers of :func:`reach` that depend on nothing in the request, made once (frozen)."""


_MAY_LACK = frozenset({MESSAGES_PATH})
"""The translated routes a node whose kind speaks them may still lack, its build deciding:
Anthropic Messages, which vLLM and LocalAI answer with a 404, as llama.cpp and LM Studio builds
older than theirs do (§17.3)."""


def may_lack(path: str) -> bool:
    """Whether a node whose kind speaks ``path`` may still be found to lack it, and be sent the
    translation instead (§17.3)."""
    return path in _MAY_LACK


def speaks(facade: EngineProfile, node: Node, path: str, gaps: RouteGaps) -> bool:
    """Whether ``node`` is sent ``path`` as it is behind ``facade``: its kind speaks the route
    (§11.3) and the node was not found to lack it (§17.3)."""
    return node.speaks(facade, path) and not gaps.lacks(node, path)


def reach(
    facade: EngineProfile,
    node: Node,
    path: str,
    parsed: Mapping[str, Any] | None,
    gaps: RouteGaps,
) -> Reach:
    """How ``node`` can take a request for ``path`` behind ``facade`` (§11.3, §17.3)."""
    if speaks(facade, node, path, gaps):
        return _NATIVE
    if path.startswith(SYNTHESISED_ROUTES):
        return _SYNTHESISED
    if path not in TRANSLATED_ROUTES or parsed is None:
        return _UNREACHABLE
    field = untranslatable_field(path, parsed)
    return Reach(native=False, translated=field is None, field=field)


@frozen
class AsIs:
    """Every attempt sends the same :class:`Wire`: each candidate speaks the route natively and
    knows the model by the client's name."""

    sent: Wire

    @classmethod
    def of(
        cls,
        method: bytes,
        target: bytes,
        body: bytes,
        assembly: Assembly | None = None,
        strip_usage: UsageNoted | None = None,
        *,
        local_model: str | None = None,
    ) -> AsIs:
        """``body`` (or the assembly's) to ``target``; a usage chunk asked for on the client's
        behalf is removed on the way back when ``strip_usage`` takes it; ``local_model`` is the
        model the body names, the name every node is sent (docs/behaviour.md §12.3)."""
        sent_body = assembly.body if assembly is not None else body
        sent = Wire(method, target, sent_body, assembly, local_model=local_model)
        return cls(_stripped(sent, strip_usage))

    def wire(self, node: Node) -> Wire:
        """The one wire, whichever the node."""
        return self.sent


def _stripped(wire: Wire, noted: UsageNoted | None) -> Wire:
    """``wire`` with the usage chunk's removal after its answer (a native answer only: a
    translated one reports usage through its translation)."""
    if noted is None or wire.translated:
        return wire
    answer = wire.answer

    def strip(status: int, content_type: bytes | None) -> Transducer:
        stripper = UsageStripper(content_type, noted)
        return stripper if answer is None else Chain(answer(status, content_type), stripper)

    return evolve(wire, answer=strip)


@frozen
class Speech:
    """How every candidate of one request is spoken to (decided once, before the first attempt).

    ``model`` is the model as the client named it; ``local_name`` answers the name a node knows it
    by (the inventory's spelling, :meth:`~nvpair_tw.selection.InventoryBook.local_name`).
    """

    facade: EngineProfile
    method: bytes
    target: bytes
    path: str
    body: bytes
    outline: Outline | None
    """Where ``body``'s top-level members are (None: not known, the renamer scans)."""
    parsed: Mapping[str, Any] | None
    model: str | None
    assembly: Assembly | None
    local_name: Callable[[str, str], str | None]
    assembles: bool
    limit: int
    clock: Callable[[], float]
    gaps: RouteGaps
    """The routes each node was found to lack (§17.3), read at each attempt."""
    strip_usage: UsageNoted | None = None
    _made: dict[tuple[str, str | None, bool], Wire] = field(factory=dict, eq=False, repr=False)
    """The wires built so far, per node kind, local name and whether the node speaks the route
    (each built once)."""

    def wire(self, node: Node) -> Wire:
        """The request ``node``'s attempt sends (raises ``Untranslatable`` only for a node the
        gate let through by mistake)."""
        kind = node.kind_of(self.facade)
        local = self.local_name(node.id, self.model) if self.model else None
        native = speaks(self.facade, node, self.path, self.gaps)
        made = self._made.get((kind.name, local, native))
        if made is None:
            built = self._spoken(kind, local) if native else self._foreign(kind, local)
            made = self._made[kind.name, local, native] = _stripped(built, self.strip_usage)
        return made

    def _spoken(self, kind: EngineProfile, local: str | None) -> Wire:
        """The route as the client sent it, to a node that speaks it; one that may yet be found
        to lack it learns it through :attr:`Wire.lacking` (§17.3)."""
        wire = self._native(kind, local)
        if self.parsed is not None and may_lack(self.path):
            wire = evolve(wire, lacking=self._lacking)
        return wire

    def _foreign(self, kind: EngineProfile, local: str | None) -> Wire:
        """The route for a node that does not speak it: synthesised or translated."""
        if self.path.startswith(SYNTHESISED_ROUTES):
            return self._synthesised(kind, local)
        return self._translated(local)

    def _lacking(self, node: Node) -> None:
        """``node`` answered that it lacks the route (§17.3)."""
        self.gaps.learn(node, self.path)

    def _synthesised(self, kind: EngineProfile, local: str | None) -> Wire:
        """A model-routed route answered from the node's own list (§11.3, last row)."""
        model = self.model or ""
        list_path = kind.facts_list or kind.inventory.path
        plan = synthesis(
            self.path, list_path, local_model=local or model, client_model=model, limit=self.limit
        )
        return Wire(b"GET", list_path.encode("ascii"), b"", None, plan.answer, True, local or model)

    def _native(self, kind: EngineProfile, local: str | None) -> Wire:
        assembly = self.assembly
        body = assembly.body if assembly is not None else self.body
        outline = assembly.outline if assembly is not None else self.outline
        model = self.model
        if model is None or local is None or kind.matches(model, local):
            return Wire(self.method, self.target, body, assembly, local_model=local)
        # The node knows the model by another name (§11.4): only the model value changes.
        try:
            known = Outlined(body, outline) if outline is not None else outline_body(body)
            renamed = rename_outlined(known, local)
        except ValueError:  # no top-level "model" (a route naming it otherwise): sent as it is
            return Wire(self.method, self.target, body, assembly, local_model=local)
        if assembly is not None:
            assembly = Assembly(assembly.dialect, renamed.body, assembly.limit, renamed.outline)

        def answer(status: int, content_type: bytes | None) -> Transducer:
            return renamer(local, model, content_type)

        return Wire(self.method, self.target, renamed.body, assembly, answer, local_model=local)

    def _translated(self, local: str | None) -> Wire:
        assert self.parsed is not None  # the gate admits translation only for a JSON body
        model = self.model or ""
        parsed: Mapping[str, Any] = self.parsed
        # A whole answer the proxy may assemble is asked for as a stream and folded by the
        # route's own assembly (the first-body timer stops at the first translated byte).
        assembly = None
        if self.assembles and parsed.get("stream", True) is False:
            assembly = plan_assembly(self.path, self.body, parsed, self.limit, self.outline)
            if assembly is not None:
                parsed = {**parsed, "stream": True}
        translation = translate(
            self.path, parsed, local_model=local or model, client_model=model, limit=self.limit
        )
        clock = self.clock

        def answer(status: int, content_type: bytes | None) -> Transducer:
            return translation.answer(status, content_type, clock)

        return Wire(
            b"POST",
            translation.path.encode("ascii"),
            translation.body,
            assembly,
            answer,
            translated=True,
            local_model=local or model,
        )


Sends = AsIs | Speech
"""What a request's attempts send, decided once before the first one."""


@implementer(IResponse)
class TranscodedResponse:
    """A node's response as the client's dialect: the transducer's content type, no length (the
    body is re-framed), the same status; the body passes through ``transducer``."""

    def __init__(self, original: IResponse, transducer: Transducer) -> None:
        self._original = original
        self._transducer = transducer
        self.version = original.version
        self.code = original.code
        self.phrase = original.phrase
        headers = original.headers.copy()
        headers.removeHeader(b"content-length")
        headers.setRawHeaders(b"content-type", [transducer.content_type])
        self.headers: Headers = headers
        self.length: int | object = UNKNOWN_LENGTH
        self.request = original.request
        self.previousResponse = original.previousResponse

    def deliverBody(self, protocol: Protocol) -> None:
        self._original.deliverBody(_Transcoding(protocol, self._transducer))

    def setPreviousResponse(self, response: IResponse) -> None:
        self.previousResponse = response


class _Transcoding(Protocol):
    """Feeds the node's body through a transducer to the protocol that reads the client's.

    States: open until the first end (the node's, or a frame the transducer refuses); after it,
    every further event is ignored. A clean end without the terminal frame and a refused frame
    (a :class:`~nvpair_tw.core.StreamCut`: the node's fault) reach the reader as a failed body
    (``ResponseFailed``), so the relay truncates (or, before commit, the attempt fails over).
    Anything else the transducer raises is a bug of the proxy's, not the node's: it reaches the
    reader as a :class:`~nvpair_tw.core.ProxyBug`, which no stage takes for a transport failure
    (before commit the request fails with the proxy's own 500, after it the stream is cut and the
    bug logged once; the node is neither cooled nor left for another).
    """

    def __init__(self, reader: Protocol, transducer: Transducer) -> None:
        self._reader = reader
        self._transducer = transducer
        self._ended = False
        self._producer: IPushProducer | None = None

    def makeConnection(self, transport: Any) -> None:
        self._producer = transport
        self._reader.makeConnection(transport)

    def dataReceived(self, data: bytes) -> None:
        if self._ended:
            return
        try:
            out = self._transducer.feed(data)
        except Exception as error:
            self._refuse(_failed(error))
            return
        if out:
            self._reader.dataReceived(out)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self._ended:
            return
        self._ended = True
        if reason.check(ResponseDone, PotentialDataLoss):
            try:
                out = self._transducer.end()  # StreamCut: the terminal frame never came
            except Exception as error:
                reason = _failed(error)
            else:
                if out:
                    try:
                        self._reader.dataReceived(out)
                    finally:
                        self._reader.connectionLost(reason)
                    return
        self._reader.connectionLost(reason)

    def _refuse(self, reason: Failure) -> None:
        self._ended = True
        if self._producer is not None:
            self._producer.stopProducing()
        self._reader.connectionLost(reason)


def _failed(error: Exception) -> Failure:
    """How a transducer's error ends the body: the node's (a ``StreamCut``) as a transport
    failure, any other as the proxy's bug."""
    if isinstance(error, StreamCut):
        return Failure(ResponseFailed([Failure(error)]))
    return Failure(ProxyBug(error))
