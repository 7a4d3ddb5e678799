"""The keys file is the truth (docs/behaviour.md §14.2): missing or empty on two reads in a row
revokes, one half-written read does not, and the change hook names the keys a reload removed or
changed. Real files, an injected clock."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.logger import LogEvent, formatEvent
from twisted.web.http_headers import Headers

from nvpair_tw.inbound import Caller, IngressPolicy, parse_ingress

pytestmark = pytest.mark.timeout(30)

ALICE = "sk-alice-0123456789"
BOB = "sk-bob-9876543210"
CAROL = "sk-carol-4444444444"
LAN = IPv4Address("TCP", "192.0.2.10", 5000)
POLL = 2.0


def entry(name: str, key: str, extra: str = "") -> str:
    return f'[[key]]\nname = "{name}"\nkey = "{key}"\n{extra}\n'


def write(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o600)
    return str(path)


def started(tmp_path: Path, text: str, **env: str) -> tuple[Clock, IngressPolicy, Path]:
    clock = Clock()
    path = tmp_path / "keys.toml"
    config = parse_ingress(env, keys_file=write(path, text))
    policy = IngressPolicy.from_config(config, clock)
    policy.start()
    return clock, policy, path


def who(policy: IngressPolicy, key: str) -> str | None:
    verdict = policy.admit(LAN, Headers({b"x-api-key": [key.encode()]}))
    return verdict.name if isinstance(verdict, Caller) else None


def revocations(events: list[LogEvent]) -> list[str]:
    return [formatEvent(e) for e in events if "revoked" in formatEvent(e)]


@pytest.mark.parametrize("gone", ["removed", "emptied", "comments only"])
def test_a_keys_file_gone_on_two_reads_revokes_every_named_key(
    tmp_path: Path, log_events: list[LogEvent], gone: str
) -> None:
    clock, policy, path = started(tmp_path, entry("alice", ALICE) + entry("bob", BOB))
    if gone == "removed":
        os.remove(path)
    else:
        write(path, "" if gone == "emptied" else "# nobody yet\n")
    clock.advance(POLL)
    assert who(policy, ALICE) == "alice"  # one read: maybe an editor's save in progress
    clock.advance(POLL)
    assert who(policy, ALICE) is None and who(policy, BOB) is None
    assert not policy.keys_configured
    for _ in range(3):
        clock.advance(POLL)
    assert len(revocations(log_events)) == 1
    assert ALICE not in "".join(formatEvent(e) + repr(e) for e in log_events)
    write(path, entry("carol", CAROL))
    clock.advance(POLL)
    assert who(policy, CAROL) == "carol"
    policy.stop()
    assert clock.getDelayedCalls() == []


def test_a_half_written_file_caught_once_keeps_the_keys(
    tmp_path: Path, log_events: list[LogEvent]
) -> None:
    """Empty, then truncated TOML, then whole: never two empty reads in a row, never revoked."""
    clock, policy, path = started(tmp_path, entry("alice", ALICE))
    write(path, "")
    clock.advance(POLL)
    write(path, '[[key]]\nname = "ali')
    clock.advance(POLL)
    assert who(policy, ALICE) == "alice"
    write(path, entry("alice", ALICE) + entry("bob", BOB))
    clock.advance(POLL)
    assert who(policy, ALICE) == "alice" and who(policy, BOB) == "bob"
    assert revocations(log_events) == []
    policy.stop()


def test_the_environments_key_file_follows_the_same_rule(
    tmp_path: Path, log_events: list[LogEvent]
) -> None:
    clock = Clock()
    env_file = tmp_path / "env-keys"
    write(env_file, f"{ALICE}\n")
    config = parse_ingress({"NVPAIR_PROXY_API_KEYS_FILE": str(env_file)})
    policy = IngressPolicy.from_config(config, clock)
    policy.start()
    write(env_file, "# rotated out\n")
    clock.advance(POLL)
    assert who(policy, ALICE) is not None
    clock.advance(POLL)
    assert who(policy, ALICE) is None
    assert len(revocations(log_events)) == 1
    policy.stop()


def test_a_bad_file_keeps_the_keys_however_often_it_is_read(tmp_path: Path) -> None:
    """A file that is unusable (not empty) is the operator's mistake, not a revocation."""
    clock, policy, path = started(tmp_path, entry("alice", ALICE))
    write(path, entry("alice", ALICE, "max_concurrent = 0"))
    for _ in range(4):
        clock.advance(POLL)
    assert who(policy, ALICE) == "alice"
    policy.stop()


def test_the_change_hook_names_removed_and_changed_keys(tmp_path: Path) -> None:
    text = entry("alice", ALICE) + entry("bob", BOB) + entry("carol", CAROL)
    clock, policy, path = started(tmp_path, text, NVPAIR_PROXY_API_KEYS="sk-env-1234567890")
    told: list[frozenset[str]] = []
    policy.watch_changes(told.append)
    # bob removed, carol re-scoped, alice unchanged, dave added.
    write(
        path,
        entry("alice", ALICE)
        + entry("carol", CAROL, 'models = ["llama3*"]')
        + entry("dave", "sk-dave-1111111111"),
    )
    clock.advance(POLL)
    assert told == [frozenset({"bob", "carol"})]
    # A new key under the same name is the old key removed; a role change is a change.
    write(
        path,
        entry("alice", "sk-alice-rotated-1")
        + entry("carol", CAROL, 'models = ["llama3*"]\nrole = "admin"')
        + entry("dave", "sk-dave-1111111111"),
    )
    clock.advance(POLL)
    assert told[1] == frozenset({"alice", "carol"})
    # Nothing changed: nobody is told.
    os.utime(path, ns=(1, 1))
    clock.advance(POLL)
    assert len(told) == 2
    os.remove(path)
    clock.advance(POLL)
    clock.advance(POLL)
    assert told[2] == frozenset({"alice", "carol", "dave"})  # the environment's key stays
    policy.stop()


def test_a_failing_listener_does_not_stop_the_others(tmp_path: Path) -> None:
    clock, policy, path = started(tmp_path, entry("alice", ALICE) + entry("bob", BOB))
    told: list[frozenset[str]] = []

    def broken(names: frozenset[str]) -> None:
        raise RuntimeError("listener bug")

    policy.watch_changes(broken)
    policy.watch_changes(told.append)
    write(path, entry("alice", ALICE))
    clock.advance(POLL)
    assert told == [frozenset({"bob"})]
    policy.stop()
