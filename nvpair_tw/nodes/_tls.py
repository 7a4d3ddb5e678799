# -*- test-case-name: tests.nodes.test_tls -*-
"""TLS toward HTTPS nodes: per-node trust from the nodes file, and a handshake that counts as the dial.

A node in the nodes file may say how its certificate is checked (:class:`NodeTLS`):

- ``ca_file = "path.pem"``: trust the CA certificate(s) (or the self-signed certificate) in that file
  for this node only; the URL's host name (or IP address) is still verified;
- ``fingerprint = "sha256:AB:CD:..."``: pin the leaf certificate's SHA-256; no chain or name check;
- ``insecure = true``: no verification at all (an explicit opt-in, logged at load).

Any other HTTPS node gets Twisted's :class:`BrowserLikePolicyForHTTPS` (the system trust store).

:class:`NodeTrustPolicy` is the one ``IPolicyForHTTPS`` of a process: it finds a URL's settings among
the nodes in force *per connection*, so a reloaded nodes file applies to the next connection.
:func:`tls_endpoint` wraps a dialling endpoint in TLS and fires its ``connect`` only once the handshake
has completed (bounded by the connect timeout): dial and TLS time never count toward the
response-header deadline (docs/behaviour.md §6.3), and every handshake failure — a certificate the node's trust
rejects, a pin mismatch, a plain-HTTP server on an https URL — is a :class:`TLSHandshakeFailed`, a
``ConnectError``: a fast failure that moves on to the next node and never cools it.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol as TypingProtocol
from urllib.parse import urlsplit

from attrs import field, frozen
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from OpenSSL import SSL
from OpenSSL.crypto import X509
from service_identity import VerificationError
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import wrapClientTLS
from twisted.internet.error import ConnectError, ConnectionDone, ConnectionLost
from twisted.internet.interfaces import (
    IAddress,
    IDelayedCall,
    IHandshakeListener,
    IOpenSSLClientConnectionCreator,
    IProtocol,
    IProtocolFactory,
    IReactorTime,
    IStreamClientEndpoint,
)
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.internet.ssl import (
    Certificate,
    CertificateOptions,
    optionsForClientTLS,
    trustRootFromCertificates,
)
from twisted.protocols.tls import TLSMemoryBIOProtocol
from twisted.python.failure import Failure
from twisted.web.client import BrowserLikePolicyForHTTPS
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface import implementer

from nvpair_tw.core import abort

__all__ = [
    "TLS_KEYS",
    "FingerprintMismatch",
    "NodeTLS",
    "NodeTrustPolicy",
    "TLSHandshakeFailed",
    "format_fingerprint",
    "https_address",
    "load_ca_file",
    "parse_fingerprint",
    "parse_node_tls",
    "tls_endpoint",
]

TLS_KEYS = frozenset({"ca_file", "fingerprint", "insecure"})
"""The nodes-file fields of one node that say how its certificate is checked."""

MAX_CA_FILE_BYTES = 1 << 20


@frozen
class NodeTLS:
    """How one HTTPS node's certificate is checked; exactly one way is set.

    ``ca_certs`` are the DER certificates read from ``ca_file`` at load (a changed CA file is read
    again when the nodes file is reloaded); ``fingerprint`` is a 32-byte SHA-256 digest.
    """

    ca_file: str | None = None
    ca_certs: tuple[bytes, ...] = field(default=(), repr=False)
    fingerprint: bytes | None = None
    insecure: bool = False

    def describe(self) -> str:
        """A short label for logs and status (never a secret: these are public certificates)."""
        if self.insecure:
            return "insecure (no verification)"
        if self.fingerprint is not None:
            return f"pinned {format_fingerprint(self.fingerprint)}"
        return f"ca_file {self.ca_file}"


class FingerprintMismatch(Exception):
    """The node's certificate is not the pinned one."""


class TLSHandshakeFailed(ConnectError):
    """The TLS handshake with a node failed or timed out (a fast failure: never a stall)."""

    __doc__ = MESSAGE = "TLS handshake failed"


_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


