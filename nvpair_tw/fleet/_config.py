# -*- test-case-name: tests.fleet.test_store -*-
"""Where the fleet store is (``--state redis://…``) and the secrets to talk to it (docs/behaviour.md §6.6).

:class:`StateConfig` never shows the password or the secret; :meth:`StateConfig.redact` takes the
password out of any text before it is logged.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from attrs import field, frozen

__all__ = ["StateConfig", "parse_state_url", "read_secret"]


@frozen
class StateConfig:
    """Where the fleet store is and how to talk to it; ``repr`` and ``str`` never show secrets."""

    host: str
    port: int = 6379
    db: int = 0
    password: str | None = field(default=None, repr=False)
    secret: bytes | None = field(default=None, repr=False)
    namespace: str = "nvpair"

    def __str__(self) -> str:
        auth = ":***@" if self.password else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"redis://{auth}{host}:{self.port}/{self.db}"

    def redact(self, text: str) -> str:
        """``text`` with the password (if any) replaced by ``***``."""
        return text.replace(self.password, "***") if self.password else text


def parse_state_url(
    url: str, *, password: str | None = None, secret: bytes | None = None
) -> StateConfig:
    """``redis://[:PASSWORD@]HOST[:PORT][/DB]`` as a :class:`StateConfig`.

    ``password`` (from ``--state-password-file``) wins over one in the URL. A ValueError's message
    never contains the password.
    """
    try:
        parts = urlsplit(url)
        port = parts.port or 6379
        host = parts.hostname
    except ValueError:
        raise ValueError("--state must look like redis://HOST:PORT/DB") from None
    if parts.scheme != "redis" or not host:
        raise ValueError("--state must look like redis://HOST:PORT/DB")
    path = parts.path.strip("/") or "0"
    if not path.isdigit():
        raise ValueError("--state: the database must be a number, as in redis://HOST:PORT/0")
    given = unquote(parts.password) if parts.password else None
    return StateConfig(
        host=host,
        port=port,
        db=int(path),
        password=password if password is not None else given,
        secret=secret,
    )


def read_secret(path: str) -> bytes:
    """A secret or password file's content without its trailing newline (never logged)."""
    with open(path, "rb") as handle:
        content = handle.read().rstrip(b"\r\n")
    if not content:
        raise ValueError(f"{path} is empty")
    return content
