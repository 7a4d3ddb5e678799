"""Mutation testing (``tox -e mutation``): mutmut over the core modules, each against its own tests.

``python tools/mutation.py [MODULE ...] [--max-children N]`` runs mutmut once per module (default:
all of ``MODULES``), one module at a time, in ``.mutation/<module>/``: a copy of the package, the
tests and the config, with a ``[tool.mutmut]`` table that mutates only that module and selects only
its own test file(s). Each run starts afresh (mutmut's cache does not notice changed tests); the
results stay there for ``mutmut show`` / ``mutmut browse``. It prints the score per module and every surviving mutant's diff, and exits 1 if a
module scores below ``--fail-under`` percent.

mutmut reads its configuration from ``pyproject.toml`` only, one table per directory, hence the
copies. docs/testing.md lists the scores and the verdict on each survivor.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["MODULES", "main"]

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / ".mutation"

MODULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "attempts": ("corridor/_attempts.py", ("tests/corridor/test_attempts.py",)),
    "stalls": ("selection/_stalls.py", ("tests/selection/test_stalls.py",)),
    "ordering": ("selection/_ordering.py", ("tests/selection/test_ordering.py",)),
    "upstream": ("upstream/_attempt.py", ("tests/upstream/test_attempt.py",)),
    "relay": ("corridor/_relay.py", ("tests/corridor/test_relay.py",)),
    "frames": ("corridor/_terminal.py", ("tests/corridor/test_terminal.py",)),
    "eager": ("runtime/_eager.py", ("tests/runtime/test_eager.py",)),
    "http1": ("upstream/_http1.py", ("tests/upstream/test_http1.py",)),
    "protocol": ("upstream/_protocol.py", ("tests/upstream/test_protocol.py",)),
    "agent": ("upstream/_agent.py", ("tests/upstream/test_agent.py",)),
    "roles": ("corridor/_roles.py", ("tests/corridor/test_roles.py",)),
    "local": ("inbound/_local.py", ("tests/inbound/test_local.py",)),
    "collector": ("corridor/_collector.py", ("tests/corridor/test_collector.py",)),
    "parse": ("inbound/_parse.py", ("tests/inbound/test_parse.py",)),
    "target": ("inbound/_target.py", ("tests/inbound/test_parse.py",)),
    "framer": ("core/_framer.py", ("tests/core/test_framer.py",)),
    "toolcalls": ("core/_toolcalls.py", ("tests/core/test_toolcalls.py",)),
    "recorder": ("usage/_recorder.py", ("tests/usage/test_recorder.py",)),
    "recorder-buffer": ("usage/_buffer.py", ("tests/usage/test_recorder.py",)),
    "recorder-storage": (
        "usage/_storage.py",
        ("tests/usage/test_storage.py", "tests/usage/test_recorder.py"),
    ),
    "plain": ("ops/_plain.py", ("tests/ops/test_plain.py",)),
    "usage-meter": ("dialects/_usage.py", ("tests/dialects/test_usage.py",)),
    "limits": (
        "inbound/_limits.py",
        (
            "tests/inbound/test_limits.py",
            "tests/inbound/test_limits_gate.py",
            "tests/inbound/test_limits_sources.py",
            "tests/inbound/test_limits_refusals.py",
            "tests/inbound/test_limits_channel.py",
            "tests/inbound/test_cors_owned.py",
        ),
    ),
    "exchange": ("corridor/_exchange.py", ("tests/corridor/test_exchange_machine.py",)),
    "canonical": ("selection/_canonical.py", ("tests/selection/test_canonical.py",)),
    "caches": ("selection/_caches.py", ("tests/selection/test_caches.py",)),
}
"""Short name → (its file under ``nvpair_tw/``, the test files that must kill its mutants)."""


def _dotted(source: str) -> str:
    """``corridor/_attempts.py`` → ``nvpair_tw.corridor._attempts``: how mutmut names mutants."""
    return "nvpair_tw." + source.removesuffix(".py").replace("/", ".")


COPIED = ("nvpair_tw", "tests", "setup.cfg", "tools")
KILLED = ("killed", "timeout", "caught by type check")
"""mutmut verdicts that count as killed (a mutant that hangs the tests is caught too)."""


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


def prepare(module: str, source: str, tests: tuple[str, ...]) -> Path:
    """``.mutation/<module>/``: fresh copies of the sources and tests, and the mutmut table."""
    where = WORK / module
    # mutmut keeps verdicts per mutated function and does not notice changed tests: start afresh
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "dropin.cache")
    for name in COPIED:
        original, target = REPO / name, where / name
        if original.is_dir():
            shutil.copytree(original, target, ignore=ignore, dirs_exist_ok=True)
        else:
            shutil.copy2(original, target)
    table = "\n".join(
        [
            "",
            "[tool.mutmut]",
            'source_paths = ["nvpair_tw"]',
            f'only_mutate = ["nvpair_tw/{source}"]',
            f"pytest_add_cli_args_test_selection = {_toml_list(list(tests))}",
            'also_copy = ["tools"]',
            # a fresh reactor per in-process pytest run; no pytest-timeout: mutmut has its own
            'pytest_add_cli_args = ["-q", "-p", "tools.fresh_reactor", "-p", "no:timeout",'
            ' "-o", "required_plugins=pytest-twisted", "-m", "not real_engine and not browser"]',
            "",
        ]
    )
    pyproject = (REPO / "pyproject.toml").read_text()
    (where / "pyproject.toml").write_text(pyproject + table)
    return where


def run(module: str, max_children: int) -> tuple[int, int, list[str]]:
    """Run mutmut for ``module``; (killed, total, surviving mutant names)."""
    source, tests = MODULES[module]
    where = prepare(module, source, tests)
    env = {**os.environ, "PYTHONPATH": ""}
    print(f"== {module}: mutating nvpair_tw/{source} against {' '.join(tests)}", flush=True)
    subprocess.run(
        [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children)],
        cwd=where,
        env=env,
        check=True,
    )
    listing = subprocess.run(
        [sys.executable, "-m", "mutmut", "results", "--all", "true"],
        cwd=where,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    statuses = re.findall(r"^\s*(\S+): (\S.*)$", listing, flags=re.MULTILINE)
    mutants = [
        (name, status.strip())
        for name, status in statuses
        if name.startswith(_dotted(source) + ".")
    ]
    survivors = [name for name, status in mutants if status not in KILLED]
    return len(mutants) - len(survivors), len(mutants), survivors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help=f"default: {' '.join(MODULES)}")
    parser.add_argument("--max-children", type=int, default=2, help="parallel mutant runs")
    parser.add_argument("--fail-under", type=float, default=0.0, help="minimum score (percent)")
    options = parser.parse_args()
    unknown = [m for m in options.modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown module(s) {unknown}; known: {list(MODULES)}")
    scores: list[tuple[str, int, int]] = []
    failed = False
    for module in options.modules or list(MODULES):
        killed, total, survivors = run(module, options.max_children)
        scores.append((module, killed, total))
        where = WORK / module
        for name in survivors:
            subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=where, check=False)
        if total and killed * 100 / total < options.fail_under:
            failed = True
    print("\nmodule      killed / total   score")
    for module, killed, total in scores:
        score = killed * 100 / total if total else 100.0
        print(f"{module:<11} {killed:>6} / {total:<6} {score:6.1f} %")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
