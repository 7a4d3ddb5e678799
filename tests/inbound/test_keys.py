"""Named keys (docs/behaviour.md §12.1): the ``--keys`` file, its mode and reloads, the
environment's keys' names, model globs, and who :meth:`IngressPolicy.identify` says is calling."""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

import pytest
from twisted.internet.address import IPv4Address, UNIXAddress
from twisted.internet.task import Clock
from twisted.logger import LogEvent, formatEvent
from twisted.web.http_headers import Headers

import nvpair_tw.inbound._keys as keys_module
from nvpair_tw.core import Priority
from nvpair_tw.inbound import (
    LOCAL,
    Caller,
    IngressConfigError,
    IngressPolicy,
    KeyRules,
    KeysFileError,
    Role,
    env_key_name,
    model_not_allowed,
    parse_ingress,
    read_keys_file,
)
from nvpair_tw.inbound._keys import ENVIRONMENT_RULES

pytestmark = pytest.mark.timeout(30)

ALICE = "sk-alice-0123456789"
BOB = "sk-bob-9876543210"
ENV = "sk-env-5555555555"
CANARY = "canary-4e1f0b7a2c9d"
LAN = IPv4Address("TCP", "192.0.2.10", 5000)
LOOP = IPv4Address("TCP", "127.0.0.1", 5000)


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def keys_file(path: Path, text: str, mode: int = 0o600) -> str:
    path.write_text(text)
    path.chmod(mode)
    return str(path)


TWO = f"""
[[key]]
name = "alice"
key = "{ALICE}"
models = ["llama3*", "qwen2.5:7b"]
requests_per_minute = 10
tokens_per_minute = 5000
max_concurrent = 2

[[key]]
name = "bob"
key_sha256 = "{sha(BOB).upper()}"
"""


def bearer(key: str) -> Headers:
    return Headers({b"authorization": [f"Bearer {key}".encode()]})


def policy(
    tmp_path: Path, text: str = TWO, clock: Clock | None = None, **env: str
) -> IngressPolicy:
    path = keys_file(tmp_path / "keys.toml", text)
    return IngressPolicy.from_config(parse_ingress(env, keys_file=path), clock or Clock())


# --- the file -----------------------------------------------------------------------------------


def test_a_keys_file_is_read_into_names_rules_and_digests_only(tmp_path: Path) -> None:
    book = read_keys_file(keys_file(tmp_path / "k", TWO))
    assert book.names() == ["alice", "bob"]
    alice, bob = book.entries
    assert alice.digest == hashlib.sha256(ALICE.encode()).digest()
    assert bob.digest == hashlib.sha256(BOB.encode()).digest()
    assert alice.rules == KeyRules(
        models=("llama3*", "qwen2.5:7b"),
        requests_per_minute=10,
        tokens_per_minute=5000,
        max_concurrent=2,
    )
    assert bob.rules == KeyRules() and not bob.rules.limited
    # Nothing kept or shown holds the key itself.
    assert ALICE not in repr(book) and ALICE.encode() not in repr(book.entries).encode()


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644, 0o620])
def test_a_group_or_world_accessible_file_is_refused_at_start(tmp_path: Path, mode: int) -> None:
    path = keys_file(tmp_path / "k", TWO, mode=mode)
    with pytest.raises(KeysFileError, match=f"mode {mode:04o}.*chmod 600"):
        parse_ingress({}, keys_file=path)


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_mode_0600_or_stricter_is_accepted(tmp_path: Path, mode: int) -> None:
    path = keys_file(tmp_path / "k", TWO, mode=mode)
    assert parse_ingress({}, keys_file=path).named.names() == ["alice", "bob"]


