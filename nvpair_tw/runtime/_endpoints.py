# -*- test-case-name: tests.runtime.test_endpoints -*-
"""The little we read out of Twisted server endpoint strings: a TCP listener's interface and port,
and whether a unix socket was given a file mode; and the URL a client uses to reach a listener.

Used for the self-guard (a node whose URL is one of our own listeners is never a candidate), to
refuse an impossible port at option time rather than with a traceback at bind time, to create
the control channel's socket owner-only unless its endpoint says otherwise, and to say where
clients should point (the start-up summary and the status page, docs/operations.md).
"""

from __future__ import annotations

import re

from attrs import frozen
from twisted.internet.interfaces import IAddress

__all__ = [
    "OWNER_ONLY",
    "TCPListener",
    "client_url",
    "openai_url",
    "own_urls",
    "owner_only",
    "tcp_listener",
]

_UNESCAPED_COLON = re.compile(r"(?<!\\):")
_LOOPBACK_OR_ANY = ("0.0.0.0", "::", "127.0.0.1", "::1", "localhost")

_EVERY_INTERFACE = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}
_EVERY = " (every interface)"

OWNER_ONLY = "600"
"""The mode of a unix socket whose endpoint gives none (Twisted's own default is 666)."""


@frozen
class TCPListener:
    """A ``tcp:``/``tcp6:`` description's interface, port and backlog (Twisted's default 50)."""

    interface: str
    port: int
    backlog: int = 50


def tcp_listener(description: str) -> TCPListener | None:
    """Parse ``tcp:PORT[:interface=X][:backlog=N]`` / ``tcp6:port=PORT:...`` (escaped colons allowed).

    Returns None for other endpoint types; raises ``ValueError`` for a missing or impossible port.
    """
    parts = [p.replace("\\:", ":") for p in _UNESCAPED_COLON.split(description)]
    if not parts or parts[0] not in ("tcp", "tcp6"):
        return None
    positional = [p for p in parts[1:] if "=" not in p]
    options = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
    port = options.get("port", positional[0] if positional else "")
    if not port.isdigit() or int(port) > 65535:
        raise ValueError(f"port must be a number from 0 to 65535, not {port!r}")
    backlog = options.get("backlog", "50")
    if not backlog.isdigit():
        raise ValueError(f"backlog must be a number, not {backlog!r}")
    default = "::" if parts[0] == "tcp6" else "0.0.0.0"
    return TCPListener(options.get("interface", default), int(port), int(backlog))


def own_urls(description: str) -> list[str]:
    """The URLs a client would use to reach a listener (for the self-guard, docs/behaviour.md §3)."""
    try:
        listener = tcp_listener(description)
    except ValueError:
        return []
    if listener is None:
        return []
    host = listener.interface
    hosts = {f"[{host}]" if ":" in host else host}
    if host in _LOOPBACK_OR_ANY:
        hosts |= {"127.0.0.1", "localhost", "[::1]"}
    return [f"http://{h}:{listener.port}" for h in sorted(hosts)]


def owner_only(description: str) -> str:
    """``description`` with ``:mode=600`` added when it is a filesystem ``unix:`` socket that
    names no mode (``unix:/run/nvpair/ctl.sock`` → ``unix:/run/nvpair/ctl.sock:mode=600``);
    any other description, or one with a ``mode=``, is returned as it is."""
    text = description.strip()
    parts = [p.replace("\\:", ":") for p in _UNESCAPED_COLON.split(text)]
    if parts[0] != "unix":
        return description
    named = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
    positional = [p for p in parts[1:] if "=" not in p]
    path = named.get("address", positional[0] if positional else "")
    if "mode" in named or not path or path.startswith(("\0", "@")):
        return description
    return f"{text}:mode={OWNER_ONLY}"


def client_url(address: IAddress, description: str) -> str:
    """The URL a client on this machine uses to reach a listener at ``address`` (``description``:
    its endpoint string, ``ssl:`` being HTTPS); a listener on every interface says so."""
    host, port = getattr(address, "host", None), getattr(address, "port", None)
    if not isinstance(host, str) or not isinstance(port, int):
        name = getattr(address, "name", None)
        return f"unix:{name.decode() if isinstance(name, bytes) else name}"
    scheme = "https" if description.split(":", 1)[0] == "ssl" else "http"
    shown = _EVERY_INTERFACE.get(host, host)
    url = f"{scheme}://[{shown}]:{port}" if ":" in shown else f"{scheme}://{shown}:{port}"
    return f"{url}{_EVERY}" if host in _EVERY_INTERFACE else url


def openai_url(url: str) -> str:
    """Where OpenAI-style clients and SDKs point for a facade at ``url`` (a :func:`client_url`):
    its ``/v1``."""
    return url.removesuffix(_EVERY) + "/v1"
