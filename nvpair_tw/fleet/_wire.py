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
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["WRITE_SCRIPT", "Codec", "Command", "Op", "json_object", "sealer", "text"]

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

    def key(self, *parts: str) -> str:
        return ":".join((self.namespace, *parts))

    def prefix(self, kind: str) -> str:
        """What every key of ``kind`` starts with."""
        return self.key(kind, "")

    def message(self, kind: str, **fields: object) -> dict[str, Any]:
        return {"o": self.proxy_id, "t": kind, **fields}

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
            batch = messages[0] if len(messages) == 1 else self.message("batch", m=messages)
            args += ["p", self.channel, json.dumps(batch, separators=(",", ":"))]
        return keys, args

    def decode(self, raw: bytes | str) -> list[dict[str, Any]]:
        """A published message as the peers' messages it carries (a batch unpacked, each part
        with the batch's origin); none of this proxy's own. Raises on malformed JSON."""
        message = json.loads(raw)
        if not isinstance(message, dict) or message.get("o") == self.proxy_id:
            return []
        if message.get("t") == "batch" and isinstance(message.get("m"), list):
            origin = message.get("o")
            parts = [{**inner, "o": origin} for inner in message["m"] if isinstance(inner, dict)]
            return [part for inner in parts for part in self.decode(json.dumps(inner))]
        return [message]


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
