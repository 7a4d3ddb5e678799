"""One docstring markup: reST (``:class:``, ``:meth:``, ``:ivar x:``, ``:param x:``), never
epytext (``@ivar``, ``@param``, ``L{...}``, ``C{...}``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nvpair_tw

PACKAGE = Path(nvpair_tw.__file__).parent
PROJECT = PACKAGE.parent  # the checkout: the package lives at its top

# Epytext: a field at the start of a line, or an inline markup letter and brace.
EPYTEXT = re.compile(
    r"(?m)^\s*@(param|ivar|cvar|var|type|return|returns|rtype|raise|raises|keyword|note|see)\b"
    r"|\b[LCIBU]\{"
)

# Modules still in epytext: strict, so each entry goes once its module is converted (or gone).
# Empty: the node client's parts were written in reST.
PENDING: set[str] = set()


def _docstrings(path: Path) -> list[tuple[int, str]]:
    """Every docstring of ``path``: modules, classes, functions, and the string statements that
    document an attribute or an enum member."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            found.append((node.lineno, node.value.value))
    return found


def _epytext(path: Path) -> list[str]:
    return [
        f"{path.relative_to(PROJECT)}:{line}: {match.group(0).strip()}"
        for line, text in _docstrings(path)
        for match in EPYTEXT.finditer(text)
    ]


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_the_pattern_finds_epytext_and_not_rest() -> None:
    """The check itself: it sees each epytext form and none of the reST ones."""
    for epytext in (
        "@ivar x: y",
        "  @param x: y",
        "@type x: int",
        "@return: y",
        "L{Node}",
        "C{b''}",
    ):
        assert EPYTEXT.search(epytext), epytext
    for rest in (":ivar x: y", ":param x: y", ":class:`Node`", "``b''``", "ABC{x}", "a @ b"):
        assert not EPYTEXT.search(rest), rest


def test_no_docstring_uses_epytext() -> None:
    """Every docstring under ``nvpair_tw`` (but the pending modules) is reST."""
    modules = [p for p in _modules() if str(p.relative_to(PROJECT)) not in PENDING]
    found = [hit for path in modules for hit in _epytext(path)]
    assert len(modules) > 70 and found == []


def test_pending_modules_are_still_epytext() -> None:
    """Strict: a pending module that is converted (or gone) leaves :data:`PENDING`."""
    for pending in sorted(PENDING):
        path = PROJECT / pending
        assert path.exists(), f"{pending} is gone: remove it from PENDING"
        assert _epytext(path), f"{pending} is reST now: remove it from PENDING"


HEADER = re.compile(r"\A# -\*- test-case-name: (?P<names>[^*]+?) -\*-")


def test_every_test_case_name_header_names_test_modules_that_exist() -> None:
    """A module's ``test-case-name`` header names its tests; each named module exists."""
    missing = []
    for path in _modules():
        found = HEADER.match(path.read_text())
        for name in found.group("names").split(",") if found else []:
            module = PROJECT / (name.strip().replace(".", "/") + ".py")
            if name.strip() and not module.is_file():
                missing.append(f"{path.relative_to(PROJECT)}: {name.strip()}")
    assert missing == []


def test_code_cites_the_behaviour_document_not_a_spec_outside_the_repository() -> None:
    """Sections are cited as ``docs/behaviour.md §N``; "SPEC" names nothing a reader has."""
    citing = [
        f"{path.relative_to(PROJECT)}:{number}"
        for path in [*_modules(), *sorted((PROJECT / "tests").rglob("*.py"))]
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bSPEC\s*§", line)
    ]
    assert citing == []
