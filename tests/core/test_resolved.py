# -*- test-case-name: tests.core.test_resolved -*-
"""The two timer settings: flag beats environment beats default, with docs/behaviour.md §6.3's warnings."""

from __future__ import annotations

import pytest

from nvpair_tw.core._resolved import (
    FIRST_BODY_ENV,
    RESPONSE_HEADER_ENV,
    Resolved,
    Settings,
    resolve_first_body_timeout,
    resolve_response_header_timeout,
)


def test_response_header_timeout_defaults_to_120_seconds() -> None:
    """No flag and no environment: 120 s, no warning."""
    assert resolve_response_header_timeout(None, {}) == Resolved(120.0, "default")


def test_response_header_timeout_from_the_flag() -> None:
    """A valid flag is used as given."""
    assert resolve_response_header_timeout("1m30s", {}) == Resolved(90.0, "flag")


def test_response_header_timeout_from_the_environment() -> None:
    """Without a flag, the environment variable is used and named as the source."""
    resolved = resolve_response_header_timeout(None, {RESPONSE_HEADER_ENV: "300ms"})
    assert resolved == Resolved(0.3, f"${RESPONSE_HEADER_ENV}")


def test_response_header_flag_beats_the_environment() -> None:
    """Flag and environment both set: the flag wins."""
    resolved = resolve_response_header_timeout("5s", {RESPONSE_HEADER_ENV: "50s"})
    assert resolved == Resolved(5.0, "flag")


@pytest.mark.parametrize("raw", ["0", "0s", "-1s", "soon", "", "15"])
def test_bad_response_header_flag_warns_and_uses_120_seconds(raw: str) -> None:
    """Zero, negative, unparseable or empty flags fall back to 120 s with a warning naming the flag."""
    resolved = resolve_response_header_timeout(raw, {})
    assert resolved.seconds == 120.0
    assert resolved.warning is not None
    assert "from flag" in resolved.warning
    assert repr(raw) in resolved.warning
    assert "120s" in resolved.warning


def test_bad_response_header_environment_warning_names_the_variable() -> None:
    """A bad environment value is reported with the variable's name, and 120 s is used."""
    resolved = resolve_response_header_timeout(None, {RESPONSE_HEADER_ENV: "-2m"})
    assert resolved.seconds == 120.0
    assert resolved.warning is not None
    assert RESPONSE_HEADER_ENV in resolved.warning
    assert "'-2m'" in resolved.warning


def test_bad_response_header_flag_is_not_rescued_by_the_environment() -> None:
    """The flag is what the operator asked for: a bad flag means 120 s, not the environment's value."""
    resolved = resolve_response_header_timeout("nope", {RESPONSE_HEADER_ENV: "5s"})
    assert resolved.seconds == 120.0
    assert resolved.warning is not None
    assert "from flag" in resolved.warning


def test_first_body_timeout_is_disabled_by_default() -> None:
    """No flag and no environment: 0 (disabled), no warning."""
    assert resolve_first_body_timeout(None, {}) == Resolved(0.0, "default")


def test_first_body_timeout_from_the_flag() -> None:
    """A valid flag enables the timer."""
    assert resolve_first_body_timeout("45s", {}) == Resolved(45.0, "flag")


def test_first_body_timeout_from_the_environment() -> None:
    """The environment can opt in."""
    resolved = resolve_first_body_timeout(None, {FIRST_BODY_ENV: "2m"})
    assert resolved == Resolved(120.0, f"${FIRST_BODY_ENV}")


def test_explicit_zero_flag_disables_an_environment_opt_in() -> None:
    """``--first-body-timeout 0`` beats ``NVPAIR_PROXY_FIRST_BODY_TIMEOUT=30s``, without a warning."""
    resolved = resolve_first_body_timeout("0", {FIRST_BODY_ENV: "30s"})
    assert resolved == Resolved(0.0, "flag")


def test_first_body_flag_beats_the_environment() -> None:
    """Both set: the flag's value is used."""
    assert resolve_first_body_timeout("1s", {FIRST_BODY_ENV: "30s"}).seconds == 1.0


@pytest.mark.parametrize("raw", ["-1s", "later", "", "10"])
def test_bad_first_body_flag_leaves_it_disabled_with_a_warning(raw: str) -> None:
    """Invalid or negative flags leave the timer off and warn, naming the flag."""
    resolved = resolve_first_body_timeout(raw, {})
    assert resolved.seconds == 0.0
    assert resolved.warning is not None
    assert "from flag" in resolved.warning
    assert "disabled" in resolved.warning


def test_bad_first_body_environment_warning_names_the_variable() -> None:
    """A negative environment value leaves the timer off; the warning names the variable."""
    resolved = resolve_first_body_timeout(None, {FIRST_BODY_ENV: "-5s"})
    assert resolved.seconds == 0.0
    assert resolved.warning is not None
    assert FIRST_BODY_ENV in resolved.warning


def test_the_two_settings_are_independent() -> None:
    """Each timer reads only its own variable: one set leaves the other at its default."""
    header_only = {RESPONSE_HEADER_ENV: "7s"}
    first_only = {FIRST_BODY_ENV: "9s"}
    assert resolve_first_body_timeout(None, header_only) == Resolved(0.0, "default")
    assert resolve_response_header_timeout(None, first_only) == Resolved(120.0, "default")
    both = {RESPONSE_HEADER_ENV: "7s", FIRST_BODY_ENV: "9s"}
    assert resolve_response_header_timeout(None, both).seconds == 7.0
    assert resolve_first_body_timeout(None, both).seconds == 9.0


def test_the_cooldown_is_one_response_header_timeout() -> None:
    """A stalled node cools for exactly the response-header timeout (docs/behaviour.md §6.3)."""
    assert Settings(response_header_timeout=42.0).cooldown == 42.0
