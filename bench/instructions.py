"""Instructions per small request, nvpair-tw against ReverseProxyResource, counted by callgrind.

``python bench/instructions.py [--requests N] [--load small|stream] [--base REF] [--no-admin]
[--no-usage] [--log-level L] [--keep] [--floor]`` starts the fast fake engine, then each contender under
``valgrind --tool=callgrind`` with collection off; once it answers, it sends warm-up requests,
turns collection on (``callgrind_control -i on``), sends N small ``POST /api/chat`` requests one
after another on one keep-alive connection, turns it off and reads the instructions counted.
``--load stream`` sends N streamed ``POST /v1/chat/completions`` instead (each 1,000 SSE events
in one burst from the engine, as ``bench/small.py --load stream``) and divides by the events. An
instruction count is the same for the same code and input whatever else the machine does, so it
compares contenders on a busy machine where CPU seconds drift by a third between rounds
(docs/performance.md). nvpair-tw runs as the shipped unit runs it (docs/deploy/nvpair.service:
twistd with the compact JSON log, the admin listener, the usage history in SQLite); ``--base``
adds nvpair-tw at that git ref. The table gives thousands of instructions a request and the ratio
to RPR's.

It counts the interpreter's work, not the kernel's: the system calls a request makes (6.6 for
nvpair-tw, 35 for RPR: docs/performance.md) are not in it, so it is the user-space side of the
CPU figure ``bench/small.py`` measures.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import BENCH, CHUNKS, PY, REPO, STREAM, free_port, wait_ready

CHAT = json.dumps(
    {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "hello"}]}
).encode()


def nvpair_argv(port: int, up: int, args: argparse.Namespace, tmp: Path) -> list[str]:
    twistd = [PY, "-c", "from twisted.scripts.twistd import run; run()", "--nodaemon"]
    argv = [*twistd, "--pidfile=", "--logger=nvpair_tw.logs.compactJson", "nvpair"]
    argv += ["--engine", "ollama", "--assemble", "off", "--node", f"a=http://127.0.0.1:{up}"]
    argv += ["--listen", f"tcp:{port}:interface=127.0.0.1", "--log-level", args.log_level]
    admin = f"tcp:{free_port()}:interface=127.0.0.1" if args.admin else "none"
    usage = str(tmp / f"usage-{port}.sqlite3") if args.usage else "none"
    return [*argv, "--admin", admin, "--usage-db", usage]


def counted(name: str, argv: list[str], root: Path, port: int, args: argparse.Namespace) -> float:
    """Thousands of instructions per request of the server ``argv`` (its code from ``root``)."""
    out = Path(args.tmp) / f"callgrind.{name}.out"
    grind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    log = (Path(args.tmp) / f"{name}.log").open("wb")
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
    # Run in ``root``: ``python -c`` puts the working directory first on sys.path, so run from a
    # checkout, every contender would import that checkout's nvpair_tw, whatever PYTHONPATH says.
    process = subprocess.Popen(
        [*grind, *argv], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root
    )
    try:
        wait_ready(port, process, seconds=300)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        ask(connection, args.warmup, args.load)
        control(process.pid, "-i", "on")
        ask(connection, args.requests, args.load)
        control(process.pid, "-i", "off")
        control(process.pid, "-d")
        connection.close()
    finally:
        process.terminate()
        process.wait(timeout=120)
    total = sum(instructions(path) for path in Path(args.tmp).glob(f"callgrind.{name}.out*"))
    per: int = args.requests * (CHUNKS if args.load == "stream" else 1)
    return total / per / 1000


def ask(connection: http.client.HTTPConnection, n: int, load: str) -> None:
    path, body = ("/v1/chat/completions", STREAM) if load == "stream" else ("/api/chat", CHAT)
    for _ in range(n):
        connection.request("POST", path, body=body)
        response = connection.getresponse()
        response.read()
        if response.status != 200:
            raise SystemExit(f"bench: a request answered {response.status}")


def control(pid: int, *options: str) -> None:
    subprocess.run(["callgrind_control", *options, str(pid)], check=True, capture_output=True)
    time.sleep(0.2)


def instructions(path: Path) -> int:
    """The instructions a callgrind output file counted (its ``summary:`` or ``totals:`` line)."""
    text = path.read_text(errors="replace")
    return max((int(n) for n in re.findall(r"^(?:summary|totals):\s+(\d+)", text, re.M)), default=0)


def base_tree(ref: str, tmp: Path) -> Path:
    root = tmp / "base"
    root.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", ref, "nvpair_tw", "twisted"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--load", choices=("small", "stream"), default="small")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--admin", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--usage", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--base", help="also count nvpair-tw as it is at this git ref")
    parser.add_argument("--keep", action="store_true", help="keep the callgrind files")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also count Twisted's server answering from memory (bench/static.py) and forwarding "
        "through nvpair-tw's node client alone (bench/bare.py): the floors",
    )
    args = parser.parse_args()
    if args.floor and args.load != "small":
        parser.error("--floor: the floors answer small requests only; use it with --load small")
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("bench: needs valgrind (Debian: apt-get install valgrind)")
    args.tmp = tempfile.mkdtemp(prefix="nvpair-instr-")
    tmp = Path(args.tmp)
    up = free_port()
    upstream = subprocess.Popen([PY, str(BENCH / "upstream.py"), str(up)])
    try:
        wait_ready(up, upstream)
        rows: dict[str, float] = {}
        contenders = [("nvpair-tw", REPO)]
        if args.base:
            contenders.append((f"nvpair-tw@{args.base}", base_tree(args.base, tmp)))
        for name, root in contenders:
            port = free_port()
            rows[name] = counted(name, nvpair_argv(port, up, args, tmp), root, port, args)
        port = free_port()
        rpr = [PY, str(BENCH / "rpr.py"), str(port), str(up)]
        rows["rpr"] = counted("rpr", rpr, REPO, port, args)
        if args.floor:
            port = free_port()
            static = [PY, str(BENCH / "static.py"), str(port)]
            rows["twisted alone (floor)"] = counted("static", static, BENCH, port, args)
            port = free_port()
            bare = [PY, str(BENCH / "bare.py"), str(port), str(up)]
            rows["twisted + nvpair-tw's node client"] = counted("bare", bare, REPO, port, args)
    finally:
        upstream.terminate()
        upstream.wait(timeout=30)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    what = f"streams of {CHUNKS} events" if args.load == "stream" else "POST /api/chat"
    unit = "event" if args.load == "stream" else "request"
    digits = 3 if args.load == "stream" else 1
    print(
        f"\n{args.requests} sequential {what}, log {args.log_level}, admin "
        f"{'on' if args.admin else 'off'}, usage {'on' if args.usage else 'off'}"
    )
    print(f"| contender | k instructions / {unit} | x RPR |\n|---|---|---|")
    for name, value in rows.items():
        print(f"| {name} | {value:,.{digits}f} | {value / rows['rpr']:.2f} |")
    if args.keep:
        print(f"callgrind files in {tmp}")


if __name__ == "__main__":
    main()
