# -*- test-case-name: tests.dialects.test_missing_route -*-
"""A 404 about a missing route told from a 404 about an unknown model, by its body
(docs/behaviour.md §17.3: a node whose ``/v1/messages`` route itself is missing is sent the
translation instead).

:func:`route_missing` is true for the bodies servers answer for a route they do not have:

===================================  ==========================================================
server                               body
===================================  ==========================================================
Ollama (Gin)                         ``404 page not found`` (text)
llama.cpp ``llama-server``           ``{"error": {"code": 404, "message": "File Not Found", …}}``
vLLM, SGLang, oMLX (FastAPI)         ``{"detail": "Not Found"}``
LM Studio                            ``{"error": "Unexpected endpoint or method. (POST …)"}``
===================================  ==========================================================

Every other 404 (``model "x" not found``, vLLM's ``The model `x` does not exist``, an empty
body) is about the model or unknown: the attempt moves on as for any stale answer (§6.1).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["route_missing"]

_TEXT = b"404 page not found"
_LMSTUDIO = "Unexpected endpoint or method."


def route_missing(body: bytes) -> bool:
    """Whether a 404's ``body`` says the route itself is missing (the table above)."""
    if body.strip() == _TEXT:
        return True
    try:
        doc: Any = json.loads(body)
    except (ValueError, RecursionError):
        return False
    if not isinstance(doc, dict):
        return False
    if doc.get("detail") == "Not Found":
        return True
    error = doc.get("error")
    if isinstance(error, dict):
        return error.get("message") == "File Not Found"
    return isinstance(error, str) and error.startswith(_LMSTUDIO)
