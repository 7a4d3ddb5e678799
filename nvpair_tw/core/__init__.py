"""The building blocks every room uses: engine profiles, durations, resolved settings, the proxy's own
error responses, header forwarding and the reactor interface.
"""

from __future__ import annotations

from nvpair_tw.core._durations import format_duration, parse_duration
from nvpair_tw.core._engines import (
    ENGINES,
    RESPONSES_PATH,
    EngineProfile,
    FanOutRoute,
    ModelChange,
    ModelControl,
    ModelListFormat,
    ResidencyFormat,
    RouteKind,
    SlotsFormat,
)
from nvpair_tw.core._errors import raw_error_response, write_error
from nvpair_tw.core._framer import (
    EVENT_ENDS,
    AnswerTooLarge,
    Events,
    Framing,
    Lines,
    MalformedStream,
    ProxyBug,
    StreamCut,
    after_last_event,
    dump,
    event_end,
    line_around,
    media_type,
)
from nvpair_tw.core._headers import (
    HOP_BY_HOP,
    LOOP_HEADER,
    PROCESS_NONCE,
    TARGET_HEADER,
    forward_headers,
    header_tokens,
    loop_marks,
    upstream_request_headers,
)
from nvpair_tw.core._json import (
    Edit,
    Outline,
    Outlined,
    Span,
    byte_offsets,
    object_members,
    outline_body,
    set_members,
    skip_whitespace,
)
from nvpair_tw.core._priority import PRIORITY_HEADER, Priority, priority_of
from nvpair_tw.core._reactor import IProxyReactor, IWriteHolding, abort, close, one_send
from nvpair_tw.core._resolved import (
    UPSTREAM_CLIENTS,
    Resolved,
    Settings,
    resolve_first_body_timeout,
    resolve_response_header_timeout,
)
from nvpair_tw.core._states import IllegalCall
from nvpair_tw.core._toolcalls import ToolCalls

__all__ = [
    "ENGINES",
    "EVENT_ENDS",
    "HOP_BY_HOP",
    "LOOP_HEADER",
    "PRIORITY_HEADER",
    "PROCESS_NONCE",
    "RESPONSES_PATH",
    "TARGET_HEADER",
    "UPSTREAM_CLIENTS",
    "AnswerTooLarge",
    "Edit",
    "EngineProfile",
    "Events",
    "FanOutRoute",
    "Framing",
    "IProxyReactor",
    "IWriteHolding",
    "IllegalCall",
    "Lines",
    "MalformedStream",
    "ModelChange",
    "ModelControl",
    "ModelListFormat",
    "Outline",
    "Outlined",
    "Priority",
    "ProxyBug",
    "ResidencyFormat",
    "Resolved",
    "RouteKind",
    "Settings",
    "SlotsFormat",
    "Span",
    "StreamCut",
    "ToolCalls",
    "abort",
    "after_last_event",
    "byte_offsets",
    "close",
    "dump",
    "event_end",
    "format_duration",
    "forward_headers",
    "header_tokens",
    "line_around",
    "loop_marks",
    "media_type",
    "object_members",
    "one_send",
    "outline_body",
    "parse_duration",
    "priority_of",
    "raw_error_response",
    "resolve_first_body_timeout",
    "resolve_response_header_timeout",
    "set_members",
    "skip_whitespace",
    "upstream_request_headers",
    "write_error",
]
