"""The hop to a node: the keep-alive HTTP/1.1 client (its sans-IO response reader, which the
WebSocket tunnel reads node heads with too), one attempt against one node (pool, replayed
body, header deadline, body gate) and the bounded control-plane read.
"""

from __future__ import annotations

from nvpair_tw.upstream._agent import NodeAgent
from nvpair_tw.upstream._attempt import (
    TRANSPORT_FAILURES,
    BodyEnd,
    BodyGate,
    BusyWait,
    Discard,
    FirstBodyTimeout,
    FirstBodyTimer,
    HeaderTimeout,
    NodeEndpointFactory,
    UpstreamClient,
    describe_failure,
    is_cancellation,
    make_pool,
    node_url,
)
from nvpair_tw.upstream._fetch import (
    MAX_JSON_BYTES,
    ReadError,
    ReadTimeout,
    WholeBody,
    get_json,
    join_url,
    make_http_client,
    post_json,
)
from nvpair_tw.upstream._http1 import BadResponse, BodyReader, HeadParser, ResponseHead
from nvpair_tw.upstream._probe import node_answers

__all__ = [
    "MAX_JSON_BYTES",
    "TRANSPORT_FAILURES",
    "BadResponse",
    "BodyEnd",
    "BodyGate",
    "BodyReader",
    "BusyWait",
    "Discard",
    "FirstBodyTimeout",
    "FirstBodyTimer",
    "HeadParser",
    "HeaderTimeout",
    "NodeAgent",
    "NodeEndpointFactory",
    "ReadError",
    "ReadTimeout",
    "ResponseHead",
    "UpstreamClient",
    "WholeBody",
    "describe_failure",
    "get_json",
    "is_cancellation",
    "join_url",
    "make_http_client",
    "make_pool",
    "node_answers",
    "node_url",
    "post_json",
]