def parse_fingerprint(text: str) -> bytes:
    """``sha256:AB:CD:…`` (64 hex digits, colons optional, any case) → the 32-byte digest."""
    algorithm, sep, digits = text.strip().partition(":")
    if not sep or algorithm.lower() != "sha256":
        raise ValueError('must start with "sha256:" followed by the SHA-256 of the certificate')
    digits = digits.replace(":", "")
    if not _HEX64.fullmatch(digits):
        raise ValueError("must be sha256: and 64 hexadecimal digits (colons between pairs allowed)")
    return bytes.fromhex(digits)


def format_fingerprint(digest: bytes) -> str:
    """``sha256:AB:CD:…``, as ``openssl x509 -fingerprint -sha256`` prints it."""
    return "sha256:" + ":".join(f"{byte:02X}" for byte in digest)


def load_ca_file(path: str) -> tuple[bytes, ...]:
    """Read every PEM certificate of a CA file (DER each); :class:`ValueError` says why not."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_CA_FILE_BYTES + 1)
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror}") from None
    if len(data) > MAX_CA_FILE_BYTES:
        raise ValueError(f"{path} is larger than {MAX_CA_FILE_BYTES} bytes")
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise ValueError(f"{path} holds no valid PEM certificate") from None
    return tuple(c.public_bytes(Encoding.DER) for c in certificates)


def parse_node_tls(entry: Mapping[str, object], base_dir: str) -> NodeTLS | None:
    """The TLS settings of one nodes-file entry (``None``: the system trust store).

    A relative ``ca_file`` is relative to ``base_dir`` (the nodes file's directory). Raises
    :class:`ValueError` with ``"field: why"`` for a bad value or a contradictory combination.
    """
    ca_file = entry.get("ca_file")
    fingerprint = entry.get("fingerprint")
    insecure = entry.get("insecure", False)
    if not isinstance(insecure, bool):
        raise ValueError("insecure: must be true or false")
    if ca_file is not None and (not isinstance(ca_file, str) or not ca_file.strip()):
        raise ValueError("ca_file: must be a non-empty path string")
    if fingerprint is not None and not isinstance(fingerprint, str):
        raise ValueError('fingerprint: must be a string such as "sha256:AB:CD:..."')
    chosen = [
        name
        for name, on in (("ca_file", ca_file), ("fingerprint", fingerprint), ("insecure", insecure))
        if on
    ]
    if len(chosen) > 1:
        raise ValueError(
            f"{chosen[0]} and {chosen[1]} cannot be combined (choose one of ca_file, fingerprint,"
            " insecure)"
        )
    if isinstance(ca_file, str):
        path = os.path.join(base_dir, os.path.expanduser(ca_file))
        try:
            certificates = load_ca_file(path)
        except ValueError as error:
            raise ValueError(f"ca_file: {error}") from None
        return NodeTLS(ca_file=path, ca_certs=certificates)
    if isinstance(fingerprint, str):
        try:
            return NodeTLS(fingerprint=parse_fingerprint(fingerprint))
        except ValueError as error:
            raise ValueError(f"fingerprint: {error}") from None
    if insecure:
        return NodeTLS(insecure=True)
    return None


def https_address(url: str) -> tuple[str, int] | None:
    """``(host, port)`` of an https URL (host lower-case, without IPv6 brackets); else ``None``."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme.lower() != "https" or not parts.hostname:
        return None
    return (parts.hostname.lower(), 443 if port is None else port)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class _TLSNode(TypingProtocol):
    """What the policy reads of a node (``nodes.Node`` has both)."""

    @property
    def url(self) -> str: ...

    @property
    def tls(self) -> NodeTLS | None: ...


@implementer(IOpenSSLClientConnectionCreator)
class _UnverifiedCreator:
    """A pinned (leaf SHA-256) or insecure (nothing checked) client connection; SNI for names."""

    def __init__(self, host: str, fingerprint: bytes | None) -> None:
        self._options = CertificateOptions(verify=False)
        self._server_name = None if _is_ip(host) else host.encode("idna")
        self._fingerprint = fingerprint

    def clientConnectionForTLS(self, tlsProtocol: TLSMemoryBIOProtocol) -> SSL.Connection:
        connection = self._options.clientConnectionForTLS(tlsProtocol)
        if self._server_name is not None:
            connection.set_tlsext_host_name(self._server_name)
        pin = self._fingerprint
        if pin is None:
            connection.set_verify(SSL.VERIFY_NONE)
            return connection
        protocol: TLSMemoryBIOProtocol | None = tlsProtocol

        def verify(_c: SSL.Connection, cert: X509, _err: int, depth: int, _ok: int) -> bool:
            nonlocal protocol
            if depth != 0:
                return True  # only the leaf is pinned; its chain is not checked
            seen = hashlib.sha256(cert.to_cryptography().public_bytes(Encoding.DER)).digest()
            if seen == pin:
                return True
            if protocol is not None:
                reason = FingerprintMismatch(
                    f"certificate {format_fingerprint(seen)} is not the pinned"
                    f" {format_fingerprint(pin)}"
                )
                protocol.failVerification(Failure(reason))
                protocol = None
            return False

        connection.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT, verify)
        return connection


