"""Tests for nvpair_tw.inbound._ingress: loopback default, API keys, CIDRs, key-file rotation, probe."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from twisted.internet.address import IPv4Address, IPv6Address, UNIXAddress
from twisted.internet.interfaces import IAddress
from twisted.internet.task import Clock
from twisted.logger import LogEvent, formatEvent
from twisted.web.http_headers import Headers

from nvpair_tw.inbound._ingress import (
    IngressConfig,
    IngressConfigError,
    IngressPolicy,
    Rejection,
    is_loopback,
    parse_ingress,
)

KEY = "k-0123456789abcdef"
OTHER_KEY = "k-fedcba9876543210"
CANARY = "canary-7f3c2e19d4b84a6e"
LAN = IPv4Address("TCP", "192.0.2.10", 5000)
LOCAL = IPv4Address("TCP", "127.0.0.1", 5000)
CHALLENGE = b'Bearer realm="nvpair"'


def _headers(**values: str) -> Headers:
    headers = Headers()
    for name, value in values.items():
        headers.addRawHeader(name.replace("_", "-").encode(), value.encode())
    return headers


def _policy(clock: Clock | None = None, **environ: str) -> IngressPolicy:
    return IngressPolicy.from_config(parse_ingress(environ), clock or Clock())


def _key_file(path: Path, *lines: str, mode: int = 0o600) -> str:
    path.write_text("".join(line + "\n" for line in lines))
    path.chmod(mode)
    return str(path)


def _logged_text(events: list[LogEvent]) -> str:
    return "\n".join(formatEvent(e) + repr(e) for e in events)


# Loopback default


def test_loopback_caller_without_keys_is_allowed() -> None:
    """With nothing configured a loopback caller passes."""
    assert _policy().check(LOCAL, Headers()) is None


def test_non_loopback_caller_without_keys_gets_403_loopback_only() -> None:
    """With no keys configured any other host is refused with 403 loopback-only."""
    rejection = _policy().check(LAN, Headers())
    assert rejection is not None
    assert (rejection.status, rejection.code) == (403, "loopback-only")


def test_forwarding_headers_never_decide_the_source() -> None:
    """X-Forwarded-For and Forwarded are ignored: only the TCP peer counts."""
    policy = _policy()
    spoofed = _headers(X_Forwarded_For="127.0.0.1", Forwarded="for=127.0.0.1")
    assert policy.check(LAN, spoofed) == policy.check(LAN, Headers())
    assert policy.check(LAN, spoofed) is not None
    assert policy.check(LOCAL, _headers(X_Forwarded_For="192.0.2.99")) is None


@pytest.mark.parametrize(
    "peer",
    [
        IPv4Address("TCP", "127.0.0.1", 1),
        IPv4Address("TCP", "127.8.9.10", 1),
        IPv6Address("TCP", "::1", 1),
        IPv6Address("TCP", "::ffff:127.0.0.1", 1),
        UNIXAddress(b"/tmp/nvpair.sock"),
        UNIXAddress(None),
    ],
)
def test_local_peers_are_loopback(peer: IAddress) -> None:
    """127/8, ::1, IPv4-mapped 127.0.0.1 and UNIX-socket peers are local."""
    assert is_loopback(peer)


@pytest.mark.parametrize(
    "peer",
    [
        IPv4Address("TCP", "192.0.2.10", 1),
        IPv6Address("TCP", "::ffff:192.0.2.10", 1),
        IPv6Address("TCP", "2001:db8::1", 1),
        IPv4Address("TCP", "not-an-address", 1),
        IPv4Address("TCP", "", 1),
        IPv4Address("TCP", "localhost", 1),
    ],
)
def test_other_and_unparseable_peers_are_not_loopback(peer: IAddress) -> None:
    """Remote addresses and anything that does not parse as an IP are non-loopback."""
    assert not is_loopback(peer)
    assert _policy().check(peer, Headers()) == _policy().check(LAN, Headers())


# API keys


def test_keys_configured_reflects_the_environment(tmp_path: Path) -> None:
    """Keys from the variable or the file open the gate; an empty variable does not."""
    assert not _policy().keys_configured
    assert not _policy(NVPAIR_PROXY_API_KEYS="  ").keys_configured
    assert _policy(NVPAIR_PROXY_API_KEYS=KEY).keys_configured
    path = _key_file(tmp_path / "keys", KEY)
    assert _policy(NVPAIR_PROXY_API_KEYS_FILE=path).keys_configured


def test_missing_key_gets_401_with_bearer_challenge() -> None:
    """A non-loopback caller without a key gets 401 and WWW-Authenticate: Bearer realm."""
    rejection = _policy(NVPAIR_PROXY_API_KEYS=KEY).check(LAN, Headers())
    assert rejection == Rejection(
        401, "auth-required", "API key required", ((b"WWW-Authenticate", CHALLENGE),)
    )


def test_non_bearer_authorization_counts_as_missing() -> None:
    """Basic credentials are not an API key: 401 with the plain challenge."""
    rejection = _policy(NVPAIR_PROXY_API_KEYS=KEY).check(LAN, _headers(Authorization="Basic eA=="))
    assert rejection is not None
    assert rejection.headers == ((b"WWW-Authenticate", CHALLENGE),)


def test_wrong_key_gets_401_invalid_token() -> None:
    """A wrong key gets 401 with error="invalid_token" in the challenge."""
    policy = _policy(NVPAIR_PROXY_API_KEYS=KEY)
    for headers in (_headers(Authorization="Bearer " + OTHER_KEY), _headers(X_Api_Key="nope")):
        rejection = policy.check(LAN, headers)
        assert rejection is not None
        assert (rejection.status, rejection.code) == (401, "invalid-api-key")
        assert rejection.headers == ((b"WWW-Authenticate", CHALLENGE + b', error="invalid_token"'),)


def test_right_key_via_bearer_is_allowed_and_stripped() -> None:
    """A right Bearer key passes (any scheme case) and is removed before forwarding."""
    policy = _policy(NVPAIR_PROXY_API_KEYS=f"{OTHER_KEY}, {KEY}")
    for scheme in ("Bearer", "bearer"):
        headers = _headers(Authorization=f"{scheme} {KEY}", Accept="*/*")
        assert policy.check(LAN, headers) is None
        policy.strip_credentials(LAN, headers)
        assert not headers.hasHeader(b"authorization")
        assert headers.getRawHeaders(b"accept") == [b"*/*"]


def test_right_key_via_x_api_key_is_allowed_and_stripped() -> None:
    """A right X-Api-Key passes; it is removed, while an unrelated Authorization is kept."""
    policy = _policy(NVPAIR_PROXY_API_KEYS=KEY)
    headers = _headers(X_Api_Key=KEY, Authorization="Bearer engine-token")
    assert policy.check(LAN, headers) is None
    policy.strip_credentials(LAN, headers)
    assert not headers.hasHeader(b"x-api-key")
    assert headers.getRawHeaders(b"authorization") == [b"Bearer engine-token"]


def test_loopback_caller_needs_no_key_keeps_its_own_credential_and_loses_the_proxys() -> None:
    """With keys configured a loopback caller still passes; its own credential passes to the
    node, while a value carrying one of the proxy's keys is removed (docs/behaviour.md §14.2)."""
    policy = _policy(NVPAIR_PROXY_API_KEYS=KEY)
    headers = _headers(Authorization="Bearer " + KEY, X_Api_Key="whatever")
    assert policy.check(LOCAL, headers) is None
    policy.strip_credentials(LOCAL, headers)
    assert not headers.hasHeader(b"authorization")
    assert headers.getRawHeaders(b"x-api-key") == [b"whatever"]


