# -*- test-case-name: tests.core.test_states -*-
"""The Enum the request path's dicts are keyed by: members hashed by identity, in C."""

from __future__ import annotations

import copy
import pickle

import pytest

from nvpair_tw.core import IdentityEnum
from nvpair_tw.events import AttemptOutcome, Phase, WorkloadState


class _Light(IdentityEnum):
    RED = "red"
    GREEN = "green"


def test_a_member_keys_a_dict_and_a_set_as_itself() -> None:
    """A member is found by itself, survives a copy and a pickle as itself, and is never equal
    to its value."""
    table = {(_Light.RED, int): "stop", (_Light.GREEN, int): "go"}
    assert table[(_Light.RED, int)] == "stop"
    assert _Light.GREEN in frozenset({_Light.GREEN})
    assert copy.deepcopy(_Light.RED) is _Light.RED
    assert pickle.loads(pickle.dumps(Phase.STREAMING)) is Phase.STREAMING
    value: object = "red"
    assert value != _Light.RED
    assert hash(_Light.RED) == hash(_Light.RED)


@pytest.mark.parametrize("kind", [Phase, WorkloadState, AttemptOutcome])
def test_the_enums_on_the_request_path_hash_in_c(kind: type[IdentityEnum]) -> None:
    """The exchange's phases, a workload's states and an attempt's outcomes key dicts on every
    request: their hash is object's, not ``Enum``'s Python one."""
    assert issubclass(kind, IdentityEnum)
    hashed: object = kind.__hash__
    assert hashed is object.__hash__
