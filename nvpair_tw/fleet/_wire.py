# -*- test-case-name: tests.fleet.test_wire -*-
"""What the fleet store holds and carries (docs/behaviour.md §6.6): key names, published messages, the batch
script, and the sealing of affinity digests.

Every key is ``NAMESPACE:KIND:…``; every message is a JSON object ``{"o": proxy id, "t": kind,
…}``, and a batch of them is one ``{"t": "batch", "m": [...]}`` message on ``NAMESPACE:events``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import Any

from attrs import frozen

__all__ = [
    "WRITE_SCRIPT",
    "Codec",
    "Command",
    "Kind",
    "Message",
    "Op",
    "json_object",
    "sealer",
    "text",
]


class Kind(Enum):
    """What a key holds and what a published message changes (its ``t``)."""

    COOL = "cool"
    """A node stalled: its cooldown (a key, and a message)."""
    CLEAR = "clear"
    """A cooldown ended by a success (a message)."""
    CORDON = "cordon"
    UNCORDON = "uncordon"
    AFFINITY = "aff"
    """A conversation's prefix is warm on a node (a key, and a message)."""
    SESSION = "sess"
    """A client's session was served on a node: its home (a key, and a message; only with a
    secret, its name sealed under it)."""
    RESERVATIONS = "res"
    """One proxy's reservation counts (a key, and a message)."""
    PROGRESS = "prog"
    """A node delivered body bytes (a message)."""
    SPEED = "speed"
    """A node's measured rates for a model (a message)."""
    CACHE = "cache"
    """A conversation was served whole on a node: it is the most recent in that node's prompt
    cache (a message; its root sealed as affinity digests are)."""
    USAGE = "usage"
    """An hour's usage sums (a key)."""
    BATCH = "batch"
    """Several messages published as one."""


@frozen
class Message:
    """A peer's published change: its kind, the proxy it came from and its fields."""

    kind: Kind
    origin: str | None
    fields: Mapping[str, Any]

    def text(self, name: str) -> str | None:
        """The field ``name`` when it is a string."""
        value = self.fields.get(name)
        return value if isinstance(value, str) else None


Op = tuple[Any, ...]
"""One store operation: ``("set", key, value, ttl_ms)``, ``("keep", key, value)`` (no TTL: a
cordon stays until it is lifted), ``("del", key)``, ``("hincr", key, field, n, ttl_ms)`` (add ``n``
to a hash field and give the hash that TTL: usage sums) or ``("pub", message)``."""
Command = Callable[[], Sequence[Op]]
"""Makes a write's operations when it is sent (so a TTL is what is left *then*)."""

# One round trip for a whole batch; SET and DEL replace any type, and a usage key that is not a
# hash is deleted before HINCRBY, so a key a person corrupted by hand cannot make the batch fail.
WRITE_SCRIPT = """
local k, i = 1, 1
while i <= #ARGV do
  local op = ARGV[i]
  if op == 's' then
    redis.call('SET', KEYS[k], ARGV[i + 1], 'PX', ARGV[i + 2]); k = k + 1; i = i + 3
  elseif op == 'k' then
    redis.call('SET', KEYS[k], ARGV[i + 1]); k = k + 1; i = i + 2
  elseif op == 'd' then
    redis.call('DEL', KEYS[k]); k = k + 1; i = i + 1
  elseif op == 'h' then
    local kind = redis.call('TYPE', KEYS[k]).ok
    if kind ~= 'hash' and kind ~= 'none' then redis.call('DEL', KEYS[k]) end
    redis.call('HINCRBY', KEYS[k], ARGV[i + 1], ARGV[i + 2])
    redis.call('PEXPIRE', KEYS[k], ARGV[i + 3]); k = k + 1; i = i + 4
  else
    redis.call('PUBLISH', ARGV[i + 1], ARGV[i + 2]); i = i + 3
  end
end
return 1
"""


class Codec:
    """Keys and messages of one proxy (``proxy_id``) in one store namespace."""

    def __init__(self, proxy_id: str, namespace: str) -> None:
        self.proxy_id = proxy_id
        self.namespace = namespace
        self.channel = f"{namespace}:events"

    def key(self, kind: Kind, *parts: str) -> str:
        """The key of ``kind`` named by ``parts``."""
        return ":".join((self.namespace, kind.value, *parts))

    def counter(self, name: str) -> str:
        """The key of a fleet-wide limit counter (docs/behaviour.md §12.1)."""
        return f"{self.namespace}:{name}"

    def prefix(self, kind: Kind) -> str:
        """What every key of ``kind`` starts with."""
        return self.key(kind, "")

    def message(self, kind: Kind, **fields: object) -> dict[str, Any]:
        return {"o": self.proxy_id, "t": kind.value, **fields}

    def script_args(self, ops: Sequence[Op]) -> tuple[list[str], list[Any]]:
        """:data:`WRITE_SCRIPT`'s keys and arguments for ``ops``: their messages go out as one."""
        keys: list[str] = []
        args: list[Any] = []
        messages: list[dict[str, Any]] = []
        for op in ops:
            if op[0] == "set":
                keys.append(op[1])
                args += ["s", op[2], max(1, int(op[3]))]
            elif op[0] == "keep":
                keys.append(op[1])
                args += ["k", op[2]]
            elif op[0] == "del":
                keys.append(op[1])
                args.append("d")
            elif op[0] == "hincr":
                keys.append(op[1])
                args += ["h", op[2], int(op[3]), max(1, int(op[4]))]
            else:
                messages.append(op[1])
        if messages:
            batch = messages[0] if len(messages) == 1 else self.message(Kind.BATCH, m=messages)
            args += ["p", self.channel, json.dumps(batch, separators=(",", ":"))]
        return keys, args

    def decode(self, raw: bytes | str) -> list[Message]:
        """A published message as the peers' messages it carries (a batch unpacked, each part
        with the batch's origin); none of this proxy's own, none of a kind it does not know.
        Raises ``ValueError`` (``json.JSONDecodeError``) on malformed JSON."""
        found = json.loads(raw)
        return self._messages(found, None)

    def _messages(self, found: Any, origin: str | None) -> list[Message]:
        if not isinstance(found, dict):
            return []
        sender = found.get("o", origin)
        if sender == self.proxy_id:
            return []
        try:
            kind = Kind(found.get("t"))
        except ValueError:
            return []
        if kind is not Kind.BATCH:
            return [Message(kind, sender if isinstance(sender, str) else None, found)]
        parts = found.get("m")
        inner = parts if isinstance(parts, list) else []
        return [m for part in inner for m in self._messages(part, sender)]


def sealer(secret: bytes | None) -> Callable[[bytes], bytes]:
    """HMAC-SHA-256 under ``secret``, or the digest itself without one."""
    if secret is None:
        return lambda digest: digest
    return lambda digest: hmac.new(secret, digest, hashlib.sha256).digest()


def text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def json_object(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, str | bytes):
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None
