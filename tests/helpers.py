"""Helpers the test modules share, each written once: a bounded wait for a condition on the running
reactor, and the Ollama chat request most tests send.

``eventually`` is the only poll of the suite's reactor tests: every wait for something that has no
event of its own to await ends, failing the test with what it waited for, after ``within`` seconds
of the reactor's time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater

POLL_INTERVAL = 0.005
"""Seconds between two looks at the condition."""


class NotReached(AssertionError):
    """``eventually``'s condition did not hold within its bound."""


async def eventually(
    reactor: IReactorTime,
    check: Callable[[], object],
    within: float = 10.0,
    what: str = "condition",
) -> None:
    """Look at ``check()`` every ``POLL_INTERVAL`` seconds until it is true; raise ``NotReached``
    naming ``what`` once ``within`` seconds of ``reactor`` time have passed without it."""
    deadline = reactor.seconds() + within
    while not check():
        if reactor.seconds() >= deadline:
            raise NotReached(f"{what} not reached within {within:g} s")
        await deferLater(reactor, POLL_INTERVAL, lambda: None)


def chat(model: str, *texts: str, **fields: Any) -> dict[str, Any]:
    """An Ollama ``/api/chat`` request document: ``model``, the ``texts`` as messages taking turns
    (user, assistant, user, …; one user ``"hi"`` when none is given), then ``fields``."""
    said = texts or ("hi",)
    roles = ("user", "assistant")
    messages = [{"role": roles[i % 2], "content": text} for i, text in enumerate(said)]
    return {"model": model, "messages": messages, **fields}


def chat_body(model: str, *texts: str, **fields: Any) -> bytes:
    """:func:`chat` as the bytes of a request body."""
    return json.dumps(chat(model, *texts, **fields)).encode()
