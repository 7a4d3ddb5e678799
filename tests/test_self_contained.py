"""The repository stands on its own (issue 21): no tracked file reads a path beside it.

A fresh clone with nothing next to it must run its whole suite, so no file may name the parent
directory (a sibling checkout, ``REPO.parent``, ``"$repo/.."``, ...). This is the static half; the
dynamic half is the audit hook in tests/conftest.py, which fails the session if the tests open a
file under the repository's parent directory but outside the repository.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.outside_reads import OutsideReads

REPO = Path(__file__).resolve().parent.parent

# Assembled from parts so that this file does not match itself.
DOT = re.escape(".")
ESCAPES = [
    ("a sibling 'shared' checkout", re.compile(DOT * 2 + r"/shared\b")),
    ("the shared engine scripts", re.compile(r"\bshared/" + "engines")),
    (
        "the repository's parent (REPO.parent)",
        re.compile(r"\b(?:REPO|ROOT|_ROOT|_REPO)" + DOT + r"parent\b"),
    ),
    (
        "a parent of the repository (parents[n])",
        re.compile(r"\b(?:REPO|ROOT|_ROOT|_REPO)" + DOT + r"parents\["),
    ),
    (
        "a shell path above the repository ($repo/..)",
        re.compile(r"\$\{?(?:repo|REPO|root|ROOT|toxinidir)\}?/" + DOT * 2),
    ),
    ("tox's parent directory ({toxinidir}/..)", re.compile(r"\{toxinidir\}/" + DOT * 2)),
    ("the old engine directory beside the repository", re.compile(DOT + "ollama-e2e")),
]


def tracked_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    return [REPO / name.decode() for name in listed if name]


def escapes_in(text: str) -> list[tuple[int, str, str]]:
    """``(line number, what, line)`` for each line of ``text`` that reaches outside the repository."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in ESCAPES:
            if pattern.search(line):
                found.append((number, what, line.strip()))
    return found


def test_the_patterns_catch_what_they_should() -> None:
    bad = [
        "bash .." + "/shared/" + "engines/real-ollama.sh up",
        "Path(os.environ.get('X', REPO" + ".parent / 'x'))",
        'NVPAIR_DIR="$repo/' + '../.ollama-e2e"',
        "deps = -r {toxinidir}/" + "../requirements.txt",
        "x = _ROOT" + ".parents[1]",
    ]
    assert [len(escapes_in(line)) > 0 for line in bad] == [True] * len(bad)
    good = ["REPO = Path(__file__).resolve().parent.parent", "cd ../nvpair_tw", "x = y.parent"]
    assert [escapes_in(line) for line in good] == [[], [], []]


def test_no_tracked_file_reads_beside_the_repository() -> None:
    me = Path(__file__).resolve()
    problems = []
    for path in tracked_files():
        if path.resolve() == me or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary
        for number, what, line in escapes_in(text):
            problems.append(f"{path.relative_to(REPO)}:{number}: {what}: {line}")
    assert not problems, "files that reach outside the repository:\n" + "\n".join(problems)


def test_the_audit_hook_records_reads_beside_the_repository_only() -> None:
    recorder = OutsideReads("/w/repo", ["/w/venv", "/tmp", "/w", "/"], home="/root")
    for path in ("/w/repo/setup.cfg", "/w/venv/lib/x.py", "/tmp/x", "/etc/hosts", 3):
        recorder.check(path)
    beside = "/w/sibling/engines/run.sh"  # a file in a checkout next to the repository
    recorder.check(beside)
    recorder.check(b"/w/repo/../.ollama-e2e/run/.ready", "rb")
    assert recorder.seen == {
        beside: "r",
        "/w/.ollama-e2e/run/.ready": "rb",
    }


def test_when_the_parent_is_home_dot_files_are_allowed() -> None:
    recorder = OutsideReads("/home/u/repo", [], home="/home/u")
    recorder.check("/home/u/.netrc")
    recorder.check("/home/u/other-project/x")
    assert list(recorder.seen) == ["/home/u/other-project/x"]
