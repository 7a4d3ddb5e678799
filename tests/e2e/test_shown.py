"""How ``tests/e2e/shown.py`` reads the commands a Markdown document shows (what the README test
runs and what it checks against ``twistd nvpair``'s options)."""

from __future__ import annotations

import pytest

from tests.e2e.shown import (
    fenced_commands,
    inline_commands,
    nvpair_options,
    option_mentions,
    shown_commands,
    tox_environments,
)

pytestmark = pytest.mark.e2e

DOCUMENT = """# Title

Install with `pip install .` then run `twistd -n nvpair --engine ollama --demo`, or `tox`;
`ruff` is a word, `--nodes FILE` an option, `GET /api/tags` a route and `.ci/run` a script.

```sh
$ pip install . && twistd -n --pidfile= nvpair --engine ollama \\
    --listen tcp:11435 --node a=http://x:1
# a comment
curl -d '{"model": "m",
  "messages": []}' http://127.0.0.1:11435/api/chat
```

```
twistd nvpair --engine omlx \\
    --state redis://h:6379/0
```

```toml
[[node]]
id = "x"
```

| option | what |
|---|---|
| `--queue-size N` | a row |
"""


def test_fenced_shell_lines_are_commands_joined_across_continuations_and_quotes() -> None:
    """A shell fence's lines, ``$`` prompts and comments dropped, backslash continuations and
    lines inside an open quote joined; other fences are not commands."""
    assert fenced_commands(DOCUMENT) == [
        "pip install . && twistd -n --pidfile= nvpair --engine ollama "
        "--listen tcp:11435 --node a=http://x:1",
        """curl -d '{"model": "m", "messages": []}' http://127.0.0.1:11435/api/chat""",
    ]


def test_an_inline_span_is_a_command_when_a_program_starts_it_with_arguments() -> None:
    """``pip install .`` and the twistd line are commands, as is a repository script alone;
    ``tox`` and ``ruff`` alone are mentions, and neither an option nor a route is a command."""
    assert inline_commands(DOCUMENT) == [
        "pip install .",
        "twistd -n nvpair --engine ollama --demo",
        ".ci/run",
    ]


def test_shown_commands_lists_fenced_ones_first_each_once() -> None:
    shown = shown_commands(DOCUMENT + "\nAgain: `pip install .`\n")
    assert shown[0].startswith("pip install . && twistd") and shown.count("pip install .") == 1


def test_nvpair_options_are_the_ones_after_nvpair() -> None:
    """twistd's own options (before ``nvpair``) are not the plugin's; ``&&`` parts are read
    apart; a command without ``nvpair`` names none."""
    assert nvpair_options("pip install . && twistd -n --pidfile= nvpair -e x --listen=tcp:1") == [
        "listen"
    ]
    assert nvpair_options("curl --data x http://h") == []


def test_option_mentions_cover_spans_commands_and_plain_fences() -> None:
    """Option spans (the configuration table's too), shell commands and ``nvpair`` lines of a
    plain fence."""
    assert sorted(option_mentions(DOCUMENT)) == sorted(
        ["nodes", "queue-size", "engine", "demo", "listen", "node", "state"]
    )


def test_tox_environments_are_those_minus_e_names() -> None:
    assert tox_environments("tox -e bench,lint -e mutation") == ["bench", "lint", "mutation"]
    assert tox_environments("tox") == [] and tox_environments("pip install tox") == []
