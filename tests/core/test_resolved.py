# -*- test-case-name: tests.core.test_resolved -*-
"""The two timer settings: flag beats environment beats default; a bad value is refused by the one
duration rule (docs/behaviour.md §6.3), naming the flag or the variable."""

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
    """No flag and no environment: 120 s."""
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


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("0", "'0' must be more than zero; write 5s, 2m or 1m30s"),
        ("0s", "'0s' must be more than zero; write 5s, 2m or 1m30s"),
        ("-1s", "'-1s' must be more than zero; write 5s, 2m or 1m30s"),
        ("soon", "'soon' is not a duration; write 5s, 2m or 1m30s"),
        ("", "'' is not a duration; write 5s, 2m or 1m30s"),
        ("5", "'5' is not a duration; write 5s, 2m or 1m30s"),
        ("15", "'15' is not a duration; write 15s, 2m or 1m30s"),
        ("5x", "'5x' is not a duration; write 5s, 2m or 1m30s"),
    ],
)
def test_a_bad_response_header_flag_is_refused_naming_the_flag(raw: str, why: str) -> None:
    """Zero, negative, unparseable, unitless or empty: refused with the hint, never 120 s."""
    with pytest.raises(ValueError) as raised:
        resolve_response_header_timeout(raw, {})
    assert str(raised.value) == f"--response-header-timeout: {why}"


def test_a_bad_response_header_environment_value_is_refused_naming_the_variable() -> None:
    """A bad ``NVPAIR_PROXY_RESPONSE_HEADER_TIMEOUT`` is refused in the same sentence shape."""
    with pytest.raises(ValueError) as raised:
        resolve_response_header_timeout(None, {RESPONSE_HEADER_ENV: "5"})
    assert str(raised.value) == (
        f"{RESPONSE_HEADER_ENV}: '5' is not a duration; write 5s, 2m or 1m30s"
    )


def test_a_bad_response_header_flag_is_not_rescued_by_the_environment() -> None:
    """The flag is what the operator asked for: a bad flag is refused, whatever the environment."""
    with pytest.raises(ValueError, match=r"^--response-header-timeout: 'nope'"):
        resolve_response_header_timeout("nope", {RESPONSE_HEADER_ENV: "5s"})


def test_the_flag_wins_over_a_bad_environment_value() -> None:
    """Only the value in force is read: a good flag makes the variable irrelevant."""
    resolved = resolve_response_header_timeout("5s", {RESPONSE_HEADER_ENV: "5"})
    assert resolved == Resolved(5.0, "flag")


def test_first_body_timeout_is_disabled_by_default() -> None:
    """No flag and no environment: 0 (disabled)."""
    assert resolve_first_body_timeout(None, {}) == Resolved(0.0, "default")


def test_first_body_timeout_from_the_flag() -> None:
    """A valid flag enables the timer."""
    assert resolve_first_body_timeout("45s", {}) == Resolved(45.0, "flag")


def test_first_body_timeout_from_the_environment() -> None:
    """The environment can opt in."""
    resolved = resolve_first_body_timeout(None, {FIRST_BODY_ENV: "2m"})
    assert resolved == Resolved(120.0, f"${FIRST_BODY_ENV}")


def test_explicit_zero_flag_disables_an_environment_opt_in() -> None:
    """``--first-body-timeout 0`` beats ``NVPAIR_PROXY_FIRST_BODY_TIMEOUT=30s``."""
    resolved = resolve_first_body_timeout("0", {FIRST_BODY_ENV: "30s"})
    assert resolved == Resolved(0.0, "flag")


def test_first_body_flag_beats_the_environment() -> None:
    """Both set: the flag's value is used."""
    assert resolve_first_body_timeout("1s", {FIRST_BODY_ENV: "30s"}).seconds == 1.0


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("-1s", "'-1s' must be zero or more; write 5s, 2m or 1m30s"),
        ("later", "'later' is not a duration; write 5s, 2m or 1m30s"),
        ("", "'' is not a duration; write 5s, 2m or 1m30s"),
        ("10", "'10' is not a duration; write 10s, 2m or 1m30s"),
    ],
)
def test_a_bad_first_body_flag_is_refused_naming_the_flag(raw: str, why: str) -> None:
    """Invalid, unitless or negative: refused with the hint, never left silently off."""
    with pytest.raises(ValueError) as raised:
        resolve_first_body_timeout(raw, {})
    assert str(raised.value) == f"--first-body-timeout: {why}"


def test_a_bad_first_body_environment_value_is_refused_naming_the_variable() -> None:
    """A negative ``NVPAIR_PROXY_FIRST_BODY_TIMEOUT`` is refused, the variable named."""
    with pytest.raises(ValueError) as raised:
        resolve_first_body_timeout(None, {FIRST_BODY_ENV: "-5s"})
    assert str(raised.value) == (
        f"{FIRST_BODY_ENV}: '-5s' must be zero or more; write 5s, 2m or 1m30s"
    )


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
