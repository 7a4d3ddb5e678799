# -*- test-case-name: tests.test_packaging -*-
"""The built wheel: what it contains, and that ``twistd`` finds the plugin from it (TWISTED.md §1.4).

The wheel is built from a copy of the packaging inputs (so no ``build/`` or ``*.egg-info`` lands in
the checkout) and installed with ``pip install --no-deps --target`` into a temporary directory: the
test environment already holds every dependency, no second virtualenv or download of Twisted is
needed, and with ``PYTHONPATH`` set to that directory only and a scratch working directory, the
plugin and package can come from the wheel alone. The build runs offline (``--no-build-isolation``)
when this environment can build wheels itself, else pip fetches the build backend from the index.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import pytest

from nvpair_tw import __version__

REPO = Path(__file__).resolve().parent.parent
TWISTD = "import sys; sys.argv[0] = 'twistd'; from twisted.scripts.twistd import run; run()"
WHERE = (
    "import os, nvpair_tw, twisted.plugins; "
    "print(nvpair_tw.__file__); "
    "print(*[p for p in twisted.plugins.__path__ "
    "if os.path.exists(os.path.join(p, 'nvpair_plugin.py'))])"
)


def _can_build_offline() -> bool:
    """setuptools with a built-in ``bdist_wheel`` (>= 70.1) or the ``wheel`` package, and incremental."""
    if importlib.util.find_spec("setuptools") is None:
        return False
    if importlib.util.find_spec("incremental") is None:
        return False
    major, minor = (int(part) for part in metadata.version("setuptools").split(".")[:2])
    return (major, minor) >= (70, 1) or (
        major >= 68 and importlib.util.find_spec("wheel") is not None
    )


def _run(args: list[str], cwd: Path, **extra_env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("NVPAIR_", "PYTHON"))}
    environ.update(PIP_DISABLE_PIP_VERSION_CHECK="1", **extra_env)
    result = subprocess.run(
        args, cwd=cwd, env=environ, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from the checkout's packaging inputs."""
    work = tmp_path_factory.mktemp("packaging")
    source = work / "source"
    source.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        if (REPO / name).exists():
            shutil.copy2(REPO / name, source / name)
    junk = shutil.ignore_patterns("__pycache__", "*.pyc", "dropin.cache")
    shutil.copytree(REPO / "nvpair_tw", source / "nvpair_tw", ignore=junk)
    shutil.copytree(REPO / "twisted", source / "twisted", ignore=junk)
    isolation = ["--no-build-isolation"] if _can_build_offline() else []
    dist = work / "dist"
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *isolation]
    _run([*command, "-w", str(dist), str(source)], cwd=work)
    (built,) = dist.glob("*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel unpacked by pip into a directory of its own (dependencies come from this venv)."""
    target = tmp_path_factory.mktemp("site")
    install = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q"]
    _run([*install, "--target", str(target), str(wheel)], cwd=target)
    return target


def test_wheel_holds_the_package_and_the_plugin_only(wheel: Path) -> None:
    """The plugin file ships, but no ``twisted/__init__.py`` or ``twisted/plugins/__init__.py``."""
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "twisted/plugins/nvpair_plugin.py" in names
    assert "twisted/__init__.py" not in names
    assert "twisted/plugins/__init__.py" not in names
    assert not [n for n in names if n.endswith(("dropin.cache", ".pyc"))]
    assert {"nvpair_tw/__init__.py", "nvpair_tw/tap.py", "nvpair_tw/py.typed"} <= names
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"nvpair_tw", "twisted"}
    assert {n for n in names if n.startswith("twisted/")} == {"twisted/plugins/nvpair_plugin.py"}


def test_wheel_holds_every_package_of_the_checkout(wheel: Path) -> None:
    """``setup.cfg`` lists the packages by hand: a package added without a line there (a directory
    of ``nvpair_tw`` with an ``__init__.py``) is missing from the wheel, which the checkout's own
    tests, importing from the checkout, never notice."""
    names = set(zipfile.ZipFile(wheel).namelist())
    found = (REPO / "nvpair_tw").rglob("__init__.py")
    inits = {path.relative_to(REPO).as_posix() for path in found if "__pycache__" not in path.parts}
    assert inits - names == set()


def test_wheel_metadata_carries_the_incremental_version(wheel: Path) -> None:
    """Name ``nvpair-tw``, version from ``nvpair_tw/_version.py``, Twisted as a dependency."""
    archive = zipfile.ZipFile(wheel)
    (metadata_name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
    fields = Parser().parsestr(archive.read(metadata_name).decode())
    assert fields["Name"] == "nvpair-tw"
    assert fields["Version"] == __version__.public()
    assert any(r.startswith("twisted") for r in fields.get_all("Requires-Dist", []))


def test_installed_wheel_provides_the_plugin_to_twistd(installed: Path, tmp_path: Path) -> None:
    """From a scratch directory, with only the installed wheel added, ``twistd --help`` lists nvpair."""
    where = _run([sys.executable, "-c", WHERE], cwd=tmp_path, PYTHONPATH=str(installed))
    package_file, *plugin_dirs = where.stdout.split()
    assert Path(package_file).is_relative_to(installed)
    # The installed copy's plugin directory is scanned by twistd (under tox the package is also
    # in site-packages, so it may not be the only one).
    assert any(Path(d).is_relative_to(installed) for d in plugin_dirs), plugin_dirs
    helped = _run([sys.executable, "-c", TWISTD, "--help"], cwd=tmp_path, PYTHONPATH=str(installed))
    assert "nvpair" in [line.split()[0] for line in helped.stdout.splitlines() if line.strip()]
    version = _run(
        [sys.executable, "-c", TWISTD, "nvpair", "--version"],
        cwd=tmp_path,
        PYTHONPATH=str(installed),
    )
    assert version.stdout == f"nvpair-tw {__version__.public()}\n"


def test_installed_wheel_provides_the_console_command(
    wheel: Path, installed: Path, tmp_path: Path
) -> None:
    """``nvpair-ctl`` is the wheel's console script (``nvpair_tw.ctl:main``); the script pip
    writes runs from the install alone and, with no proxy there, says so in one line, status 1."""
    archive = zipfile.ZipFile(wheel)
    (entry_points,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
    assert "nvpair-ctl = nvpair_tw.ctl:main" in archive.read(entry_points).decode()
    script = installed / "bin" / "nvpair-ctl"
    version = _run([str(script), "--version"], cwd=tmp_path, PYTHONPATH=str(installed))
    assert version.stdout == f"nvpair-tw {__version__.public()}\n"
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("NVPAIR_", "PYTHON"))}
    endpoint = f"unix:{tmp_path / 'none.sock'}"
    nothing = subprocess.run(
        [str(script), "--control", endpoint, "nodes"],
        cwd=tmp_path,
        env={**environ, "PYTHONPATH": str(installed)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (nothing.returncode, nothing.stdout) == (1, "")
    assert nothing.stderr.startswith(f"nvpair-ctl: cannot reach the control channel at {endpoint}")
    assert nothing.stderr.count("\n") == 1