def test_a_missing_file_and_a_fifo_are_refused(tmp_path: Path) -> None:
    with pytest.raises(KeysFileError, match="cannot be read"):
        parse_ingress({}, keys_file=str(tmp_path / "absent"))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(KeysFileError, match="not a regular file"):
        read_keys_file(str(fifo))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[[key]]\nkey = 'x-1'\n", "name must be"),
        ("[[key]]\nname = 'has space'\nkey = 'x-1'\n", "name must be"),
        ("[[key]]\nname = 'local'\nkey = 'x-1'\n", "kept for the proxy's records"),
        ("[[key]]\nname = 'anonymous'\nkey = 'x-1'\n", "kept for the proxy's records"),
        ("[[key]]\nname = 'other'\nkey = 'x-1'\n", "kept for the proxy's records"),
        ("[[key]]\nname = 'Local'\nkey = 'x-1'\n", "kept for the proxy's records"),
        ("[[key]]\nname = 'a'\nkey = 'x-1'\nrole = 'root'\n", "role must be"),
        ("[[key]]\nname = 'a'\nkey = 'x-1'\nrole = 1\n", "role must be"),
        ("[[key]]\nname = 'a'\nkey = 'x-1'\npriority = 'low'\n", "priority must be"),
        ("[[key]]\nname = 'a'\nkey = 'x-1'\npriority = 1\n", "priority must be"),
        ("[[key]]\nname = 'a'\nkey = 'x-1'\ntunnels = 'yes'\n", "tunnels must be"),
        ("[[key]]\nname = 'a'\nkey = 'x-1'\nmax_tunnels = 0\n", "positive integer"),
        ("[[key]]\nname = 'a'\nkey = 'x-1'\n[[key]]\nname = 'a'\nkey = 'x-2'\n", "used twice"),
        ("[[key]]\nname = 'a'\n", "exactly one of key or key_sha256"),
        (f"[[key]]\nname = 'a'\nkey = 'x-1'\nkey_sha256 = '{sha('x')}'\n", "exactly one"),
        ("[[key]]\nname = 'a'\nkey_sha256 = 'abc'\n", "64 hex digits"),
        (f"[[key]]\nname = 'a'\nkey_sha256 = '{'g' * 64}'\n", "64 hex digits"),
        ("[[key]]\nname = 'a'\nkey = 'has space'\n", "printable ASCII"),
        ("[[key]]\nname = 'a'\nkey = ''\n", "printable ASCII"),
        ("[[key]]\nname = 'a'\nkey = 'x-1'\n[[key]]\nname = 'b'\nkey = 'x-1'\n", "given twice"),
        ("[[key]]\nname = 'a'\nkey = 'x-1'\nmodels = 'llama3'\n", "models must be a list"),
        ("[[key]]\nname = 'a'\nkey = 'x-1'\nmodels = ['']\n", "models must be a list"),
        ("[[key]]\nname = 'a'\nkey = 'x-1'\nrequests_per_minute = 0\n", "positive integer"),
        ("[[key]]\nname = 'a'\nkey = 'x-1'\ntokens_per_minute = -5\n", "positive integer"),
        ("[[key]]\nname = 'a'\nkey = 'x-1'\nmax_concurrent = true\n", "positive integer"),
        ("[[key]]\nname = 'a'\nkey = 'x-1'\nmax_concurrent = 1.5\n", "positive integer"),
        (
            "[[key]]\nname = 'a'\nkey = 'x-1'\nrequest_per_minute = 5\n",
            "unknown field 'request_per_minute'; did you mean 'requests_per_minute'\\?$",
        ),
        ("[[key]]\nname = 'a'\nkey = 'x-1'\nzzz = 5\n", "unknown field 'zzz'$"),
        ("[[keys]]\nname = 'a'\n", "unknown table 'keys'; did you mean 'key'\\?$"),
        ("[other]\n", "unknown table"),
        ("", "contains no keys"),
        ("[[key]\n", "not valid TOML"),
    ],
)
def test_a_flawed_file_is_refused_with_a_clear_message(tmp_path: Path, text: str, why: str) -> None:
    with pytest.raises(KeysFileError, match=why):
        read_keys_file(keys_file(tmp_path / "k", text))


def test_a_keys_priority_is_interactive_unless_it_says_batch(tmp_path: Path) -> None:
    """``priority = "batch"`` on a key (docs/behaviour.md §16.3); unset is interactive."""
    text = (
        "[[key]]\nname = 'a'\nkey = 'x-1'\npriority = 'batch'\n[[key]]\nname = 'b'\nkey = 'x-2'\n"
    )
    book = read_keys_file(keys_file(tmp_path / "k", text))
    assert [e.rules.priority for e in book.entries] == [Priority.BATCH, Priority.INTERACTIVE]


