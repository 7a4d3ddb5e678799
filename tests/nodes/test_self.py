"""Tests for nvpair_tw.nodes._self and nvpair_tw.nodes._guard: the self-loop check of
docs/behaviour.md §14.3 (a node that is this very process is never a candidate)."""

from __future__ import annotations

from typing import Any

import pytest
from attrs import define, field
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.interfaces import IHostnameResolver, IResolutionReceiver
from zope.interface import implementer

from nvpair_tw.nodes._guard import SelfGuard
from nvpair_tw.nodes._self import is_self, name_to_resolve, port_of

LOOPBACK_11435 = frozenset({("127.0.0.1", 11435)})
EVERYWHERE_11435 = frozenset({("0.0.0.0", 11435), ("::", 9180)})


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:11435",
        "http://127.0.0.2:11435/api",
        "https://localhost:11435",
        "http://LOCALHOST.:11435",
        "http://proxy.localhost:11435",
        "http://0.0.0.0:11435",
        "http://[::1]:11435",
        "http://[::]:11435",
        "http://[::ffff:127.0.0.1]:11435",
        "http://user:pw@127.0.0.1:11435",
    ],
)
def test_loopback_and_unspecified_addresses_on_a_listening_port_are_self(url: str) -> None:
    """Any loopback or unspecified literal, and localhost, on a port this process listens on."""
    assert is_self(url, LOOPBACK_11435)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:11434",  # another port: the engine beside the proxy
        "http://10.0.0.5:11435",  # another machine's proxy on the same port
        "http://gpu1.lan:11435",  # a name not (yet) resolved
        "http://127.0.0.1",  # port 80
        "ftp://127.0.0.1:11435",
        "not a url",
        "http://127.0.0.1:99999",
    ],
)
def test_other_ports_other_hosts_and_non_urls_are_not_self(url: str) -> None:
    """Only a listening port counts; a name counts only through its resolved addresses."""
    assert not is_self(url, LOOPBACK_11435)


def test_the_default_port_of_the_scheme_is_used() -> None:
    """``http://localhost`` is port 80 and ``https://localhost`` port 443."""
    listening = frozenset({("0.0.0.0", 80), ("0.0.0.0", 443)})
    assert is_self("http://localhost", listening) and is_self("https://localhost", listening)
    assert port_of("https://x") == 443 and port_of("http://x:8") == 8 and port_of("x") is None


def test_a_name_is_self_through_the_addresses_it_resolved_to() -> None:
    """A name resolving to loopback, or to the very interface a listener is bound to, is self."""
    bound = frozenset({("10.0.0.5", 11435)})
    assert is_self("http://me.lan:11435", bound, ["10.0.0.5"])
    assert is_self("http://me.lan:11435", bound, ["192.0.2.1", "127.0.1.1"])
    assert not is_self("http://me.lan:11435", bound, ["10.0.0.6"])
    assert is_self("http://10.0.0.5:11435", bound)


def test_only_names_are_resolved() -> None:
    """IP literals and localhost are judged without a resolver; names need one."""
    assert name_to_resolve("http://gpu1.lan:1") == "gpu1.lan"
    assert name_to_resolve("http://127.1:11435") == "127.1"  # not a literal: getaddrinfo's
    for url in ("http://10.0.0.5:1", "http://[::1]:1", "http://localhost:1", "http://a.localhost"):
        assert name_to_resolve(url) is None
    assert name_to_resolve("nope") is None


@implementer(IHostnameResolver)
@define
class FakeResolver:
    """Records each resolution; the test answers it with :meth:`answer`."""

    asked: list[tuple[IResolutionReceiver, str, int]] = field(factory=list)

    def resolveHostName(
        self,
        resolutionReceiver: IResolutionReceiver,
        hostName: str,
        portNumber: int = 0,
        addressTypes: Any = None,
        transportSemantics: str = "TCP",
    ) -> Any:
        self.asked.append((resolutionReceiver, hostName, portNumber))
        resolutionReceiver.resolutionBegan(None)  # type: ignore[arg-type]
        return None

    def answer(self, *hosts: str) -> None:
        receiver, _, port = self.asked.pop(0)
        for host in hosts:
            receiver.addressResolved(
                IPv6Address("TCP", host, port) if ":" in host else IPv4Address("TCP", host, port)
            )
        receiver.resolutionComplete()


@define
class ResolvingReactor:
    """Just what :class:`SelfGuard` asks of a reactor: its name resolver."""

    nameResolver: FakeResolver = field(factory=FakeResolver)


@define
class FakePort:
    """An ``IListeningPort`` reduced to ``getHost``."""

    address: Any

    def getHost(self) -> Any:
        return self.address


def _guard() -> tuple[SelfGuard, FakeResolver]:
    reactor = ResolvingReactor()
    guard = SelfGuard(reactor)  # type: ignore[arg-type]
    for address in (
        IPv4Address("TCP", "127.0.0.1", 11435),
        IPv6Address("TCP", "::", 9180),
        UNIXAddress(b"/run/nvpair/ctl.sock"),
    ):
        port: Any = FakePort(address)
        assert guard.listened(port) is port
    return guard, reactor.nameResolver


def test_the_guard_learns_tcp_ports_and_ignores_unix_sockets() -> None:
    """Each listening port's address is recorded; a unix socket has no TCP port to record."""
    guard, _ = _guard()
    assert guard.listening == frozenset({("127.0.0.1", 11435), ("::", 9180)})
    assert guard.excludes("http://localhost:9180") and not guard.excludes("http://localhost:1")


def test_the_guard_resolves_names_only_on_its_own_ports() -> None:
    """A name on a port this process does not listen on is never resolved: it cannot be self."""
    guard, resolver = _guard()
    assert not guard.must_resolve("http://gpu1.lan:11434")
    results: list[bool] = []
    guard.refresh("http://gpu1.lan:11434").addCallback(results.append)
    guard.refresh("http://127.0.0.1:11435").addCallback(results.append)
    assert results == [False, True] and resolver.asked == []


def test_a_name_resolving_to_this_process_is_excluded_after_refresh() -> None:
    """The verdict waits for the reactor's resolver; afterwards ``excludes`` knows the name, and
    a later refresh that resolves elsewhere clears it."""
    guard, resolver = _guard()
    url = "http://me.example:11435"
    assert guard.must_resolve(url) and not guard.excludes(url)
    results: list[bool] = []
    guard.refresh(url).addCallback(results.append)
    assert results == [] and resolver.asked[0][1:] == ("me.example", 11435)
    resolver.answer("::ffff:127.0.0.1")
    assert results == [True] and guard.excludes(url)
    guard.refresh(url).addCallback(results.append)
    resolver.answer("192.0.2.7")
    assert results == [True, False] and not guard.excludes(url)


def test_a_name_that_does_not_resolve_is_not_self() -> None:
    """No address at all (NXDOMAIN) is not this process."""
    guard, resolver = _guard()
    results: list[bool] = []
    guard.refresh("http://gone.example:9180").addCallback(results.append)
    resolver.answer()
    assert results == [False]
