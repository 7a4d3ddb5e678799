# -*- test-case-name: tests.simulated.test_kinds -*-
"""The frames of a healthy inference answer from a simulated engine of one kind: Ollama's own
routes as :mod:`~nvpair_tw.simulated._ollama_replies` answers them, OpenAI-style routes as
:mod:`~nvpair_tw.simulated._openai_replies` does (LM Studio's ``/api/v0/`` whole answers with
``stats``, ``model_info`` and ``runtime``), anything else (``/api/show``, a pull,
``/v1/responses``) as :func:`~nvpair_tw.simulated._replies.reply_frames`."""

from __future__ import annotations

from nvpair_tw.simulated._asked import Asked
from nvpair_tw.simulated._kinds import lmstudio_facts
from nvpair_tw.simulated._ollama_replies import ollama_frames
from nvpair_tw.simulated._openai_replies import STYLES, Style, lmstudio_extras, openai_frames
from nvpair_tw.simulated._replies import reply_frames

__all__ = ["kind_frames"]


def kind_frames(kind: str, asked: Asked, context_length: int, response_id: str) -> list[bytes]:
    """The frames an engine of ``kind`` answers ``asked`` with.

    :param kind: the engine's kind.
    :param asked: the request.
    :param context_length: the model's context length (LM Studio's ``model_info``).
    :param response_id: the id of a ``/v1/responses`` answer.
    """
    path = asked.path
    frames: list[bytes] | None
    if path.startswith(b"/api/") and not path.startswith((b"/api/v0/", b"/api/v1/")):
        frames = ollama_frames(asked)
    elif kind == "lmstudio" and path.startswith(b"/api/v0/"):
        facts = lmstudio_facts(asked.model, context_length)
        frames = openai_frames(asked, lmstudio_extras(asked, facts))
    else:
        frames = openai_frames(asked, style=STYLES.get(kind, Style()))
    if frames is not None:
        return frames
    return reply_frames(path, asked.streaming, asked.chunks, asked.text, response_id=response_id)