_Address = tuple[str, int]


@implementer(IPolicyForHTTPS)
class NodeTrustPolicy:
    """Per-node TLS trust: the settings of the node at a URL's host and port, else the system trust.

    ``nodes`` returns the nodes in force (every facade's merged view); it is read each time a TLS
    connection starts, so a reloaded nodes file applies to the next connection (pooled idle
    connections are reused for at most the pool's idle time).
    """

    def __init__(self, nodes: Callable[[], Iterable[_TLSNode]]) -> None:
        self._nodes = nodes
        self._default = BrowserLikePolicyForHTTPS()
        self._creators: dict[_Address, tuple[NodeTLS | None, IOpenSSLClientConnectionCreator]] = {}

    def settings_for(self, host: str, port: int) -> NodeTLS | None:
        """The TLS settings of the first node (by id) at ``host:port`` that has any."""
        address = (host.strip("[]").lower(), port)
        for node in self._nodes():
            if node.tls is not None and https_address(node.url) == address:
                return node.tls
        return None

    def creatorForNetloc(self, hostname: bytes, port: int) -> IOpenSSLClientConnectionCreator:
        return _PerConnection(self, hostname.decode("ascii").strip("[]").lower(), port)

    def creator(self, host: str, port: int) -> IOpenSSLClientConnectionCreator:
        """The connection creator for the settings in force now (built once per settings)."""
        settings = self.settings_for(host, port)
        cached = self._creators.get((host, port))
        if cached is not None and cached[0] == settings:
            return cached[1]
        made: IOpenSSLClientConnectionCreator
        if settings is None:
            made = self._default.creatorForNetloc(host.encode("ascii"), port)
        elif settings.ca_certs:
            roots = [Certificate.loadPEM(_pem(der)) for der in settings.ca_certs]
            made = optionsForClientTLS(host, trustRoot=trustRootFromCertificates(roots))
        else:
            made = _UnverifiedCreator(host, settings.fingerprint)
        self._creators[(host, port)] = (settings, made)
        return made


def _pem(der: bytes) -> bytes:
    return x509.load_der_x509_certificate(der).public_bytes(Encoding.PEM)


@implementer(IOpenSSLClientConnectionCreator)
class _PerConnection:
    """Looks the node's settings up when each connection starts (endpoints are cached)."""

    def __init__(self, policy: NodeTrustPolicy, host: str, port: int) -> None:
        self._policy = policy
        self._host = host
        self._port = port

    def clientConnectionForTLS(self, tlsProtocol: TLSMemoryBIOProtocol) -> SSL.Connection:
        creator = self._policy.creator(self._host, self._port)
        connection: SSL.Connection = creator.clientConnectionForTLS(tlsProtocol)
        return connection