def test_plain_keys_are_never_kept() -> None:
    """The policy holds digests only: the key text appears nowhere in its state."""
    policy = _policy(NVPAIR_PROXY_API_KEYS=CANARY)
    assert CANARY not in repr(policy)
    assert CANARY.encode() not in b"".join(policy.static_digests)


# CIDRs


def test_caller_outside_the_cidrs_gets_403_even_with_a_right_key() -> None:
    """Outside NVPAIR_PROXY_ALLOWED_CIDRS the source is refused before any key check."""
    policy = _policy(NVPAIR_PROXY_API_KEYS=KEY, NVPAIR_PROXY_ALLOWED_CIDRS="10.0.0.0/8")
    rejection = policy.check(LAN, _headers(X_Api_Key=KEY))
    assert rejection is not None
    assert (rejection.status, rejection.code) == (403, "source-not-allowed")


def test_caller_inside_the_cidrs_with_a_right_key_is_allowed() -> None:
    """Inside the CIDRs (IPv4, IPv4-mapped or IPv6) a right key passes."""
    policy = _policy(
        NVPAIR_PROXY_API_KEYS=KEY, NVPAIR_PROXY_ALLOWED_CIDRS="192.0.2.0/24, 2001:db8::/32"
    )
    headers = _headers(X_Api_Key=KEY)
    assert policy.check(LAN, headers) is None
    assert policy.check(IPv6Address("TCP", "::ffff:192.0.2.77", 1), headers) is None
    assert policy.check(IPv6Address("TCP", "2001:db8::5", 1), headers) is None
    missing = policy.check(LAN, Headers())
    assert missing is not None and missing.status == 401