def test_an_error_never_quotes_the_key(tmp_path: Path) -> None:
    text = f"[[key]]\nname = 'a'\nkey = '{CANARY}'\nmax_concurrent = 0\n"
    with pytest.raises(KeysFileError) as error:
        read_keys_file(keys_file(tmp_path / "k", text))
    assert CANARY not in str(error.value) and "(a)" in str(error.value)
    bad_toml = f"[[key]]\nname = 'a'\nkey = '{CANARY}' oops\n"
    with pytest.raises(KeysFileError) as error:
        read_keys_file(keys_file(tmp_path / "k", bad_toml))
    assert CANARY not in str(error.value)


def test_cidrs_work_with_named_keys_alone(tmp_path: Path) -> None:
    path = keys_file(tmp_path / "k", TWO)
    config = parse_ingress({"NVPAIR_PROXY_ALLOWED_CIDRS": "192.0.2.0/24"}, keys_file=path)
    assert config.keys_configured
    with pytest.raises(IngressConfigError, match="--keys"):
        parse_ingress({"NVPAIR_PROXY_ALLOWED_CIDRS": "192.0.2.0/24"})


# --- who is calling -----------------------------------------------------------------------------


def test_a_named_key_opens_the_gate_and_names_the_caller(tmp_path: Path) -> None:
    gate = policy(tmp_path)
    assert gate.check(LAN, bearer(ALICE)) is None
    caller = gate.identify(LAN, bearer(ALICE))
    assert caller is not None and caller.name == "alice" and caller.rules.max_concurrent == 2
    by_header = gate.identify(LAN, Headers({b"x-api-key": [BOB.encode()]}))
    assert by_header == Caller("bob", KeyRules())


def test_identify_agrees_with_check(tmp_path: Path) -> None:
    """Where check refuses the caller, identify names nobody; where it lets it in, somebody."""
    gate = policy(tmp_path, NVPAIR_PROXY_ALLOWED_CIDRS="192.0.2.0/28")
    outside = IPv4Address("TCP", "198.51.100.1", 5000)
    cases = [
        (LAN, Headers()),
        (LAN, bearer("sk-wrong")),
        (LAN, bearer(ALICE)),
        (outside, bearer(ALICE)),
        (LOOP, Headers()),
        (LOOP, bearer("sk-wrong")),
        (LOOP, bearer(ALICE)),
        (UNIXAddress(b"/tmp/sock"), Headers()),
    ]
    for peer, headers in cases:
        refused = gate.check(peer, headers)
        assert (refused is None) == (gate.identify(peer, headers) is not None), (peer, headers)


def test_loopback_without_a_known_key_is_local_and_with_one_is_that_key(tmp_path: Path) -> None:
    gate = policy(tmp_path)
    assert gate.identify(LOOP, Headers()) is LOCAL
    assert gate.identify(LOOP, bearer("someone-elses-token")) is LOCAL
    alice = gate.identify(LOOP, bearer(ALICE))
    assert alice is not None and alice.name == "alice"
    # Without any key configured a loopback caller is local too.
    bare = IngressPolicy.from_config(parse_ingress({}), Clock())
    assert bare.identify(LOOP, bearer(ALICE)) is LOCAL
    assert bare.identify(LAN, bearer(ALICE)) is None


def test_the_environments_keys_keep_working_named_by_their_digest(tmp_path: Path) -> None:
    env_file = tmp_path / "env-keys"
    env_file.write_text(f"{BOB}-file\n")
    env_file.chmod(0o600)
    gate = policy(tmp_path, NVPAIR_PROXY_API_KEYS=ENV, NVPAIR_PROXY_API_KEYS_FILE=str(env_file))
    from_var = gate.identify(LAN, bearer(ENV))
    assert from_var == Caller("key-" + sha(ENV)[:8], ENVIRONMENT_RULES)
    assert from_var.role is Role.ADMIN
    assert from_var.name == env_key_name(hashlib.sha256(ENV.encode()).digest())
    from_file = gate.identify(LAN, bearer(f"{BOB}-file"))
    assert from_file is not None and from_file.name == "key-" + sha(f"{BOB}-file")[:8]
    alice = gate.identify(LAN, bearer(ALICE))
    assert alice is not None and alice.name == "alice"
    # Without --keys the environment's keys are named the same way.
    plain = IngressPolicy.from_config(parse_ingress({"NVPAIR_PROXY_API_KEYS": ENV}), Clock())
    assert plain.identify(LAN, bearer(ENV)) == from_var


