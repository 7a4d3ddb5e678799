# -*- test-case-name: tests.upstream.test_protocol -*-
"""The one error every state machine of the proxy raises on an illegal call.

The node client's protocol and responses, the body gate and the WebSocket tunnel each name their
states in an ``Enum`` and refuse a method called in a state where it makes no sense. Such a call is
a bug in the caller, never a condition of the network, so it is one type: :class:`IllegalCall`.
"""

from __future__ import annotations

__all__ = ["IllegalCall"]


class IllegalCall(Exception):
    """A method of a state machine was called in a state where it is illegal (a bug in the caller).

    The message names the machine, the method and the state it was in.
    """
