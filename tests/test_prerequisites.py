"""tools/prerequisites.py's decisions (what ``tox`` installs or demands before the tests), on
fake machines."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import pytest

from tools import prerequisites
from tools.prerequisites import Machine, Missing

EVERYTHING = {
    "chromium",
    "systemd-analyze",
    "redis-server",
    "gcc",
    "cmake",
    "g++",
    "curl",
    "apt-get",
    "python3.11",
    "python3.12",
    "python3.13",
}


def machine(
    have: set[str] = EVERYTHING,
    *,
    root: bool = True,
    env: Mapping[str, str] | None = None,
) -> Machine:
    def which(name: str) -> str | None:
        if "/" in name:  # a path, as shutil.which takes it
            return name if name in have else None
        return f"/usr/bin/{name}" if name in have else None

    return Machine(
        env=dict(env or {}),
        which=which,
        is_root=root,
        runs=lambda name: name in have,
    )


def recorder() -> tuple[list[tuple[tuple[str, ...], Mapping[str, str]]], Callable[..., int]]:
    calls: list[tuple[tuple[str, ...], Mapping[str, str]]] = []

    def run(command: Sequence[str], env: Mapping[str, str]) -> int:
        calls.append((tuple(command), env))
        return 0

    return calls, run


def test_nothing_missing_nothing_to_do() -> None:
    assert prerequisites.plan(machine()).commands == ()


def test_missing_as_root_with_apt_installs() -> None:
    plan = prerequisites.plan(machine(EVERYTHING - {"chromium", "redis-server"}))
    assert plan.commands == (
        ("apt-get", "update", "-qq"),
        ("apt-get", "install", "-y", "-qq", "chromium", "redis-server"),
    )
    assert plan.env["DEBIAN_FRONTEND"] == "noninteractive"


def test_curl_for_the_readme_commands_is_installed_like_the_others() -> None:
    """The README test runs the README's curl lines with curl: a machine without it gets it from
    apt-get, as it gets chromium."""
    plan = prerequisites.plan(machine(EVERYTHING - {"curl"}))
    assert plan.commands[-1] == ("apt-get", "install", "-y", "-qq", "curl")


def test_ensure_runs_the_install_commands_in_order() -> None:
    calls, run = recorder()
    prerequisites.ensure(machine(EVERYTHING - {"gcc"}), run=run, say=lambda line: None)
    assert [c for c, _ in calls] == [
        ("apt-get", "update", "-qq"),
        ("apt-get", "install", "-y", "-qq", "gcc"),
    ]


def test_a_failing_apt_get_stops_the_run() -> None:
    with pytest.raises(Missing, match="apt-get update -qq` exited 100"):
        prerequisites.ensure(
            machine(EVERYTHING - {"gcc"}), run=lambda c, e: 100, say=lambda line: None
        )


def test_missing_not_root_is_one_line_naming_the_packages() -> None:
    with pytest.raises(Missing) as raised:
        prerequisites.plan(machine(EVERYTHING - {"chromium", "redis-server"}, root=False))
    message = str(raised.value)
    assert "\n" not in message
    assert "sudo apt-get install -y chromium redis-server" in message


def test_missing_as_root_without_apt_is_one_line() -> None:
    calls, run = recorder()
    with pytest.raises(Missing) as raised:
        prerequisites.ensure(machine(EVERYTHING - {"redis-server", "apt-get"}), run=run)
    assert "\n" not in str(raised.value)
    assert "redis-server" in str(raised.value)
    assert calls == []


def test_systemd_analyze_comes_with_debians_systemd_package() -> None:
    """The unit's hardening test runs ``systemd-analyze``; without it, ``systemd`` is installed."""
    plan = prerequisites.plan(machine(EVERYTHING - {"systemd-analyze"}))
    assert plan.commands[-1] == ("apt-get", "install", "-y", "-qq", "systemd")


def test_chromium_may_be_named_by_nvpair_chromium() -> None:
    env = {"NVPAIR_CHROMIUM": "/opt/chrome/chrome"}
    have = (EVERYTHING - {"chromium"}) | {"/opt/chrome/chrome"}
    assert "chromium" not in prerequisites.missing_packages(machine(have, env=env))
    env = {"NVPAIR_CHROMIUM": "/nonexistent/chromium"}
    assert "chromium" in prerequisites.missing_packages(machine(EVERYTHING, env=env))


def test_cc_names_the_compiler() -> None:
    have = (EVERYTHING - {"gcc"}) | {"clang"}
    assert prerequisites.missing_packages(machine(have, env={"CC": "clang"})) == []


def test_in_ci_a_missing_interpreter_is_an_error() -> None:
    with pytest.raises(Missing) as raised:
        prerequisites.plan(machine(EVERYTHING - {"python3.13"}, env={"CI": "true"}))
    assert "python3.13" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_outside_ci_a_missing_interpreter_is_left_to_tox() -> None:
    assert prerequisites.plan(machine(EVERYTHING - {"python3.13"})).commands == ()