def test_unparseable_peer_is_outside_every_cidr() -> None:
    """A peer whose address does not parse never matches a CIDR."""
    policy = _policy(NVPAIR_PROXY_API_KEYS=KEY, NVPAIR_PROXY_ALLOWED_CIDRS="0.0.0.0/0")
    rejection = policy.check(IPv4Address("TCP", "bogus", 1), _headers(X_Api_Key=KEY))
    assert rejection is not None and rejection.code == "source-not-allowed"


# Identity probe


def test_identity_probe_gets_409_for_every_admitted_caller() -> None:
    """Probe header = 1 gets 409 proxy-facade, from loopback and from an admitted LAN caller."""
    policy = _policy(NVPAIR_PROXY_API_KEYS=KEY)
    for peer, headers in (
        (LOCAL, _headers(X_NVPAIR_Engine_Identity_Probe="1")),
        (LAN, _headers(X_NVPAIR_Engine_Identity_Probe="1", X_Api_Key=KEY)),
    ):
        rejection = policy.check(peer, headers)
        assert rejection is not None
        assert (rejection.status, rejection.code) == (409, "proxy-facade")


def test_identity_probe_comes_after_the_auth_checks() -> None:
    """An unauthenticated probe is refused as unauthenticated, not answered as a facade."""
    policy = _policy(NVPAIR_PROXY_API_KEYS=KEY)
    rejection = policy.check(LAN, _headers(X_NVPAIR_Engine_Identity_Probe="1"))
    assert rejection is not None and rejection.status == 401


def test_identity_probe_with_another_value_is_ignored() -> None:
    """Only the value 1 triggers the probe answer."""
    assert _policy().check(LOCAL, _headers(X_NVPAIR_Engine_Identity_Probe="0")) is None


# The parsed configuration, as a value


def test_parsing_gives_an_equal_value_each_time_and_hides_the_digests() -> None:
    """``parse_ingress`` is pure: the same environment gives equal values; no key material in repr."""
    environ = {"NVPAIR_PROXY_API_KEYS": CANARY, "NVPAIR_PROXY_ALLOWED_CIDRS": "10.0.0.0/8"}
    config = parse_ingress(environ)
    assert config == parse_ingress(environ)
    assert config.keys_configured
    assert config != parse_ingress({"NVPAIR_PROXY_API_KEYS": KEY})
    assert CANARY not in repr(config)
    assert "digest" not in repr(config)
    assert "10.0.0.0/8" in repr(config)
    assert parse_ingress({}) == IngressConfig()
    assert not IngressConfig().keys_configured


def test_key_file_is_read_once_at_parse_and_the_gate_starts_with_those_keys(
    tmp_path: Path,
) -> None:
    """The key file's keys are in the parsed value; a gate built later serves them without a read."""
    path = _key_file(tmp_path / "keys", KEY)
    config = parse_ingress({"NVPAIR_PROXY_API_KEYS_FILE": path})
    assert config.key_file == path and config.keys_configured
    os.remove(path)
    policy = IngressPolicy.from_config(config, Clock())
    assert policy.check(LAN, _headers(X_Api_Key=KEY)) is None
    assert policy.check(LAN, _headers(X_Api_Key=OTHER_KEY)) is not None


# Configuration errors


def test_bad_cidr_refuses_to_start() -> None:
    """An unparseable CIDR or one with host bits set is an IngressConfigError naming it."""
    for value in ("10.0.0.0/33", "not-a-net", "192.0.2.10/24", "10.0.0.0/8,"):
        with pytest.raises(IngressConfigError, match="NVPAIR_PROXY_ALLOWED_CIDRS"):
            _policy(NVPAIR_PROXY_API_KEYS=KEY, NVPAIR_PROXY_ALLOWED_CIDRS=value)


