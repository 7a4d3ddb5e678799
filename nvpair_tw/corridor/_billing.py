# -*- test-case-name: tests.corridor.test_conversations -*-
"""Claude Code's billing block left out of what a node receives (docs/behaviour.md §5.3, §14.1).

Claude Code (2.1.36 and later) opens ``system`` with an ``x-anthropic-billing-header: …; cch=…``
block whose value changes on every request: an engine's prefix cache then matches nothing past it.
Unless ``--billing-block keep``, the block is removed from the checked body where its outline
says (the one parse of §14.1 is not repeated), and from the parsed value a translation reads, so
the node receives one body, whatever its dialect.
"""

from __future__ import annotations

import json
from typing import Any

from nvpair_tw.core import Outline, Outlined, set_members
from nvpair_tw.selection import is_billing_block

__all__ = ["without_billing"]


def without_billing(
    body: bytes, outline: Outline | None, parsed: dict[str, Any] | None
) -> tuple[bytes, Outline | None, dict[str, Any] | None]:
    """The body, its outline and its parsed value without a billing block in ``system`` (the
    same objects when it holds none, or when the body has no outline to edit: nothing is made
    then)."""
    if outline is None or parsed is None:
        return body, outline, parsed
    system = parsed.get("system")
    if not isinstance(system, list) or not any(is_billing_block(b) for b in system):
        return body, outline, parsed
    kept = [block for block in system if not is_billing_block(block)]
    value = json.dumps(kept, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    edited = set_members(Outlined(body, outline), {"system": lambda _old: value})
    return edited.body, edited.outline, {**parsed, "system": kept}
