# -*- test-case-name: tests.upstream.test_protocol, tests.core.test_states -*-
"""The one error every state machine of the proxy raises on an illegal call, and the ``Enum`` its
transition tables are keyed by.

The node client's protocol and responses, the body gate and the WebSocket tunnel each name their
states in an ``Enum`` and refuse a method called in a state where it makes no sense. Such a call is
a bug in the caller, never a condition of the network, so it is one type: :class:`IllegalCall`.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["IdentityEnum", "IllegalCall"]


class IdentityEnum(Enum):
    """An ``Enum`` whose members hash by identity, in C: for the enums that key a dict on the
    request path (a transition table, a phase, a verdict). ``Enum``'s own ``__hash__`` is Python
    code hashing the member's name, a function call for every lookup (Python 3.11); members are
    singletons and compare by identity, so an identity hash is as right and costs nothing."""

    __hash__ = object.__hash__


class IllegalCall(Exception):
    """A method of a state machine was called in a state where it is illegal (a bug in the caller).

    The message names the machine, the method and the state it was in.
    """