def test_a_key_in_both_the_file_and_the_environment_takes_the_files_name_and_rules(
    tmp_path: Path,
) -> None:
    gate = policy(tmp_path, NVPAIR_PROXY_API_KEYS=ALICE)
    caller = gate.identify(LAN, bearer(ALICE))
    assert caller is not None and caller.name == "alice" and caller.rules.limited


def test_x_api_key_is_the_credential_read_when_present(tmp_path: Path) -> None:
    """``X-Api-Key`` wins over ``Authorization`` (§14.2): with it present, a right Bearer key
    does not open the gate for a wrong X-Api-Key, and a right X-Api-Key names the caller; two
    credentials in ``Authorization`` are refused whatever they hold."""
    gate = policy(tmp_path)
    headers = Headers({b"authorization": [f"Bearer {BOB}".encode()]})
    headers.addRawHeader(b"x-api-key", ALICE.encode())
    caller = gate.identify(LAN, headers)
    assert caller is not None and caller.name == "alice"
    wrong = Headers({b"authorization": [f"Bearer {BOB}".encode()], b"x-api-key": [b"sk-no"]})
    refused = gate.check(LAN, wrong)
    assert refused is not None and refused.code == "invalid-api-key"
    first_bearer = Headers({b"authorization": [b"Bearer sk-unknown", f"Bearer {BOB}".encode()]})
    assert gate.check(LAN, first_bearer) is not None


def test_named_keys_are_stripped_before_forwarding(tmp_path: Path) -> None:
    gate = policy(tmp_path)
    headers = bearer(ALICE)
    headers.addRawHeader(b"authorization", b"Bearer upstream-token")
    gate.strip_credentials(LAN, headers)
    assert headers.getRawHeaders(b"authorization") == [b"Bearer upstream-token"]


