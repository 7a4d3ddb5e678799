"""Tests for nvpair_tw.nodes._tls: per-node trust for HTTPS nodes, and IPv6 nodes, over real sockets.

Certificates are generated at test time (``cryptography``); TLS engines listen on 127.0.0.1 or ::1
and the proxy is driven through real sockets. Nodes with TLS settings come from a real nodes file
read by :func:`load_nodes_file`, so the configuration path is the one users run.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from attrs import define, field
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.error import ConnectError
from twisted.internet.interfaces import IListeningPort
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.ssl import CertificateOptions
from twisted.internet.task import Clock
from twisted.logger import ILogObserver, LogEvent, globalLogPublisher
from twisted.web.server import Site
from zope.interface import implementer

from nvpair_tw.core._engines import ENGINES
from nvpair_tw.core._resolved import Settings
from nvpair_tw.nodes._directory import Node, NodeDirectory, NodesFileError, load_nodes_file
from nvpair_tw.nodes._tls import (
    NodeTLS,
    NodeTrustPolicy,
    TLSHandshakeFailed,
    format_fingerprint,
    https_address,
    parse_fingerprint,
    parse_node_tls,
    tls_endpoint,
)
from nvpair_tw.testing import Clusters, ProxyCluster, SimulatedEngine


def chat_body(text: str = "hi") -> bytes:
    message = {"role": "user", "content": text}
    return json.dumps({"model": "llama3", "messages": [message], "stream": False}).encode()


CHAT = chat_body()
MODELS = ("llama3:latest",)


# -- certificates made at test time ------------------------------------------------------------


@define
class Cert:
    """A certificate and its key, as PEM."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def fingerprint(self) -> str:
        der = self.cert.public_bytes(serialization.Encoding.DER)
        return format_fingerprint(hashlib.sha256(der).digest())

    def server_options(self) -> CertificateOptions:
        # pyOpenSSL takes cryptography objects (its own PKey is deprecated); Twisted's hints lag
        return CertificateOptions(privateKey=self.key, certificate=self.cert)  # type: ignore[arg-type]


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_cert(
    common: str,
    names: Sequence[str] = (),
    *,
    issuer: Cert | None = None,
    ca: bool = False,
) -> Cert:
    """A certificate for ``names`` (DNS names or IP addresses), self-signed unless ``issuer``."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(issuer.cert.subject if issuer else _name(common))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    alternatives: list[x509.GeneralName] = []
    for name in names:
        try:
            alternatives.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alternatives.append(x509.DNSName(name))
    if alternatives:
        builder = builder.add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
    signer = issuer.key if issuer else key
    return Cert(builder.sign(signer, hashes.SHA256()), key)


@pytest.fixture(scope="module")
def ca() -> Cert:
    return make_cert("nvpair test CA", ca=True)


# -- the cluster: TLS and IPv6 engines behind a proxy ----------------------------------------


@define
class TLSCluster(ProxyCluster):
    """A proxy cluster whose engines may listen with TLS, on 127.0.0.1 or ::1."""

    ports: list[IListeningPort] = field(factory=list)

    async def serve(
        self, cert: Cert | None = None, host: str = "127.0.0.1", **engine: Any
    ) -> tuple[SimulatedEngine, str]:
        """Listen a simulated engine (TLS when ``cert``); the engine and its base URL."""
        simulated = SimulatedEngine(self.reactor, models=MODELS, **engine)
        port = self.listen(simulated.site(), cert, host)
        scheme = "https" if cert is not None else "http"
        netloc = f"[{host}]" if ":" in host else host
        return simulated, f"{scheme}://{netloc}:{port.getHost().port}"  # type: ignore[attr-defined]

    def listen(self, site: Site | Factory[Any], cert: Cert | None, host: str = "127.0.0.1") -> Any:
        if cert is not None:
            port = self.reactor.listenSSL(0, site, cert.server_options(), interface=host)
        else:
            port = self.reactor.listenTCP(0, site, interface=host)
        self.ports.append(port)
        return port

    def outcomes(self) -> list[list[tuple[str, str]]]:
        """Per recorded request, its attempts as (node, outcome)."""
        return [
            [(a["node_id"], a["outcome"]) for a in record["attempts"]]
            for record in self.named("proxy/request")
        ]

    async def stop(self) -> None:
        await super().stop()
        for port in self.ports:
            await maybeDeferred(port.stopListening)
        self.ports = []


@pytest.fixture
def cluster(clusters: Clusters) -> TLSCluster:
    return clusters(TLSCluster)


def nodes_file(tmp_path: Path, text: str, engine: str = "ollama") -> list[Node]:
    """Write a nodes file and load it as the proxy would."""
    path = tmp_path / "nodes.toml"
    path.write_text(text)
    return load_nodes_file(str(path), engine)


@implementer(ILogObserver)
class Recorder:
    """A log observer keeping every event."""

    def __init__(self) -> None:
        self.events: list[LogEvent] = []

    def __call__(self, event: LogEvent) -> None:
        self.events.append(event)


def served_by(response: Any) -> str:
    [node] = response.headers.getRawHeaders(b"x-nvpair-node")
    return str(node.decode())


async def chat(cluster: TLSCluster, text: str = "hi") -> tuple[int, bytes, str]:
    code, body, response = await cluster.post(chat_body(text))
    return code, body, served_by(response)


# -- nodes-file settings ------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "sha256:" + ":".join(["Ab"] * 32),
        "SHA256:" + "ab" * 32,
        "  sha256:" + "AB" * 32 + " ",
    ],
    ids=["colons", "bare", "padded"],
)
def test_fingerprint_accepts_openssl_and_bare_hex(text: str) -> None:
    assert parse_fingerprint(text) == bytes([0xAB] * 32)
    assert parse_fingerprint(format_fingerprint(bytes(range(32)))) == bytes(range(32))


@pytest.mark.parametrize(
    "text",
    ["AB:CD", "sha1:" + "ab" * 20, "sha256:" + "ab" * 31, "sha256:" + "zz" * 32, "sha256:"],
    ids=["no-algorithm", "sha1", "short", "not-hex", "empty"],
)
def test_malformed_fingerprint_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="sha256"):
        parse_fingerprint(text)


def test_node_tls_settings_and_relative_ca_file(tmp_path: Path, ca: Cert) -> None:
    (tmp_path / "ca.pem").write_bytes(ca.pem)
    pinned = parse_node_tls({"fingerprint": ca.fingerprint}, str(tmp_path))
    assert pinned == NodeTLS(fingerprint=parse_fingerprint(ca.fingerprint))
    trusted = parse_node_tls({"ca_file": "ca.pem"}, str(tmp_path))
    assert trusted is not None and trusted.ca_file == str(tmp_path / "ca.pem")
    assert trusted.ca_certs == (ca.cert.public_bytes(serialization.Encoding.DER),)
    assert parse_node_tls({"insecure": True}, str(tmp_path)) == NodeTLS(insecure=True)
    assert parse_node_tls({"insecure": False}, str(tmp_path)) is None
    assert parse_node_tls({}, str(tmp_path)) is None


@pytest.mark.parametrize(
    ("node", "error"),
    [
        ('ca_file = "missing.pem"', "ca_file: cannot read .*missing.pem: No such file"),
        ('ca_file = "junk.pem"', "ca_file: .*junk.pem holds no valid PEM certificate"),
        ('fingerprint = "AB:CD"', 'fingerprint: must start with "sha256:"'),
        ('fingerprint = "sha256:ABCD"', "fingerprint: must be sha256: and 64 hexadecimal"),
        ('insecure = "yes"', "insecure: must be true or false"),
        ('insecure = true\nca_file = "junk.pem"', "ca_file and insecure cannot be combined"),
        ('insecure = true\nfingerprint = "x"', "fingerprint and insecure cannot be combined"),
    ],
    ids=[
        "missing-ca",
        "junk-ca",
        "no-algorithm",
        "short-pin",
        "insecure-string",
        "ca+insecure",
        "pin+insecure",
    ],
)
def test_bad_tls_settings_are_a_clear_nodes_file_error(
    tmp_path: Path, node: str, error: str
) -> None:
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    with pytest.raises(NodesFileError, match=rf"node 1 \(id 'gpu1'\): {error}"):
        nodes_file(tmp_path, f'[[node]]\nid = "gpu1"\nurl = "https://10.0.0.5:8443"\n{node}\n')


def test_tls_settings_need_an_https_url(tmp_path: Path) -> None:
    with pytest.raises(
        NodesFileError, match="insecure: applies to https URLs, and this node has none"
    ):
        nodes_file(
            tmp_path, '[[node]]\nid = "gpu1"\nurl = "http://10.0.0.5:11434"\ninsecure = true\n'
        )


def test_one_address_cannot_have_two_trusts(tmp_path: Path) -> None:
    text = (
        '[[node]]\nid = "a"\nurl = "https://gpu.lan:8443"\ninsecure = true\n'
        '[[node]]\nid = "b"\n[node.url]\nlmstudio = "https://GPU.lan:8443/"\n'
    )
    with pytest.raises(NodesFileError, match=r"node 2 .*https://gpu\.lan:8443 is also node 'a'"):
        nodes_file(tmp_path, text)


def test_file_nodes_carry_their_tls_settings(tmp_path: Path, ca: Cert) -> None:
    (tmp_path / "ca.pem").write_bytes(ca.pem)
    text = (
        '[[node]]\nid = "a"\nurl = "https://a.lan:8443"\nca_file = "ca.pem"\n'
        '[[node]]\nid = "b"\nurl = "https://b.lan"\n'
        f'fingerprint = "{ca.fingerprint}"\n'
        '[[node]]\nid = "c"\nurl = "https://c.lan"\n'
    )
    a, b, c = nodes_file(tmp_path, text)
    assert a.tls is not None and a.tls.ca_file == str(tmp_path / "ca.pem")
    assert b.tls == NodeTLS(fingerprint=parse_fingerprint(ca.fingerprint))
    assert c.tls is None


def test_policy_finds_a_nodes_settings_by_host_and_port() -> None:
    pinned = NodeTLS(fingerprint=bytes(32))
    nodes = [
        Node("plain", "http://10.0.0.5:8443"),
        Node("v6", "https://[FD00::5]/", tls=NodeTLS(insecure=True)),
        Node("pin", "https://Gpu.Lan:8443", tls=pinned),
    ]
    policy = NodeTrustPolicy(lambda: nodes)
    assert policy.settings_for("gpu.lan", 8443) is pinned
    assert policy.settings_for("[fd00::5]", 443) == NodeTLS(insecure=True)
    assert policy.settings_for("10.0.0.5", 8443) is None
    assert policy.settings_for("gpu.lan", 443) is None
    assert https_address("http://x:1") is None
    assert https_address("https://[::1]") == ("::1", 443)


def test_insecure_node_is_warned_about_once_at_load(tmp_path: Path) -> None:
    path = tmp_path / "nodes.toml"
    path.write_text('[[node]]\nid = "lab"\nurl = "https://10.0.0.9:8443"\ninsecure = true\n')
    seen = Recorder()
    globalLogPublisher.addObserver(seen)
    try:
        directory = NodeDirectory(ENGINES["ollama"], Clock(), nodes_file=str(path))
        directory.start()
        assert directory.reload_file()
        directory.stop()
    finally:
        globalLogPublisher.removeObserver(seen)
    warnings = [e for e in seen.events if "verification is disabled" in e.get("log_format", "")]
    assert [(e["node"], e["url"]) for e in warnings] == [("lab", "https://10.0.0.9:8443")]
    assert directory.nodes()[0].tls == NodeTLS(insecure=True)


# -- the handshake is part of the dial ---------------------------------------------------------


class Silent(Protocol):
    """Reads the ClientHello and never answers (a TLS handshake that never completes)."""

    def dataReceived(self, data: bytes) -> None:
        hello: Deferred[bytes] = self.factory.hello  # type: ignore[attr-defined]
        if not hello.called:
            hello.callback(data)


@pytest_twisted.ensureDeferred
async def test_connect_waits_for_the_handshake_and_fails_fast_on_its_timeout(
    reactor: Any, cluster: TLSCluster
) -> None:
    """Connected over TCP is not connected: ``connect`` fires only after the handshake, and a
    silent server fails it with TLSHandshakeFailed (a ConnectError) at the connect timeout."""
    factory = Factory.forProtocol(Silent)
    factory.hello = Deferred()  # type: ignore[attr-defined]
    port = cluster.listen(factory, None).getHost().port
    clock = Clock()
    policy = NodeTrustPolicy(
        lambda: [Node("n", f"https://127.0.0.1:{port}", tls=NodeTLS(insecure=True))]
    )
    endpoint = tls_endpoint(
        clock,
        policy.creatorForNetloc(b"127.0.0.1", port),
        TCP4ClientEndpoint(reactor, "127.0.0.1", port, timeout=5),
        timeout=3.0,
    )
    outcome: list[Any] = []
    ended: Deferred[None] = Deferred()
    connecting = endpoint.connect(Factory.forProtocol(Protocol))
    connecting.addBoth(outcome.append).addBoth(ended.callback)
    assert (await factory.hello)[:1] == b"\x16"  # type: ignore[attr-defined]
    assert outcome == []  # connected over TCP, handshake pending: not connected yet
    clock.advance(2.9)
    assert outcome == []
    clock.advance(0.1)
    await ended.addTimeout(5, reactor)  # the abort is seen on the next reactor turn
    [failure] = outcome
    assert failure.check(TLSHandshakeFailed) and isinstance(failure.value, ConnectError)
    assert "no TLS handshake within 3s" in str(failure.value)
    assert not clock.getDelayedCalls()


# -- HTTPS nodes through the proxy -----------------------------------------------------------


@pytest.mark.parametrize("signed_by_ca", [True, False], ids=["ca-signed", "self-signed"])
@pytest_twisted.ensureDeferred
async def test_ca_file_node_answers_a_chat_and_its_inventory_is_polled(
    cluster: TLSCluster, tmp_path: Path, ca: Cert, signed_by_ca: bool
) -> None:
    """ca_file trusts a private CA (or the node's own self-signed certificate); the inference and
    the inventory poll both go over the verified connection."""
    cert = make_cert("gpu", ["127.0.0.1"], issuer=ca if signed_by_ca else None)
    (tmp_path / "trust.pem").write_bytes(ca.pem if signed_by_ca else cert.pem)
    engine, url = await cluster.serve(cert)
    nodes = nodes_file(tmp_path, f'[[node]]\nid = "gpu"\nurl = "{url}"\nca_file = "trust.pem"\n')
    await cluster.start_proxy(nodes)
    await cluster.facade.inventory.poll_now()
    assert cluster.facade.inventory.models("gpu") == frozenset(MODELS)
    code, body, node = await chat(cluster)
    assert (code, node) == (200, "gpu")
    # a non-streaming chat is assembled from the engine's three streamed pieces (§6.5)
    assert json.loads(body)["message"]["content"] == "hello0hello1hello2"
    assert engine.inference_count == 1


@pytest_twisted.ensureDeferred
async def test_ca_file_still_verifies_the_host_name(
    cluster: TLSCluster, tmp_path: Path, ca: Cert
) -> None:
    """A certificate from the trusted CA but for another host is refused: the next node answers,
    and the refused node is not cooled (a fast failure)."""
    cert = make_cert("elsewhere", ["elsewhere.invalid"], issuer=ca)
    (tmp_path / "ca.pem").write_bytes(ca.pem)
    wrong, url = await cluster.serve(cert)
    good, good_url = await cluster.serve()
    nodes = nodes_file(
        tmp_path,
        f'[[node]]\nid = "a-named-wrong"\nurl = "{url}"\nca_file = "ca.pem"\nmodels = ["llama3"]\n'
        f'[[node]]\nid = "b-good"\nurl = "{good_url}"\nmodels = ["llama3"]\n',
    )
    await cluster.start_proxy(nodes)
    code, _body, node = await chat(cluster)
    assert (code, node) == (200, "b-good")
    assert cluster.outcomes() == [[("a-named-wrong", "connect-error"), ("b-good", "committed")]]
    assert wrong.received == [] and good.inference_count == 1
    assert cluster.named("node/cooldown") == [] and cluster.facade.stalls.cooling() == frozenset()


@pytest_twisted.ensureDeferred
async def test_fingerprint_pinned_node_answers_whatever_its_name(
    cluster: TLSCluster, tmp_path: Path
) -> None:
    """A pinned self-signed certificate naming another host is accepted (the pin replaces the
    chain and the name); the inventory poll uses the same pin."""
    cert = make_cert("box", ["box.invalid"])
    engine, url = await cluster.serve(cert)
    nodes = nodes_file(
        tmp_path, f'[[node]]\nid = "box"\nurl = "{url}"\nfingerprint = "{cert.fingerprint}"\n'
    )
    await cluster.start_proxy(nodes)
    await cluster.facade.inventory.poll_now()
    assert cluster.facade.inventory.models("box") == frozenset(MODELS)
    code, _body, node = await chat(cluster)
    assert (code, node) == (200, "box")
    assert engine.inference_count == 1


@pytest_twisted.ensureDeferred
async def test_wrong_fingerprint_fails_over_without_cooldown(
    cluster: TLSCluster, tmp_path: Path
) -> None:
    """A certificate that is not the pinned one: no request byte reaches that node, the next node
    answers, and the mismatch is a connect error that cools nothing."""
    cert = make_cert("box", ["127.0.0.1"])
    other = make_cert("other", ["127.0.0.1"])
    wrong, url = await cluster.serve(cert)
    good, good_url = await cluster.serve()
    nodes = nodes_file(
        tmp_path,
        f'[[node]]\nid = "a-pinned"\nurl = "{url}"\nfingerprint = "{other.fingerprint}"\n'
        'models = ["llama3"]\n'
        f'[[node]]\nid = "b-good"\nurl = "{good_url}"\nmodels = ["llama3"]\n',
    )
    await cluster.start_proxy(nodes)
    for text in ("first conversation", "second conversation"):  # no prefix affinity between
        code, _body, node = await chat(cluster, text)
        assert (code, node) == (200, "b-good")
    assert cluster.outcomes() == [[("a-pinned", "connect-error"), ("b-good", "committed")]] * 2
    assert wrong.received == [] and good.inference_count == 2
    assert cluster.named("node/cooldown") == [] and cluster.facade.stalls.cooling() == frozenset()


@pytest_twisted.ensureDeferred
async def test_wrong_fingerprint_on_the_last_node_is_a_502_naming_the_pin(
    cluster: TLSCluster, tmp_path: Path
) -> None:
    cert = make_cert("box", ["127.0.0.1"])
    other = make_cert("other", ["127.0.0.1"])
    _engine, url = await cluster.serve(cert)
    nodes = nodes_file(
        tmp_path,
        f'[[node]]\nid = "pinned"\nurl = "{url}"\nfingerprint = "{other.fingerprint}"\n'
        'models = ["llama3"]\n',
    )
    await cluster.start_proxy(nodes)
    code, body, _response = await cluster.post(CHAT)
    assert code == 502
    error = json.loads(body)["error"]
    assert "TLSHandshakeFailed" in error and f"is not the pinned {other.fingerprint}" in error


@pytest_twisted.ensureDeferred
async def test_insecure_node_answers(cluster: TLSCluster, tmp_path: Path) -> None:
    cert = make_cert("box", ["box.invalid"])
    engine, url = await cluster.serve(cert)
    nodes = nodes_file(tmp_path, f'[[node]]\nid = "lab"\nurl = "{url}"\ninsecure = true\n')
    await cluster.start_proxy(nodes)
    await cluster.facade.inventory.poll_now()
    assert cluster.facade.inventory.models("lab") == frozenset(MODELS)
    code, _body, node = await chat(cluster)
    assert (code, node) == (200, "lab")
    assert engine.inference_count == 1


class PlainHTTP(Protocol):
    """A plain HTTP server as Go's net/http (Ollama) meets a TLS ClientHello: a 400, then close."""

    def dataReceived(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n")
        self.transport.loseConnection()


@pytest.mark.parametrize("server", ["self-signed", "plain-http"])
@pytest_twisted.ensureDeferred
async def test_untrusted_or_plain_https_node_fails_over_without_cooldown(
    cluster: TLSCluster, tmp_path: Path, server: str
) -> None:
    """Without settings a node gets the system trust store, which refuses a self-signed
    certificate; a plain HTTP server behind an https URL fails the handshake. Both fail over to
    the next node at once and cool nothing."""
    if server == "self-signed":
        bad, url = await cluster.serve(make_cert("box", ["127.0.0.1"]))
        assert bad.received == []
    else:
        url = f"https://127.0.0.1:{cluster.listen(Factory.forProtocol(PlainHTTP), None).getHost().port}"
    good, good_url = await cluster.serve()
    nodes = nodes_file(
        tmp_path,
        f'[[node]]\nid = "a-bad"\nurl = "{url}"\nmodels = ["llama3"]\n'
        f'[[node]]\nid = "b-good"\nurl = "{good_url}"\nmodels = ["llama3"]\n',
    )
    await cluster.start_proxy(nodes)
    code, _body, node = await chat(cluster)
    assert (code, node) == (200, "b-good")
    assert cluster.outcomes() == [[("a-bad", "connect-error"), ("b-good", "committed")]]
    assert good.inference_count == 1
    assert cluster.named("node/cooldown") == [] and cluster.facade.stalls.cooling() == frozenset()
    [record] = cluster.named("proxy/request")
    assert record["duration_ms"] < 5000  # not the 10 s connect timeout: the refusal is seen at once


@pytest_twisted.ensureDeferred
async def test_handshake_time_counts_toward_the_connect_timeout_not_the_header_deadline(
    cluster: TLSCluster, tmp_path: Path
) -> None:
    """A node that accepts TCP and never completes the handshake is a connect error after the
    connect timeout, not a stall after the header deadline: no cooldown, the next node answers."""
    silent = Factory.forProtocol(Silent)
    silent.hello = Deferred()  # type: ignore[attr-defined]
    url = f"https://127.0.0.1:{cluster.listen(silent, None).getHost().port}"
    good, good_url = await cluster.serve()
    nodes = nodes_file(
        tmp_path,
        f'[[node]]\nid = "a-silent"\nurl = "{url}"\ninsecure = true\nmodels = ["llama3"]\n'
        f'[[node]]\nid = "b-good"\nurl = "{good_url}"\nmodels = ["llama3"]\n',
    )
    await cluster.start_proxy(nodes, Settings(connect_timeout=0.2, response_header_timeout=2.0))
    answered = Deferred.fromCoroutine(chat(cluster)).addTimeout(10, cluster.reactor)
    code, _body, node = await answered
    assert (code, node) == (200, "b-good")
    assert cluster.outcomes() == [[("a-silent", "connect-error"), ("b-good", "committed")]]
    assert cluster.named("node/cooldown") == [] and cluster.facade.stalls.cooling() == frozenset()
    assert good.inference_count == 1


# -- IPv6 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https-ca-file"])
@pytest_twisted.ensureDeferred
async def test_ipv6_loopback_node_answers_and_its_inventory_is_polled(
    cluster: TLSCluster, tmp_path: Path, ca: Cert, tls: bool
) -> None:
    """``http://[::1]:PORT`` (and ``https://[::1]:PORT`` verified against an IP SAN of ::1) serves
    inference and answers the inventory poll."""
    cert = make_cert("v6", ["::1"], issuer=ca) if tls else None
    (tmp_path / "ca.pem").write_bytes(ca.pem)
    engine, url = await cluster.serve(cert, host="::1")
    assert url.startswith(("http://[::1]:", "https://[::1]:"))
    trust = 'ca_file = "ca.pem"\n' if tls else ""
    nodes = nodes_file(tmp_path, f'[[node]]\nid = "v6"\nurl = "{url}"\n{trust}')
    await cluster.start_proxy(nodes)
    await cluster.facade.inventory.poll_now()
    assert cluster.facade.inventory.models("v6") == frozenset(MODELS)
    polled = [r.path for r in engine.received]
    assert sorted(polled) == [b"/api/ps", b"/api/tags"]  # the model list and residency
    code, _body, node = await chat(cluster)
    assert (code, node) == (200, "v6")
    assert engine.inference_count == 1
