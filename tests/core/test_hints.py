# -*- test-case-name: tests.core.test_hints -*-
"""The closest valid name, for "did you mean" hints."""

from __future__ import annotations

from nvpair_tw.core._hints import did_you_mean


def test_a_close_name_is_offered_quoted() -> None:
    """A typo of a field gets the field, quoted."""
    assert did_you_mean("ulr", ["id", "url", "models"]) == "; did you mean 'url'?"


def test_a_flag_is_offered_in_its_own_form() -> None:
    """``shown`` formats the choice, e.g. as a flag."""
    assert did_you_mean("ndoes", ["node", "nodes"], "--{}") == "; did you mean --nodes?"


def test_nothing_close_offers_nothing() -> None:
    """A name like none of the choices gets no hint (the caller says what else to do)."""
    assert did_you_mean("vllm", ["ollama", "lmstudio", "omlx", "openai"]) == ""