def test_every_entry_is_compared_in_constant_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lookup compares the digest with every entry through ``hmac.compare_digest``, whether
    the key is first, last or unknown (no early exit that would time the position)."""
    gate = policy(tmp_path, NVPAIR_PROXY_API_KEYS=ENV)
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(keys_module.hmac, "compare_digest", counting)  # type: ignore[attr-defined]
    for key in (ALICE, ENV, "sk-unknown"):
        calls.clear()
        gate.identify(LAN, bearer(key))
        assert len(calls) == len(gate.book) == 3
        assert all(len(a) == 32 and a == hashlib.sha256(key.encode()).digest() for a, _ in calls)


# --- globs --------------------------------------------------------------------------------------


def test_model_globs_are_fnmatch_style_and_case_sensitive() -> None:
    rules = KeyRules(models=("llama3*", "qwen2.5:7b", "phi-[34]", "mistral?"))
    assert rules.allows("llama3") and rules.allows("llama3:8b") and rules.allows("llama3.1:70b")
    assert rules.allows("qwen2.5:7b") and not rules.allows("qwen2.5:14b")
    assert rules.allows("phi-3") and not rules.allows("phi-2")
    assert rules.allows("mistral7") and not rules.allows("mistral")
    assert not rules.allows("Llama3") and not rules.allows("LLAMA3:8b")
    assert not rules.allows("org/llama3")  # a pattern matches the whole name
    assert rules.allowed(["qwen2.5:14b", "llama3:8b", "phi-4", "gemma"]) == ["llama3:8b", "phi-4"]


def test_no_models_means_every_model_and_an_empty_list_none() -> None:
    assert KeyRules().allows("anything") and KeyRules().allowed(["a", "b"]) == ["a", "b"]
    assert not KeyRules(models=()).allows("anything")
    assert KeyRules(models=()).allowed(["a"]) == []


def test_the_model_refusal_is_a_403_model_not_allowed() -> None:
    refused = model_not_allowed("gemma:2b")
    assert (refused.status, refused.code) == (403, "model-not-allowed")
    assert "gemma:2b" in refused.message


# --- reloads ------------------------------------------------------------------------------------


def test_the_file_is_reread_when_it_changes(tmp_path: Path, log_events: list[LogEvent]) -> None:
    clock = Clock()
    gate = policy(tmp_path, clock=clock)
    gate.start()
    keys_file(tmp_path / "keys.toml", f"[[key]]\nname = 'carol'\nkey = '{CANARY}'\n")
    clock.advance(2)
    assert gate.identify(LAN, bearer(CANARY)) == Caller("carol")
    assert gate.check(LAN, bearer(ALICE)) is not None  # alice is gone
    text = "\n".join(formatEvent(e) + repr(e) for e in log_events)
    assert "reloaded 1 named keys" in text and "carol" in text and CANARY not in text
    gate.stop()
    assert clock.getDelayedCalls() == []


def test_a_reload_says_which_key_names_it_added_removed_and_changed(
    tmp_path: Path, log_lines: list[str]
) -> None:
    """One line per reload: the count and the names added, removed and changed (a new key under
    a kept name is a change); never a key."""
    clock = Clock()
    gate = policy(tmp_path, clock=clock)
    gate.start()
    changed = TWO.replace(ALICE, CANARY).split('[[key]]\nname = "bob"')[0]
    keys_file(tmp_path / "keys.toml", changed + f"[[key]]\nname = 'carol'\nkey = '{BOB}x'\n")
    clock.advance(2)
    gate.stop()
    path = tmp_path / "keys.toml"
    assert [line for line in log_lines if "reloaded" in line] == [
        f"reloaded 2 named keys from {path}: added carol; removed bob; changed alice"
    ]
    assert not [line for line in log_lines if CANARY in line or BOB in line or ALICE in line]


def test_a_bad_reload_keeps_the_previous_keys_with_one_warning(
    tmp_path: Path, log_events: list[LogEvent]
) -> None:
    clock = Clock()
    gate = policy(tmp_path, clock=clock)
    gate.start()
    path = tmp_path / "keys.toml"
    keys_file(path, f"[[key]]\nname = 'carol'\nkey = '{CANARY}'\n", mode=0o644)
    for _ in range(3):
        clock.advance(2)
    assert gate.identify(LAN, bearer(ALICE)) is not None
    assert gate.check(LAN, bearer(CANARY)) is not None
    keys_file(path, f"[[key]]\nname = 'carol'\nkey = '{CANARY}'\nmax_concurrent = 0\n")
    for _ in range(3):
        clock.advance(2)
    assert gate.identify(LAN, bearer(ALICE)) is not None
    warnings = [formatEvent(e) for e in log_events if "not reloaded" in formatEvent(e)]
    assert len(warnings) == 2, warnings  # one per distinct problem, not one per poll
    assert "mode 0644" in warnings[0] and "positive integer" in warnings[1]
    assert all(CANARY not in w for w in warnings)
    keys_file(path, f"[[key]]\nname = 'carol'\nkey = '{CANARY}'\n")
    clock.advance(2)
    assert gate.identify(LAN, bearer(CANARY)) == Caller("carol")
    gate.stop()


# --- from the command line to the runtime -------------------------------------------------------


def test_keys_reaches_the_config_and_the_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nvpair_tw.core import Settings
    from nvpair_tw.runtime import build_runtime
    from nvpair_tw.tap import Options

    for name in list(os.environ):
        if name.startswith("NVPAIR_"):
            monkeypatch.delenv(name)
    path = keys_file(tmp_path / "keys.toml", TWO)
    options = Options()
    options.parseOptions(["--engine", "ollama", "--keys", path])
    config = options.config
    assert config.ingress.keys_file == path and config.ingress.keys_configured
    assert ALICE not in repr(config)
    runtime = build_runtime(Clock(), Settings(), ["ollama"], ingress=config.ingress)  # type: ignore[arg-type]
    assert runtime.shared.ingress is not None
    assert runtime.shared.ingress.book.names() == ["alice", "bob"]
    assert runtime.shared.limiter.counters is None  # local without --state


def test_a_readable_keys_file_stops_the_start_with_a_clear_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from twisted.python import usage

    from nvpair_tw.tap import Options

    monkeypatch.delenv("NVPAIR_PROXY_API_KEYS", raising=False)
    path = keys_file(tmp_path / "keys.toml", TWO, mode=0o644)
    with pytest.raises(usage.UsageError, match=r"keys file .* has mode 0644.*chmod 600"):
        Options().parseOptions(["--engine", "ollama", "--keys", path])
    with pytest.raises(usage.UsageError, match="cannot be read"):
        Options().parseOptions(["--engine", "ollama", "--keys", str(tmp_path / "nope")])
