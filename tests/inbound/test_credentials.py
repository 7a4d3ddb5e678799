"""Where a request carries credentials (docs/behaviour.md §14.2): the one the proxy reads, and its
keys anywhere else refused (``nvpair_tw.inbound._credentials``); pure, on headers and queries."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest
from twisted.internet.address import IPv4Address
from twisted.web.http_headers import Headers

from nvpair_tw.inbound import LOCAL, IngressPolicy, Rejection, _credentials, parse_ingress
from nvpair_tw.inbound._credentials import MISPLACED, SEVERAL, credential, misplaced
from nvpair_tw.inbound._keys import CLEAN_VALUES, KeyBook, NamedKey

KEY = b"sk-proxy-key-0123"
PADDED = b"c2stcGFkZGVk="
"""A key ending in ``=`` (base64 padding), found after an item's first ``=``."""


def _book() -> KeyBook:
    """The proxy's keys: :data:`KEY` and :data:`PADDED` (built per use: a fresh clean cache)."""
    return KeyBook(
        tuple(NamedKey(hashlib.sha256(k).digest(), n) for n, k in (("a", KEY), ("b", PADDED)))
    )


def head(*pairs: tuple[str, str | bytes]) -> Headers:
    headers = Headers()
    for name, value in pairs:
        headers.addRawHeader(name.encode(), value if isinstance(value, bytes) else value.encode())
    return headers


def basic(user: bytes, password: bytes) -> str:
    return "Basic " + base64.b64encode(user + b":" + password).decode()


@pytest.mark.parametrize(
    ("headers", "query"),
    [
        ((("Api-Key", KEY),), b""),
        ((("Cookie", b"a=1; session=" + KEY),), b""),
        ((("X-Custom", b'token="' + KEY + b'"'),), b""),
        ((("Proxy-Authorization", b"Bearer " + KEY),), b""),
        ((("Authorization", basic(b"me", KEY)),), b""),
        ((("Authorization", basic(KEY, b"")),), b""),
        ((("Authorization", b"Bearer placeholder, Bearer " + KEY),), b""),
        ((("Authorization", b"Token " + KEY),), b""),
        ((("X-Api-Key", b"Bearer " + KEY),), b""),
        ((("X-Custom", b"k=" + PADDED),), b""),
        ((), b"key=" + KEY),
        ((), b"x=1&api_key=" + KEY + b"&y=2"),
        ((), KEY),
        ((), b"auth=Bearer%20" + KEY),
        ((), b"k=" + PADDED.replace(b"=", b"%3D")),
        ((("Authorization", b"Bearer " + KEY),), b"token=" + KEY),
    ],
)
def test_a_key_anywhere_but_where_the_proxy_reads_it_is_misplaced(
    headers: tuple[tuple[str, bytes | str], ...], query: bytes
) -> None:
    assert misplaced(head(*headers), query, _book()) is MISPLACED


@pytest.mark.parametrize(
    ("headers", "query"),
    [
        ((("Authorization", b"Bearer " + KEY),), b"x=1&key=mine"),
        ((("authorization", b"bearer   " + KEY + b" "),), b""),
        ((("X-Api-Key", b" " + KEY),), b""),
        ((("X-Api-Key", KEY), ("Authorization", b"Bearer " + KEY)), b""),
        ((("Authorization", basic(b"me", b"node-secret")),), b""),
        ((("Authorization", b'Digest username="a", realm="b", nonce="c"'),), b""),
        ((("User-Agent", "OpenAI/Python 1.40.0"), ("Accept", "*/*")), b"model=llama3"),
        ((("Authorization", "Basic not-base64!"),), b"%zz=%"),
        ((), b""),
    ],
)
def test_a_key_where_the_proxy_reads_it_and_everything_else_pass(
    headers: tuple[tuple[str, bytes | str], ...], query: bytes
) -> None:
    assert misplaced(head(*headers), query, _book()) is None


