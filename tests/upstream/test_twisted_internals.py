"""Guards on Twisted's private names the upstream hop relies on: each test fails when the
internal changes shape, before the proxy's behaviour silently does.

``twisted.web.http._DataLoss`` (also ``twisted.web._newclient._DataLoss``): the native client ends
a cut body as Twisted's own client does, ``ResponseFailed([reason, _DataLoss])``, built in one
place, :func:`nvpair_tw.upstream._protocol.cut_body`.
"""

from __future__ import annotations

import ast
from pathlib import Path

from twisted.internet.error import ConnectionLost
from twisted.python.failure import Failure
from twisted.web import _newclient, http
from twisted.web.client import ResponseDone, ResponseFailed

import nvpair_tw
from nvpair_tw.corridor._attempts import classify_failure
from nvpair_tw.events import AttemptOutcome
from nvpair_tw.upstream import TRANSPORT_FAILURES, describe_failure, is_cancellation
from nvpair_tw.upstream._protocol import cut_body


def test_data_loss_exists_and_is_the_class_twisted_s_client_raises() -> None:
    assert isinstance(http._DataLoss, type)
    assert vars(_newclient)["_DataLoss"] is http._DataLoss


def test_data_loss_is_a_plain_exception_not_a_clean_ending() -> None:
    """An ``Exception`` (a ``Failure`` can hold it), and neither ``ResponseDone`` nor
    ``PotentialDataLoss``: the body gates read those as a complete body."""
    assert issubclass(http._DataLoss, Exception)
    assert not issubclass(http._DataLoss, (ResponseDone, http.PotentialDataLoss))


def test_data_loss_takes_no_arguments() -> None:
    """``cut_body`` builds it as ``_DataLoss()``."""
    assert Failure(http._DataLoss()).check(http._DataLoss)


def test_a_cut_body_is_classified_as_today() -> None:
    """``ResponseFailed([reason, _DataLoss])``: a dropped attempt, not a cancellation, not a clean
    end; its description names the reason."""
    reason = Failure(ConnectionLost("gone"))
    cut = cut_body(reason)
    assert cut.check(ResponseFailed)
    assert isinstance(cut.value, ResponseFailed)
    first, second = cut.value.reasons
    assert first is reason and second.check(http._DataLoss)
    assert cut.check(ResponseDone, http.PotentialDataLoss) is None
    assert cut.check(*TRANSPORT_FAILURES)
    assert not is_cancellation(cut)
    assert classify_failure(cut, None) is AttemptOutcome.DROPPED
    assert "gone" in describe_failure(cut)


def test_data_loss_is_built_in_one_place() -> None:
    """Only ``cut_body`` names ``_DataLoss`` in the package."""
    root = Path(nvpair_tw.__file__).parent
    users = sorted(
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if any(
            isinstance(node, ast.Name) and node.id == "_DataLoss"
            for node in ast.walk(ast.parse(path.read_text()))
        )
    )
    assert users == ["upstream/_protocol.py"]
    source = (root / "upstream" / "_protocol.py").read_text()
    assert source.count("_DataLoss()") == 1
