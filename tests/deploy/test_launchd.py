"""docs/deploy/org.nvpair.proxy.plist as launchd reads it: a property list whose label is its
file's name, whose ProgramArguments are options twistd and the plugin accept, and whose paths
lie in the directories docs/deploy/README.md has the user create."""

from __future__ import annotations

import plistlib
import re
from pathlib import Path
from typing import Any

from twisted.scripts._twistd_unix import ServerOptions

from nvpair_tw import tap
from nvpair_tw.core import parse_duration
from tests.deploy.units import DEPLOY

PLIST = DEPLOY / "org.nvpair.proxy.plist"
NODES = '[[node]]\nid = "mac"\nurl = "http://127.0.0.1:11434"\n'


def _agent() -> dict[str, Any]:
    with PLIST.open("rb") as handle:
        agent = plistlib.load(handle)
    assert isinstance(agent, dict)
    return agent


def test_the_label_is_the_files_name() -> None:
    assert _agent()["Label"] == PLIST.name.removesuffix(".plist") == "org.nvpair.proxy"


def test_the_program_arguments_parse_as_twistd_and_plugin_options(tmp_path: Path) -> None:
    """Before ``nvpair``: twistd's own flags; after it: the plugin's (the nodes file a real one
    here), with the agent's environment."""
    nodes = tmp_path / "nodes.toml"
    nodes.write_text(NODES)
    agent = _agent()
    argv = [str(nodes) if a == "/opt/nvpair/nodes.toml" else a for a in agent["ProgramArguments"]]
    assert argv[0] == "/opt/nvpair/venv/bin/twistd"
    split = argv.index("nvpair")
    twistd = ServerOptions()
    twistd.parseOptions(argv[1:split])
    assert twistd["nodaemon"] and twistd["pidfile"] == ""
    options = tap.Options(environ=agent.get("EnvironmentVariables", {}))
    options.parseOptions(argv[split + 1 :])
    config = options.config
    assert config.usage_db == "/opt/nvpair/state/usage.sqlite3"
    assert config.control == "unix:/opt/nvpair/run/ctl.sock:mode=600:lockfile=1"
    assert config.warnings == ()
    grace = parse_duration(argv[argv.index("--shutdown-grace") + 1])
    assert agent["ExitTimeOut"] > grace + 5  # launchd's SIGKILL comes after the drain


def test_it_restarts_after_a_crash_only() -> None:
    agent = _agent()
    assert agent["RunAtLoad"] is True and agent["KeepAlive"] == {"SuccessfulExit": False}
    assert agent["Umask"] == 0o077


def test_every_path_it_names_is_in_a_directory_the_install_creates() -> None:
    """The install commands of docs/deploy/README.md create the directories of the nodes file,
    the database, the socket, the log and the working directory (twistd creates none)."""
    readme = (DEPLOY / "README.md").read_text()
    section = readme.split("## A Mac: launchd", 1)[1]
    created = {"/opt/nvpair"}
    for line in re.findall(r"^mkdir -p (.+)$", section, re.MULTILINE):
        created |= set(line.split("#")[0].split())
    agent = _agent()
    paths = [a.split(":")[1] if a.startswith("unix:") else a for a in agent["ProgramArguments"]]
    paths += [agent["StandardOutPath"], agent["StandardErrorPath"]]
    named = [Path(p) for p in paths if p.startswith("/opt/nvpair/")]
    assert {str(p.parent) for p in named if p.name != "twistd"} <= created
    assert agent["WorkingDirectory"] in created
    assert (
        "launchctl bootstrap gui/$(id -u) ~/Library/LaunchAgents/org.nvpair.proxy.plist" in section
    )