@pytest.mark.parametrize(
    "headers",
    [
        (("Authorization", "Bearer a"), ("Authorization", "Bearer b")),
        (("Authorization", "Bearer a, Bearer b"),),
        (("Authorization", "Bearer a b"),),
        (("Authorization", "Basic eA== eQ=="),),
        (("X-Api-Key", "a"), ("X-Api-Key", "b")),
    ],
)
def test_more_than_one_credential_is_refused(headers: tuple[tuple[str, str], ...]) -> None:
    """The proxy reads one credential; a node might read another (§14.2)."""
    assert misplaced(head(*headers), b"", _book()) is SEVERAL
    assert SEVERAL.status == MISPLACED.status == 400


def test_the_credential_read_is_x_api_key_then_the_first_bearer() -> None:
    assert credential(head(("X-Api-Key", " a "), ("Authorization", "Bearer b"))) == b"a"
    assert credential(head(("X-Api-Key", " "), ("Authorization", "BEARER  b "))) == b"b"
    assert credential(head(("Authorization", "Basic eA=="))) is None
    assert credential(Headers()) is None


def test_key_book_holds_its_keys_by_digest() -> None:
    book = KeyBook((NamedKey(hashlib.sha256(KEY).digest(), "a"),))
    assert book.holds(KEY) and not book.holds(KEY + b"x") and not KeyBook().holds(KEY)
    assert book.with_defaults([hashlib.sha256(PADDED).digest()]).holds(PADDED)


LOOP = IPv4Address("TCP", "127.0.0.1", 5000)
LAN = IPv4Address("TCP", "192.0.2.10", 5000)
OUTSIDE = IPv4Address("TCP", "198.51.100.1", 5000)


def gate(**environ: str) -> IngressPolicy:
    from twisted.internet.task import Clock

    return IngressPolicy.from_config(parse_ingress(environ), Clock(), hostname="studio")


def test_the_door_refuses_a_misplaced_key_from_any_caller_after_the_source_check() -> None:
    """Local and remote callers alike get 400; an outsider (outside the CIDRs) gets its 403 first,
    so it learns nothing about keys; without keys nothing is a key."""
    policy = gate(NVPAIR_PROXY_API_KEYS=KEY.decode(), NVPAIR_PROXY_ALLOWED_CIDRS="192.0.2.0/24")
    carried = head(("Api-Key", KEY), ("Host", "127.0.0.1"))
    assert policy.admit(LOOP, carried) is MISPLACED
    assert policy.admit(LAN, carried) is MISPLACED
    assert policy.admit(LAN, head(("Host", "a")), b"key=" + KEY) is MISPLACED
    outsider = policy.admit(OUTSIDE, carried)
    assert isinstance(outsider, Rejection) and outsider.code == "source-not-allowed"
    assert gate().admit(LOOP, carried) is LOCAL


def test_a_local_caller_may_send_its_own_credential_in_any_form(tmp_path: Path) -> None:
    policy = gate(NVPAIR_PROXY_API_KEYS=KEY.decode())
    own = head(("Authorization", basic(b"me", b"node-secret")), ("Api-Key", "azure-own"))
    assert policy.admit(LOOP, own, b"key=mine") is LOCAL


def test_a_value_found_clean_is_not_searched_again_and_the_memory_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Values every request repeats are searched once per key set; the values are not kept."""
    book = _book()
    searched: list[bytes] = []
    candidates = _credentials._candidates

    def counting(value: bytes) -> set[bytes]:
        searched.append(value)
        return candidates(value)

    monkeypatch.setattr(_credentials, "_candidates", counting)
    headers = head(("User-Agent", "OpenAI/Python 1.40.0"), ("Accept", "*/*"))
    assert misplaced(headers, b"", book) is None
    first = len(searched)
    assert first > 0 and misplaced(headers, b"", book) is None
    assert len(searched) == first
    assert all(isinstance(marker, int) for marker in book.clean)
    for n in range(CLEAN_VALUES + 5):
        misplaced(head(("X-Request-Id", f"r{n}")), b"", book)
    assert len(book.clean) <= CLEAN_VALUES
    assert misplaced(head(("Api-Key", KEY)), b"", book) is MISPLACED
    assert misplaced(head(("Api-Key", KEY)), b"", book) is MISPLACED  # never cached as clean
