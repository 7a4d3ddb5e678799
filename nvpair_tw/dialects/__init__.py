"""Translation between client dialects and node dialects (docs/behaviour.md §11.3, §11.4): pure functions and
transducers, no reactor and no I/O.

- :func:`translate` turns an Ollama (``/api/chat``, ``/api/generate``, ``/api/embed``,
  ``/api/embeddings``) or LM Studio ``/api/v0`` request into an OpenAI-compatible one, a
  :class:`Translation` whose :meth:`~Translation.answer` gives, per attempt, a
  :class:`Transducer` turning the node's answer back into the client's dialect;
  :func:`untranslatable_field` says beforehand which field (if any) forbids it.
- Anthropic Messages (``/v1/messages``, :data:`MESSAGES_PATH`) is one of the translated routes
  (§17.3); :func:`route_missing` tells a 404 about a missing route from one about an unknown model.
- :func:`rename_request` and :func:`renamer` carry one model's many names on native routes.
- :class:`ModelFacts`, :func:`facts_from`, :func:`record_for` and :func:`show_answer` synthesise
  model-list records in a facade's shape from what a node of another kind reports.

The request table and the dropped fields are in ``_requests``'s docstring, the answers in
``_answers``'s and ``_ollama_stream``'s, the renaming rule in ``_rename``'s, the model lists in
``_models``'s.
"""

from __future__ import annotations

from nvpair_tw.dialects._common import (
    AnswerTooLarge,
    MalformedAnswer,
    StreamCut,
    Transducer,
    Untranslatable,
)
from nvpair_tw.dialects._json import rename_outlined, rename_request
from nvpair_tw.dialects._messages_request import MESSAGES_PATH
from nvpair_tw.dialects._missing_route import route_missing
from nvpair_tw.dialects._models import (
    ModelFacts,
    client_fields,
    facts_from,
    record_for,
    show_answer,
)
from nvpair_tw.dialects._rename import renamer
from nvpair_tw.dialects._synthesis import SYNTHESISED_ROUTES, synthesis
from nvpair_tw.dialects._translate import (
    TRANSLATED_ROUTES,
    Translation,
    translate,
    untranslatable_field,
)
from nvpair_tw.dialects._usage import Chain, Usage, UsageMeter, UsageStripper, asks_usage

__all__ = [
    "MESSAGES_PATH",
    "SYNTHESISED_ROUTES",
    "TRANSLATED_ROUTES",
    "AnswerTooLarge",
    "Chain",
    "MalformedAnswer",
    "ModelFacts",
    "StreamCut",
    "Transducer",
    "Translation",
    "Untranslatable",
    "Usage",
    "UsageMeter",
    "UsageStripper",
    "asks_usage",
    "client_fields",
    "facts_from",
    "record_for",
    "rename_outlined",
    "rename_request",
    "renamer",
    "route_missing",
    "show_answer",
    "synthesis",
    "translate",
    "untranslatable_field",
]