def test_cidrs_without_keys_refuse_to_start() -> None:
    """CIDRs alone would open nothing; that is refused rather than silently ignored."""
    with pytest.raises(IngressConfigError, match="only applies with API keys"):
        _policy(NVPAIR_PROXY_ALLOWED_CIDRS="10.0.0.0/8")


def test_bad_keys_variable_refuses_to_start_without_echoing_keys() -> None:
    """An empty entry or a key with spaces is refused; the message never contains a key."""
    for value in (f"{KEY},,{OTHER_KEY}", f"{CANARY} x", f"{CANARY}\x01"):
        with pytest.raises(IngressConfigError, match="NVPAIR_PROXY_API_KEYS") as info:
            _policy(NVPAIR_PROXY_API_KEYS=value)
        assert CANARY not in str(info.value)


def test_key_file_readable_by_others_is_refused_naming_the_mode(tmp_path: Path) -> None:
    """A 0644 key file is refused, and the message says which mode and why."""
    path = _key_file(tmp_path / "keys", CANARY, mode=0o644)
    with pytest.raises(IngressConfigError, match="mode 0644") as info:
        _policy(NVPAIR_PROXY_API_KEYS_FILE=path)
    assert "group or other" in str(info.value)
    assert CANARY not in str(info.value)


def test_key_file_problems_refuse_to_start(tmp_path: Path) -> None:
    """A missing file, a directory, a FIFO, an empty file and a bad key line are refused."""
    empty = _key_file(tmp_path / "empty", "# only a comment", "")
    bad = _key_file(tmp_path / "bad", KEY, f"{CANARY} with spaces")
    (tmp_path / "dir").mkdir(mode=0o700)
    os.mkfifo(tmp_path / "fifo", 0o600)
    cases = {
        str(tmp_path / "absent"): "cannot be read",
        str(tmp_path / "dir"): "not a regular file",
        str(tmp_path / "fifo"): "not a regular file",
        empty: "contains no keys",
        bad: "line 2",
    }
    for path, why in cases.items():
        with pytest.raises(IngressConfigError, match=why) as info:
            _policy(NVPAIR_PROXY_API_KEYS_FILE=path)
        assert CANARY not in str(info.value)


def test_key_file_skips_comments_and_blank_lines(tmp_path: Path) -> None:
    """Comment and blank lines are ignored; every other line is a key."""
    path = _key_file(tmp_path / "keys", "# team A", "", f"  {KEY}  ", "#" + OTHER_KEY)
    policy = _policy(NVPAIR_PROXY_API_KEYS_FILE=path)
    assert policy.check(LAN, _headers(X_Api_Key=KEY)) is None
    assert policy.check(LAN, _headers(X_Api_Key=OTHER_KEY)) is not None


# Key file rotation


def test_rotated_key_file_is_picked_up(tmp_path: Path, log_events: list[LogEvent]) -> None:
    """Replacing the key file swaps the keys at the next poll, without a restart."""
    clock = Clock()
    path = _key_file(tmp_path / "keys", KEY)
    policy = _policy(clock, NVPAIR_PROXY_API_KEYS_FILE=path)
    policy.start()
    _key_file(tmp_path / "new", OTHER_KEY)
    os.replace(tmp_path / "new", path)
    assert policy.check(LAN, _headers(X_Api_Key=KEY)) is None
    clock.advance(2)
    assert policy.check(LAN, _headers(X_Api_Key=OTHER_KEY)) is None
    assert policy.check(LAN, _headers(X_Api_Key=KEY)) is not None
    added, removed = (f"key-{hashlib.sha256(k.encode()).hexdigest()[:8]}" for k in (OTHER_KEY, KEY))
    assert f"reloaded 1 API keys from {path}: added {added}; removed {removed}" in _logged_text(
        log_events
    )
    policy.stop()
    assert clock.getDelayedCalls() == []


