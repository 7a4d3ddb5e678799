"""The commands a Markdown document shows, read the way a person reads them (not a test module).

A document *shows* a command in two ways: every line of a fenced block whose language is a shell
(``sh``, ``bash``, ``shell``, ``console``; a line ending in ``\\``, or inside an open quote,
continues on the next, a ``$ `` prompt is dropped), and an inline code span whose first word is a program (:data:`PROGRAMS`, or a
path such as ``.ci/run``) followed by at least one argument, or that is a repository script on its
own. ``tests/e2e/test_readme.py`` runs what the README shows; ``tests/e2e/test_shown.py`` pins
these rules.

Also here: the ``twistd ... nvpair`` option names a document uses, and the tox environments a
``tox -e NAME`` command names.
"""

from __future__ import annotations

import itertools
import re
import shlex

__all__ = [
    "PROGRAMS",
    "SHELLS",
    "fenced_commands",
    "inline_commands",
    "nvpair_options",
    "option_mentions",
    "shown_commands",
    "tox_environments",
]

SHELLS = frozenset({"sh", "bash", "shell", "console"})
"""Fence languages whose lines are commands."""

PROGRAMS = frozenset(
    {
        "curl", "docker", "git", "launchctl", "mypy", "nvpair", "nvpair-ctl", "ollama", "pip",
        "pip3", "pipx", "python", "python3", "ruff", "socat", "sudo", "systemctl", "tox", "twist",
        "twistd", "uv",
    }
)  # fmt: skip
"""Words that start a command in an inline code span (a console command the package installs
belongs here too)."""

_FENCE = re.compile(
    r"^(?P<ticks>`{3,}|~{3,})(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=ticks)[ \t]*$", re.M | re.S
)
_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
_OPTION = re.compile(r"^--[a-z][a-z0-9-]*")


def fenced_commands(text: str) -> list[str]:
    """Every command of every shell-language fenced block, in order, whitespace as written
    (continuation lines joined with one space)."""
    found: list[str] = []
    for fence in _FENCE.finditer(text):
        language = fence["info"].strip().split(" ")[0].lower()
        if language not in SHELLS:
            continue
        pending = ""
        for raw in fence["body"].splitlines():
            line = raw.strip()
            if not pending and line.startswith("$ "):
                line = line[2:]
            if not pending and (not line or line.startswith("#")):
                continue
            if line.endswith("\\"):
                pending += line[:-1].rstrip() + " "
            elif _open_quote(pending + line):
                pending += line + " "
            else:
                found.append(pending + line)
                pending = ""
        if pending:
            found.append(pending.rstrip())
    return found


def _open_quote(command: str) -> bool:
    """Whether ``command`` ends inside a quoted string (the shell reads on)."""
    try:
        shlex.split(command)
    except ValueError:
        return True
    return False


def inline_commands(text: str) -> list[str]:
    """Every inline code span (outside fenced blocks) that is a command, whitespace collapsed."""
    prose = _FENCE.sub("", text)
    found = []
    for match in _SPAN.finditer(prose):
        span = " ".join(match.group(2).split())
        words = span.split(" ")
        script = words[0].startswith(("./", ".ci/", "tools/", "bin/"))
        if script or (words[0] in PROGRAMS and len(words) > 1):
            found.append(span)
    return found


def shown_commands(text: str) -> list[str]:
    """Every command ``text`` shows, fenced ones first, each once."""
    return list(dict.fromkeys([*fenced_commands(text), *inline_commands(text)]))


def nvpair_options(command: str) -> list[str]:
    """The long option names (``--name``, without ``=value``) given to the ``nvpair`` plugin in a
    ``twistd``/``twist`` command line (twistd's own options before ``nvpair`` are not; a command
    joined with ``&&`` is read part by part); ``[]`` when it runs no ``nvpair``."""
    names: list[str] = []
    for part in command.split("&&"):
        words = shlex.split(part, comments=True)
        if not words or words[0].rsplit("/", 1)[-1] not in ("twistd", "twist"):
            continue
        if "nvpair" not in words:
            continue
        after = words[words.index("nvpair") + 1 :]
        names += [m.group(0)[2:] for w in after if (m := _OPTION.match(w))]
    return names


def option_mentions(text: str) -> list[str]:
    """The long option names of every inline code span that starts with one (``--nodes FILE``,
    ``--engine {ollama,...}``), and of every ``nvpair`` command the text shows."""
    prose = _FENCE.sub("", text)
    names = [
        m.group(0)[2:]
        for span in _SPAN.finditer(prose)
        if (m := _OPTION.match(span.group(2).strip()))
    ]
    for command in [*fenced_commands(text), *_unfenced_nvpair(text), *inline_commands(text)]:
        names += nvpair_options(command)
    return list(dict.fromkeys(names))


def _unfenced_nvpair(text: str) -> list[str]:
    """``twistd ... nvpair`` commands in fenced blocks without a shell language (a plain ``` ```
    block is how several documents show one)."""
    found = []
    for fence in _FENCE.finditer(text):
        if fence["info"].strip().split(" ")[0].lower() in SHELLS:
            continue
        joined = re.sub(r"\\\n\s*", " ", fence["body"])
        found += [line.strip() for line in joined.splitlines() if " nvpair" in line]
    return found


def tox_environments(command: str) -> list[str]:
    """The environments ``tox -e A,B`` names (``[]`` for a plain ``tox`` or another command)."""
    words = shlex.split(command)
    if not words or words[0] != "tox":
        return []
    names: list[str] = []
    for flag, value in itertools.pairwise(words):
        if flag == "-e":
            names += value.split(",")
    return names
