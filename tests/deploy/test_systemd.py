"""docs/deploy/nvpair.service as systemd reads it: hardened to ``systemd-analyze security``
exposure 2.5 or lower, accepted by ``systemd-analyze verify``, its usage database in its state
directory and its control socket in its runtime directory, and its command line made of options
twistd and the plugin accept.

``systemd-analyze`` comes with Debian's ``systemd`` package, which tools/prerequisites.py
installs before the tests; without it these tests fail, naming it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from twisted.scripts._twistd_unix import ServerOptions

from nvpair_tw import tap
from nvpair_tw.ctl import DEFAULT_CONTROL
from tests.deploy.units import DEPLOY, command_line, read_environment_file, read_unit

UNIT = DEPLOY / "nvpair.service"
ENV = DEPLOY / "nvpair.env.example"
MOST_EXPOSED = 2.5
NODES = '[[node]]\nid = "gpu1"\nurl = "http://10.0.0.11:11434"\n'


def _systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        pytest.fail(
            "systemd-analyze not found: it checks the shipped unit (Debian: apt-get install "
            "systemd; tox installs it through tools/prerequisites.py)",
            pytrace=False,
        )
    return found


def _exposure(unit: Path) -> tuple[float, str]:
    done = subprocess.run(
        [_systemd_analyze(), "security", "--offline=yes", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    found = re.search(r"Overall exposure level for [^:]+: (\d+\.\d+) (\w+)", done.stdout)
    assert found is not None, done.stdout + done.stderr
    return float(found.group(1)), found.group(2)


def test_the_unit_is_hardened_to_exposure_2_5_or_lower() -> None:
    exposure, verdict = _exposure(UNIT)
    assert exposure <= MOST_EXPOSED, f"systemd-analyze security: {exposure} {verdict}"


def test_the_exposure_check_would_see_a_weaker_unit(tmp_path: Path) -> None:
    """The same unit without its hardening block scores far above the bound (the check can
    fail)."""
    text = UNIT.read_text().split("# Hardening", 1)[0] + "\n[Install]\nWantedBy=multi-user.target\n"
    weaker = tmp_path / "nvpair.service"
    weaker.write_text(text)
    assert _exposure(weaker)[0] > MOST_EXPOSED


def test_the_unit_verifies_without_a_warning(tmp_path: Path) -> None:
    """``systemd-analyze verify`` (which needs the program to exist: the unit's twistd is
    replaced by an executable that does) finds nothing to say."""
    unit = tmp_path / "nvpair.service"
    unit.write_text(
        UNIT.read_text().replace("/opt/nvpair/venv/bin/twistd", shutil.which("true") or "/bin/true")
    )
    done = subprocess.run(
        [_systemd_analyze(), "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_the_command_line_parses_as_twistd_and_plugin_options(tmp_path: Path) -> None:
    """ExecStart with nvpair.env.example's values (the nodes file a real one here): twistd
    takes what comes before ``nvpair``, the plugin the rest, with the env file as its
    environment; the usage database is in the state directory, the control socket in the
    runtime directory with a mode its group may use."""
    nodes = tmp_path / "nodes.toml"
    nodes.write_text(NODES)
    environ = {**read_environment_file(ENV), "NVPAIR_NODES_FILE": str(nodes)}
    (start,) = read_unit(UNIT)["Service"]["ExecStart"]
    argv = command_line(start, environ, {"S": "/var/lib"})
    assert argv[0] == "/opt/nvpair/venv/bin/twistd"
    split = argv.index("nvpair")
    twistd = ServerOptions()
    twistd.parseOptions(argv[1:split])
    assert twistd["nodaemon"] and twistd["pidfile"] == ""
    options = tap.Options(environ=environ)
    options.parseOptions(argv[split + 1 :])
    config = options.config
    assert config.usage_db == "/var/lib/nvpair/usage.sqlite3"
    assert config.control == "unix:/run/nvpair/ctl.sock:mode=660"
    assert config.nodes_file == str(nodes)
    assert config.warnings == ()


def test_the_directories_behind_the_paths_are_the_units_own() -> None:
    """The state directory holds the usage database (else it cannot be created under
    ProtectSystem=strict and usage stays in memory); the runtime directory holds the socket,
    which nvpair-ctl finds by default; the group may enter it, no one else."""
    service = read_unit(UNIT)["Service"]
    assert service["StateDirectory"] == ["nvpair"] and "%S/nvpair/" in service["ExecStart"][0]
    assert service["RuntimeDirectory"] == ["nvpair"]
    assert service["RuntimeDirectoryMode"] == ["0750"] and service["Group"] == ["nvpair-ops"]
    assert DEFAULT_CONTROL.startswith("unix:/run/nvpair/")
    assert f"--control {DEFAULT_CONTROL}:mode=660" in read_environment_file(ENV)["NVPAIR_ARGS"]


def test_documentation_exists_after_pip_install() -> None:
    """A URL or a manual page, not a path inside the clone."""
    (documentation,) = read_unit(UNIT)["Unit"]["Documentation"]
    for uri in documentation.split():
        assert uri.startswith(("https://", "man:")), uri