def tls_endpoint(
    clock: IReactorTime,
    creator: IOpenSSLClientConnectionCreator,
    endpoint: IStreamClientEndpoint,
    timeout: float,
) -> IStreamClientEndpoint:
    """TLS over ``endpoint``; ``connect`` fires once the handshake is done (within ``timeout`` s).

    A handshake that fails or takes longer fails ``connect`` with :class:`TLSHandshakeFailed`, so
    the HTTP request is written only over an established TLS session.
    """
    return _HandshakeFirst(clock, wrapClientTLS(creator, endpoint), timeout)


@implementer(IStreamClientEndpoint)
class _HandshakeFirst:
    def __init__(self, clock: IReactorTime, endpoint: IStreamClientEndpoint, timeout: float):
        self._clock = clock
        self._endpoint = endpoint
        self._timeout = timeout

    def connect(self, protocolFactory: IProtocolFactory) -> Deferred[IProtocol]:
        gates = _GateFactory(protocolFactory, self._clock, self._timeout)
        connecting: Deferred[_HandshakeGate] = self._endpoint.connect(gates)  # type: ignore[assignment]
        return connecting.addCallback(lambda gate: gate.ready)  # type: ignore[no-any-return]


class _GateFactory(Factory):
    """Builds one :class:`_HandshakeGate` per connection; the application factory comes later."""

    def __init__(self, application: IProtocolFactory, clock: IReactorTime, timeout: float):
        self._application = application
        self._clock = clock
        self._timeout = timeout

    def buildProtocol(self, addr: IAddress | None) -> _HandshakeGate:
        return _HandshakeGate(self._application, addr, self._clock, self._timeout)

    def logPrefix(self) -> str:
        prefix = getattr(self._application, "logPrefix", None)
        return prefix() if callable(prefix) else type(self._application).__name__


@implementer(IHandshakeListener)
class _HandshakeGate(Protocol):
    """Sits on the TLS layer; connects the application protocol only after the handshake."""

    def __init__(
        self,
        application: IProtocolFactory,
        addr: IAddress | None,
        clock: IReactorTime,
        timeout: float,
    ) -> None:
        self.ready: Deferred[IProtocol] = Deferred(self._cancel)
        self._application = application
        self._addr = addr
        self._clock = clock
        self._timeout = timeout
        self._timer: IDelayedCall | None = None
        self._connected: IProtocol | None = None
        self._why: str | None = None

    def connectionMade(self) -> None:
        self._timer = self._clock.callLater(self._timeout, self._expire)

    def _disarm(self) -> None:
        if self._timer is not None:
            if self._timer.active():
                self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        self._why = f"no TLS handshake within {self._timeout:g}s"
        abort(self.transport)

    def _cancel(self, _: Deferred[IProtocol]) -> None:
        self._disarm()
        self._why = "cancelled"
        abort(self.transport)

    def handshakeCompleted(self) -> None:
        self._disarm()
        if self.ready.called or self._why is not None:
            return
        connected = self._application.buildProtocol(self._addr)  # type: ignore[arg-type]
        if connected is None or self.transport is None:
            self._why = "the connection was refused by its own factory"
            abort(self.transport)
            return
        self._connected = connected
        connected.makeConnection(self.transport)
        self.ready.callback(connected)

    def dataReceived(self, data: bytes) -> None:
        if self._connected is not None:
            self._connected.dataReceived(data)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._disarm()
        if self._connected is not None:
            self._connected.connectionLost(reason)
        elif not self.ready.called:
            why = self._why or _handshake_error(reason)
            self.ready.errback(Failure(TLSHandshakeFailed(string=why)))


def _handshake_error(reason: Failure) -> str:
    """A short reason for a failed handshake (OpenSSL's reason strings; never payload bytes)."""
    value = reason.value
    if isinstance(value, FingerprintMismatch):
        return str(value)
    if isinstance(value, VerificationError):
        return "the certificate does not match the node's host name"
    if isinstance(value, SSL.Error):
        reasons = [
            str(item[2])
            for item in (value.args[0] if value.args and isinstance(value.args[0], list) else [])
            if isinstance(item, tuple) and len(item) == 3 and item[2]
        ]
        return ", ".join(reasons) or "TLS error"
    if isinstance(value, ConnectionDone | ConnectionLost):
        return "the node closed the connection during the TLS handshake"
    return type(value).__name__
