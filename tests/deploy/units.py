"""Reading the shipped service definitions as their service managers do: a systemd unit's
sections (continuation lines joined, repeated keys kept), its EnvironmentFile, and ExecStart's
command line with the environment and specifiers put in."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "docs" / "deploy"

Unit = dict[str, dict[str, list[str]]]


def read_unit(path: Path) -> Unit:
    """``{section: {key: [values, in order]}}``."""
    unit: Unit = {}
    section: dict[str, list[str]] = {}
    text = re.sub(r"\\\n", " ", path.read_text())
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        section.setdefault(key.strip(), []).append(value.strip())
    return unit


def read_environment_file(path: Path) -> dict[str, str]:
    """``KEY=value`` lines (no quoting, no expansion), comments and blank lines skipped."""
    pairs = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


def command_line(text: str, environ: Mapping[str, str], specifiers: Mapping[str, str]) -> list[str]:
    """ExecStart's words: ``%X`` specifiers replaced, ``${VAR}`` as one word, a bare ``$VAR``
    word split on white space (systemd.service(5), "Command lines")."""
    for specifier, value in specifiers.items():
        text = text.replace(f"%{specifier}", value)
    words = []
    for word in shlex.split(text):
        bare = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if bare:
            words += environ.get(bare.group(1), "").split()
            continue
        words.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: environ[m.group(1)], word))
    return words
