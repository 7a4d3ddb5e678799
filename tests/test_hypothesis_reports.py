"""A failing Hypothesis property is reported as one plain test failure, in a plain run and the way
tools/mutation.py runs the tests, never as pytest's ``INTERNALERROR`` (see tests/conftest.py's
``_failing_properties_fail_plainly``). Each run is a pytest subprocess on a tiny failing property.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
from hypothesis import given, settings, strategies as st


@settings(database=None)
@given(st.integers())
def test_property(n):
    assert n < 5
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "plugins",
    [[], ["-p", "tools.fresh_reactor", "-p", "no:timeout"]],
    ids=["plain", "as-mutation-runs"],
)
def test_a_failing_property_is_one_failure_not_an_internal_error(
    tmp_path: Path, plugins: list[str]
) -> None:
    (tmp_path / "test_probe.py").write_text(PROBE)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command += ["-p", "tests.conftest", *plugins, "test_probe.py"]
    done = subprocess.run(
        command,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=100,
    )
    output = done.stdout + done.stderr
    assert "INTERNALERROR" not in output, output
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, output
    assert "1 failed" in output and "assert 5 < 5" in output, output
