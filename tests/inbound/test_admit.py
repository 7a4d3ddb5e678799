"""One decision at the end of the head (docs/behaviour.md §9, §14.2): ``IngressPolicy.admit`` and
``strip``, roles and tunnels on keys, the start-up warnings, ``--allow-host``, and the gate over
a real loopback socket."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.web.http_headers import Headers
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from nvpair_tw.inbound import (
    LOCAL,
    Caller,
    IngressPolicy,
    KeyRules,
    Rejection,
    Role,
    ingress_warnings,
    parse_ingress,
    read_keys_file,
)
from nvpair_tw.inbound._keys import DEFAULT_MAX_TUNNELS, ENVIRONMENT_RULES
from tests.helpers import send_raw

pytestmark = pytest.mark.timeout(30)

ALICE = "sk-alice-0123456789"
ROOT = "sk-root-0123456789"
ENV = "sk-env-5555555555"
LOOP = IPv4Address("TCP", "127.0.0.1", 5000)
LAN = IPv4Address("TCP", "192.0.2.10", 5000)
KEYS = f"""
[[key]]
name = "alice"
key = "{ALICE}"
models = ["llama3*"]

[[key]]
name = "root"
key = "{ROOT}"
role = "admin"
tunnels = true
max_tunnels = 9
"""


def write(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


def gate(tmp_path: Path | None = None, *, origins: tuple[str, ...] = (), **env: str) -> Any:
    keys = write(tmp_path / "keys.toml", KEYS) if tmp_path is not None else None
    config = parse_ingress(env, keys_file=keys, allow_hosts=["proxy.lan"])
    return IngressPolicy.from_config(config, Clock(), cors_origins=origins, hostname="studio")


def head(**values: str | list[str]) -> Headers:
    headers = Headers()
    for name, value in values.items():
        for v in [value] if isinstance(value, str) else value:
            headers.addRawHeader(name.replace("_", "-").encode(), v.encode())
    return headers


def code(verdict: Caller | Rejection) -> tuple[int, str]:
    assert isinstance(verdict, Rejection), verdict
    return verdict.status, verdict.code


# --- local ------------------------------------------------------------------------------------


def test_a_dns_rebinding_page_on_loopback_is_not_local() -> None:
    """Host evil.example from 127.0.0.1 is a remote caller: without keys 403 host-not-allowed."""
    assert gate().admit(LOOP, head(Host="127.0.0.1:11434")) is LOCAL
    refused = gate().admit(LOOP, head(Host="evil.example:11434"))
    assert code(refused) == (403, "host-not-allowed")
    assert code(gate().admit(LAN, head(Host="127.0.0.1"))) == (403, "loopback-only")


def test_a_pages_simple_post_on_loopback_is_not_local() -> None:
    """A foreign Origin makes a loopback caller remote; a --cors-origin one does not."""
    post = head(Host="localhost:11434", Origin="https://evil.example")
    assert code(gate().admit(LOOP, post)) == (403, "host-not-allowed")
    allowed = head(Host="localhost:11434", Origin="https://chat.example")
    assert gate(origins=("https://chat.example",)).admit(LOOP, allowed) is LOCAL
    assert gate().admit(LOOP, head(Host="localhost", Origin="http://localhost:5173")) is LOCAL


def test_a_foreign_loopback_caller_needs_a_key_when_keys_exist(tmp_path: Path) -> None:
    policy = gate(tmp_path, NVPAIR_PROXY_ALLOWED_CIDRS="10.0.0.0/8")
    rebound = head(Host="evil.example")
    assert code(policy.admit(LOOP, rebound)) == (401, "auth-required")
    wrong = head(Host="evil.example", X_Api_Key="sk-nope")
    assert code(policy.admit(LOOP, wrong)) == (401, "invalid-api-key")
    with_key = policy.admit(LOOP, head(Host="evil.example", Authorization=f"Bearer {ALICE}"))
    assert isinstance(with_key, Caller) and with_key.name == "alice"


def test_two_host_headers_are_400_from_anyone(tmp_path: Path) -> None:
    for policy in (gate(), gate(tmp_path)):
        for peer in (LOOP, LAN):
            two = head(Host=["localhost", "evil.example"], X_Api_Key=ALICE)
            assert code(policy.admit(peer, two)) == (400, "bad-request")


def test_allow_host_and_this_machines_name_are_local() -> None:
    for host in ("proxy.lan", "PROXY.lan:8080", "studio", "Studio:11434"):
        assert gate().admit(LOOP, head(Host=host)) is LOCAL


# --- keys -------------------------------------------------------------------------------------


def test_a_local_callers_own_credential_keeps_it_local(tmp_path: Path) -> None:
    """An SDK placeholder or a node's token is the caller's business: still local."""
    policy = gate(tmp_path)
    for headers in (head(Authorization="Bearer sk-placeholder"), head(X_Api_Key="lm-studio")):
        assert policy.admit(LOOP, headers) is LOCAL


def test_one_of_the_proxys_keys_gives_its_caller_from_any_source(tmp_path: Path) -> None:
    policy = gate(tmp_path, NVPAIR_PROXY_API_KEYS=ENV)
    for peer, host in ((LOOP, "localhost"), (LOOP, "evil.example"), (LAN, "proxy.example")):
        alice = policy.admit(peer, head(Host=host, X_Api_Key=ALICE))
        assert isinstance(alice, Caller) and alice.name == "alice" and alice.role is Role.USER
        env = policy.admit(peer, head(Host=host, Authorization=f"Bearer {ENV}"))
        assert isinstance(env, Caller) and env.rules == ENVIRONMENT_RULES


def test_x_api_key_is_read_before_authorization(tmp_path: Path) -> None:
    policy = gate(tmp_path)
    both = head(X_Api_Key=ROOT, Authorization=f"Bearer {ALICE}")
    root = policy.admit(LAN, both)
    assert isinstance(root, Caller) and root.name == "root"
    empty = head(X_Api_Key="  ", Authorization=f"Bearer {ALICE}")
    alice = policy.admit(LAN, empty)
    assert isinstance(alice, Caller) and alice.name == "alice"
    local_placeholder = head(X_Api_Key="placeholder", Authorization=f"Bearer {ROOT}")
    assert policy.admit(LOOP, local_placeholder) is LOCAL


def test_the_probe_is_answered_only_to_an_admitted_caller(tmp_path: Path) -> None:
    policy = gate(tmp_path)
    probe = "X_NVPAIR_Engine_Identity_Probe"
    assert code(policy.admit(LOOP, head(**{probe: "1"}))) == (409, "proxy-facade")
    assert code(policy.admit(LOOP, head(Host="evil.example", **{probe: "1"}))) == (
        401,
        "auth-required",
    )


def test_the_proxys_keys_are_stripped_from_every_caller(tmp_path: Path) -> None:
    """Loopback included: the proxy's keys never reach a node; other values stay. (Several
    credentials are refused at the door, 400, but strip removes keys whatever it is given.)"""
    policy = gate(tmp_path, NVPAIR_PROXY_API_KEYS=ENV)
    headers = head(
        X_Api_Key=[ALICE, "node-token"],
        Authorization=[f"Bearer {ENV}", f"bearer  {ROOT} ", "Basic eA==", "Bearer node-token"],
    )
    refused = policy.admit(LOOP, headers)
    assert isinstance(refused, Rejection) and (refused.status, refused.code) == (400, "bad-request")
    policy.strip(headers)
    assert headers.getRawHeaders(b"x-api-key") == [b"node-token"]
    assert headers.getRawHeaders(b"authorization") == [b"Basic eA==", b"Bearer node-token"]
    only_ours = head(X_Api_Key=ROOT, Authorization=f"Bearer {ALICE}")
    policy.strip(only_ours)
    assert not only_ours.hasHeader(b"x-api-key") and not only_ours.hasHeader(b"authorization")
    untouched = head(X_Api_Key=ALICE)
    gate().strip(untouched)  # without keys nothing is the proxy's
    assert untouched.getRawHeaders(b"x-api-key") == [ALICE.encode()]


# --- roles --------------------------------------------------------------------------------------


def test_roles_tunnels_and_their_defaults(tmp_path: Path) -> None:
    alice, root = read_keys_file(write(tmp_path / "k", KEYS)).entries
    assert alice.rules.role is Role.USER and not alice.rules.tunnels
    assert alice.rules.max_tunnels == DEFAULT_MAX_TUNNELS == 4
    assert not alice.rules.may_tunnel
    assert root.rules == KeyRules(role=Role.ADMIN, tunnels=True, max_tunnels=9)
    assert root.rules.may_tunnel
    assert LOCAL.role is Role.ADMIN and LOCAL.rules.may_tunnel and LOCAL.rules.max_tunnels is None
    assert ENVIRONMENT_RULES.role is Role.ADMIN
    user_tunnels = KeyRules(tunnels=True)
    assert user_tunnels.may_tunnel and not KeyRules(tunnels=True, models=("a",)).may_tunnel
    with pytest.raises(TypeError):
        KeyRules(("a",))  # type: ignore[misc]


def test_start_up_warnings_count_user_keys_and_flag_key_names(tmp_path: Path) -> None:
    text = KEYS + '\n[[key]]\nname = "key-0001"\nkey = "sk-x-1"\ntunnels = true\nmodels = ["a"]\n'
    config = parse_ingress({}, keys_file=write(tmp_path / "k", text))
    warnings = ingress_warnings(config)
    assert any("key-0001" in w and "collide" in w for w in warnings)
    assert any("tunnels = true has no effect" in w for w in warnings)
    assert (
        '2 named keys have role user: model management and X-NVPair-Node: * need role = "admin"'
        in warnings[-1]
    )
    one = parse_ingress({}, keys_file=write(tmp_path / "one", KEYS))
    assert ingress_warnings(one) == (
        "1 named key has role user: model management and X-NVPair-Node: * need"
        ' role = "admin" (docs/upgrading.md)',
    )
    assert ingress_warnings(parse_ingress({"NVPAIR_PROXY_API_KEYS": ENV})) == ()
    assert all(ALICE not in w and ROOT not in w for w in warnings)


# --- the command line ---------------------------------------------------------------------------


def test_allow_host_reaches_the_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    from twisted.python.usage import UsageError

    from nvpair_tw.core import Settings
    from nvpair_tw.runtime import build_runtime
    from nvpair_tw.tap import Options

    for name in list(os.environ):
        if name.startswith("NVPAIR_"):
            monkeypatch.delenv(name)
    options = Options()
    options.parseOptions(
        ["--engine", "ollama", "--allow-host", "Proxy.LAN", "--allow-host", "box.lan"]
    )
    assert options.config.ingress.allow_hosts == ("box.lan", "proxy.lan")
    with pytest.raises(UsageError, match="--allow-host"):
        Options().parseOptions(["--engine", "ollama", "--allow-host", "proxy.lan:80"])
    settings = Settings(cors_origins=("https://chat.example",))
    runtime = build_runtime(Clock(), settings, ["ollama"], ingress=options.config.ingress)  # type: ignore[arg-type]
    policy = runtime.shared.ingress
    assert policy is not None
    assert policy.admit(LOOP, head(Host="proxy.lan", Origin="https://chat.example")) is LOCAL


# --- over a real loopback socket ----------------------------------------------------------------


class _Gate(Resource):
    isLeaf = True

    def __init__(self, policy: IngressPolicy) -> None:
        super().__init__()
        self._policy = policy

    def render(self, request: Request) -> bytes:  # type: ignore[override]
        verdict = self._policy.admit(request.getClientAddress(), request.requestHeaders)
        if isinstance(verdict, Rejection):
            request.setResponseCode(verdict.status)
            return verdict.code.encode()
        return verdict.name.encode()


@pytest_twisted.ensureDeferred
async def test_over_loopback_the_host_decides_who_is_local(reactor: Any) -> None:
    """From a real 127.0.0.1 socket: Host 127.0.0.1 is local, a rebinding name is refused, and
    one of the proxy's keys names its caller whatever the Host."""
    policy = gate(None, NVPAIR_PROXY_API_KEYS=ENV)
    port = reactor.listenTCP(0, Site(_Gate(policy)), interface="127.0.0.1")
    number = port.getHost().port
    try:
        ok = await send_raw(reactor, number, b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        assert ok.startswith(b"HTTP/1.0 200") and ok.endswith(b"local")
        rebound = b"GET / HTTP/1.0\r\nHost: evil.example:%d\r\n\r\n" % number
        refused = await send_raw(reactor, number, rebound)
        assert refused.startswith(b"HTTP/1.0 401") and refused.endswith(b"auth-required")
        keyed = rebound[:-2] + b"X-Api-Key: " + ENV.encode() + b"\r\n\r\n"
        named = await send_raw(reactor, number, keyed)
        assert named.startswith(b"HTTP/1.0 200") and named.endswith(b"key-" + _hex8(ENV))
    finally:
        await port.stopListening()


def _hex8(key: str) -> bytes:
    import hashlib

    return hashlib.sha256(key.encode()).hexdigest()[:8].encode()


def test_the_hostname_is_this_machines_by_default() -> None:
    policy = IngressPolicy.from_config(parse_ingress({}), Clock())
    assert policy.admit(LOOP, head(Host=socket.gethostname())) is LOCAL
