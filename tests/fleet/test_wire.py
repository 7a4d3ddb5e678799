"""Tests for nvpair_tw.fleet._wire: the fleet store's keys, messages, batch arguments and sealing."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from nvpair_tw.fleet._wire import WRITE_SCRIPT, Codec, Kind, json_object, sealer


def test_keys_and_messages_carry_the_namespace_and_the_proxy_id() -> None:
    codec = Codec("p1", "ns")
    assert codec.channel == "ns:events"
    assert codec.key(Kind.COOL, "ollama", "n0") == "ns:cool:ollama:n0"
    assert codec.prefix(Kind.RESERVATIONS) == "ns:res:"
    assert codec.counter("rpm:alice:7") == "ns:rpm:alice:7"
    assert codec.message(Kind.PROGRESS, e="ollama", n="n0") == {
        "o": "p1",
        "t": "prog",
        "e": "ollama",
        "n": "n0",
    }


def test_one_message_is_published_as_itself_several_as_one_batch() -> None:
    codec = Codec("p1", "ns")
    one = codec.message(Kind.CLEAR, e="ollama", n="n0")
    keys, args = codec.script_args([("del", "ns:a"), ("pub", one)])
    assert keys == ["ns:a"]
    assert args[:1] == ["d"] and args[1:3] == ["p", "ns:events"] and json.loads(args[3]) == one
    two = codec.message(Kind.PROGRESS, e="ollama", n="n1")
    keys, args = codec.script_args([("set", "ns:b", "v", 0.4), ("pub", one), ("pub", two)])
    assert keys == ["ns:b"] and args[:3] == ["s", "v", 1]  # a TTL is at least 1 ms
    assert json.loads(args[5]) == {"o": "p1", "t": "batch", "m": [one, two]}


def test_a_kept_key_is_set_without_a_ttl() -> None:
    """``keep`` (a cordon) is the script's ``k``: the key and its value, no TTL argument."""
    codec = Codec("p1", "ns")
    keys, args = codec.script_args([("keep", "ns:cordon:ollama:n0", "v"), ("del", "ns:x")])
    assert keys == ["ns:cordon:ollama:n0", "ns:x"] and args == ["k", "v", "d"]
    assert "redis.call('SET', KEYS[k], ARGV[i + 1]); k = k + 1; i = i + 2" in WRITE_SCRIPT


def test_a_peers_batch_is_unpacked_with_its_origin_and_our_own_messages_are_skipped() -> None:
    codec = Codec("me", "ns")
    peer = Codec("peer", "ns")
    progress = peer.message(Kind.PROGRESS, e="x", n="a")
    unknown = {"t": "what", "e": "x", "n": "c"}
    _keys, args = peer.script_args(
        [("pub", progress), ("pub", {"t": "clear", "e": "x", "n": "b"}), ("pub", unknown)]
    )
    decoded = codec.decode(args[2])
    assert [(m.kind, m.origin, m.text("n")) for m in decoded] == [
        (Kind.PROGRESS, "peer", "a"),
        (Kind.CLEAR, "peer", "b"),
    ]  # a kind this proxy does not know is not a message
    assert codec.decode(json.dumps(codec.message(Kind.PROGRESS, e="x", n="a"))) == []
    assert codec.decode(b"[1, 2]") == []
    with pytest.raises(ValueError):
        codec.decode(b"not json")


def test_sealing_is_the_digest_itself_without_a_secret_and_hmac_sha256_with_one() -> None:
    assert sealer(None)(b"digest") == b"digest"
    assert sealer(b"k")(b"digest") == hmac.new(b"k", b"digest", hashlib.sha256).digest()


def test_only_a_json_object_is_an_entry() -> None:
    assert json_object(b'{"e": "x"}') == {"e": "x"}
    assert json_object("[1]") is None and json_object("{") is None and json_object(3) is None