def test_in_place_rewrite_of_the_key_file_is_picked_up(tmp_path: Path) -> None:
    """Rewriting the same file (same inode and size) is noticed by its modification time."""
    clock = Clock()
    path = _key_file(tmp_path / "keys", KEY)
    policy = _policy(clock, NVPAIR_PROXY_API_KEYS_FILE=path)
    policy.start()
    before = os.stat(path).st_mtime_ns
    _key_file(tmp_path / "keys", OTHER_KEY)
    os.utime(path, ns=(before + 10**9, before + 10**9))
    clock.advance(2)
    assert policy.check(LAN, _headers(X_Api_Key=OTHER_KEY)) is None
    policy.stop()


def test_bad_reload_keeps_the_old_keys_and_logs_why(
    tmp_path: Path, log_events: list[LogEvent]
) -> None:
    """A reload that finds a bad file keeps the old keys, logs once, and recovers later."""
    clock = Clock()
    path = _key_file(tmp_path / "keys", KEY)
    policy = _policy(clock, NVPAIR_PROXY_API_KEYS_FILE=path)
    policy.start()
    _key_file(tmp_path / "keys", CANARY, mode=0o644)
    clock.advance(2)
    clock.advance(2)
    assert policy.check(LAN, _headers(X_Api_Key=KEY)) is None
    assert policy.check(LAN, _headers(X_Api_Key=CANARY)) is not None
    warnings = [e for e in log_events if "not reloaded" in formatEvent(e)]
    assert len(warnings) == 1
    assert "mode 0644" in formatEvent(warnings[0])
    os.chmod(path, 0o600)
    clock.advance(2)
    assert policy.check(LAN, _headers(X_Api_Key=CANARY)) is None
    assert policy.check(LAN, _headers(X_Api_Key=KEY)) is not None
    policy.stop()
    assert clock.getDelayedCalls() == []


def test_a_key_file_missing_once_keeps_the_keys_and_missing_twice_revokes_them(
    tmp_path: Path, log_events: list[LogEvent]
) -> None:
    """The file is the truth (§14.2): one read without it may be an editor's save in progress,
    two in a row revoke its keys, with one warning."""
    clock = Clock()
    path = _key_file(tmp_path / "keys", KEY)
    policy = _policy(clock, NVPAIR_PROXY_API_KEYS_FILE=path)
    policy.start()
    os.remove(path)
    clock.advance(2)
    assert policy.check(LAN, _headers(X_Api_Key=KEY)) is None
    clock.advance(2)
    refused = policy.check(LAN, _headers(X_Api_Key=KEY))
    assert refused is not None and refused.code == "loopback-only"
    clock.advance(2)
    warnings = [e for e in log_events if "revoked" in formatEvent(e)]
    assert len(warnings) == 1 and "2 reads in a row" in formatEvent(warnings[0])
    policy.stop()


def test_start_and_stop_without_a_key_file_schedule_nothing() -> None:
    """Without a key file there is nothing to watch and no timer."""
    clock = Clock()
    policy = _policy(clock, NVPAIR_PROXY_API_KEYS=KEY)
    policy.start()
    assert clock.getDelayedCalls() == []
    policy.stop()


def test_canary_key_never_reaches_logs_or_error_bodies(
    tmp_path: Path, log_events: list[LogEvent]
) -> None:
    """Across accept, reject, reload and failure paths the key text is never logged or echoed."""
    clock = Clock()
    path = _key_file(tmp_path / "keys", CANARY)
    policy = _policy(clock, NVPAIR_PROXY_API_KEYS_FILE=path, NVPAIR_PROXY_API_KEYS=KEY)
    policy.start()
    rejections = [
        policy.check(LAN, _headers(Authorization="Bearer " + CANARY + "x")),
        policy.check(LAN, _headers(X_Api_Key=CANARY[:-1])),
        policy.check(LAN, Headers()),
    ]
    assert policy.check(LAN, _headers(X_Api_Key=CANARY)) is None
    _key_file(tmp_path / "keys", CANARY, OTHER_KEY)
    clock.advance(2)
    _key_file(tmp_path / "keys", CANARY + " bad", mode=0o644)
    clock.advance(2)
    os.chmod(path, 0o600)
    clock.advance(2)
    os.remove(path)
    clock.advance(2)
    policy.stop()
    assert len(log_events) >= 3
    assert CANARY not in _logged_text(log_events)
    for rejection in rejections:
        assert rejection is not None
        assert CANARY not in repr(rejection)
