"""Benchmark harness: direct vs nvpair-tw vs ReverseProxyResource vs nginx, all on loopback.

``python bench/run.py [--quick] [--profile]`` starts a fast fake engine (``bench/upstream.py``), each
contender in front of it, and ``wrk``/``hey`` as load generators; it prints a Markdown table, writes
``bench/results/<timestamp>.json`` and draws ``docs/performance.png``. Servers are pinned to core 0
and the load generators (and this script's own clients) to core 1 when the machine has two cores.
See docs/performance.md for what each number means.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PY = sys.executable
CHAT = b'{"model":"llama3","stream":false,"messages":[{"role":"user","content":"hi"}]}'
STREAM = b'{"model":"llama3","stream":true,"messages":[{"role":"user","content":"hi"}]}'
SLOW = (
    b'{"model":"llama3","stream":true,"bench_slow":true,'
    b'"messages":[{"role":"user","content":"hi"}]}'
)
CHUNKS = 1000
STALL_REQUESTS = 20
HEADER_TIMEOUT = 1.0
OPEN_STREAMS = 1000
TICKS = os.sysconf("SC_CLK_TCK")
CONTENDERS = ("direct", "nvpair-tw", "rpr", "nginx")
LABELS = {
    "direct": "direct (no proxy)",
    "nvpair-tw": "nvpair-tw",
    "nvpair-agent": "nvpair-tw (stock Agent)",
    "rpr": "ReverseProxyResource",
    "nginx": "nginx",
}


@dataclass(frozen=True)
class Mode:
    """Sizes of every load; --quick shrinks them."""

    rounds: int
    latency_seconds: int
    throughput_seconds: int
    ttfb_requests: int
    stream_seconds: int
    warmup_requests: int
    growth_requests: int
    open_seconds: int


FULL = Mode(5, 4, 4, 50, 5, 5000, 50000, 12)
QUICK = Mode(1, 3, 3, 15, 3, 1000, 5000, 8)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def proc_stat(pid: int) -> tuple[int, float]:
    """(parent pid, CPU seconds user+system) of one process."""
    text = Path(f"/proc/{pid}/stat").read_text()
    rest = text[text.rindex(")") + 2 :].split()
    return int(rest[1]), (int(rest[11]) + int(rest[12])) / TICKS


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def family(pid: int) -> list[int]:
    """``pid`` and its direct children (nginx's workers)."""
    pids = [pid]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if proc_stat(int(entry.name))[0] == pid:
                    pids.append(int(entry.name))
            except (OSError, ValueError):
                continue
    return pids


def open_fds(pids: Sequence[int]) -> int:
    return sum(len(os.listdir(f"/proc/{p}/fd")) for p in pids)


@dataclass
class Server:
    """A contender or upstream process and the port it serves."""

    name: str
    port: int
    process: subprocess.Popen[bytes]

    def pids(self) -> list[int]:
        return family(self.process.pid)

    def rss(self) -> int:
        return sum(rss_kib(p) for p in self.pids())

    def cpu(self) -> float:
        return sum(proc_stat(p)[1] for p in self.pids())


@dataclass
class Harness:
    """Owns the temporary directory and every process it starts."""

    tmp: Path
    pin: bool
    servers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def spawn(self, name: str, argv: list[str], *, core: int = 0) -> subprocess.Popen[bytes]:
        if self.pin:
            argv = ["taskset", "-c", str(core), *argv]
        log = (self.tmp / f"{name}.log").open("wb")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        self.servers.append(process)
        return process

    def stop(self) -> None:
        for process in self.servers:
            if process.poll() is None:
                process.terminate()
        for process in self.servers:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def loadgen(self, argv: list[str], timeout: float) -> str:
        if self.pin:
            argv = ["taskset", "-c", "1", *argv]
        done = subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
        return done.stdout.decode(errors="replace")


def http(port: int, path: bytes, body: bytes, timeout: float = 30.0) -> tuple[bytes, float, float]:
    """One POST on a fresh connection: (response bytes, seconds to first body byte, total)."""
    request = (
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (path, len(body), body)
    )
    buffer = bytearray()
    first = 0.0
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        start = time.perf_counter()
        s.sendall(request)
        while True:
            data = s.recv(262144)
            if not data:
                break
            buffer += data
            if not first:
                end = buffer.find(b"\r\n\r\n")
                if end >= 0 and len(buffer) > end + 4:
                    first = time.perf_counter() - start
        total = time.perf_counter() - start
    return bytes(buffer), first, total


def get(port: int, path: bytes) -> bytes:
    """One GET on a fresh connection: the whole response."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" % path)
        return b"".join(iter(lambda: s.recv(65536), b""))


def first_event(port: int) -> float:
    """Seconds from sending a long-lived stream request to its first SSE event; then hang up."""
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(SLOW), SLOW)
    )
    buffer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        start = time.perf_counter()
        s.sendall(request)
        while b"data:" not in buffer:
            data = s.recv(65536)
            if not data:
                raise RuntimeError(f"port {port} closed the stream before its first event")
            buffer += data
        return time.perf_counter() - start


def wait_ready(
    port: int, process: subprocess.Popen[bytes], *, chat: bool = True, seconds: float = 30.0
) -> None:
    """Until a chat request for llama3 answers 200 (the proxy has polled the inventory).

    With ``chat=False`` (the stall contenders, whose first chat request would pay the stall) until
    the model list names llama3.
    """
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process on port {port} exited with {process.returncode}")
        try:
            if not chat and b"llama3" in get(port, b"/api/tags"):
                time.sleep(0.5)  # let the inventory poll of the other node land too
                return
            if chat and http(port, b"/api/chat", CHAT, 2)[0].startswith(b"HTTP/1.1 200"):
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"port {port} not ready after {seconds} s")


def wrk_script(tmp: Path, body: bytes) -> Path:
    path = tmp / f"wrk-{abs(hash(body))}.lua"
    path.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = [[{body.decode()}]]\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        "done = function(s, latency, requests)\n"
        '  io.write(string.format("BENCHJSON {\\"requests\\":%d,\\"duration_us\\":%d,'
        '\\"bytes\\":%d,\\"socket_errors\\":%d,\\"status_errors\\":%d,\\"timeouts\\":%d,'
        '\\"p50_us\\":%d,\\"p99_us\\":%d}\\n", s.requests, s.duration, s.bytes,'
        " s.errors.connect + s.errors.read + s.errors.write, s.errors.status,"
        " s.errors.timeout, latency:percentile(50), latency:percentile(99)))\n"
        "end\n"
    )
    return path


def wrk(
    harness: Harness,
    port: int,
    path: str,
    body: bytes,
    connections: int,
    seconds: int,
    timeout: str = "5s",
) -> dict[str, Any]:
    script = wrk_script(harness.tmp, body)
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", f"--timeout={timeout}"]
    out = harness.loadgen(
        [*argv, "-s", str(script), f"http://127.0.0.1:{port}{path}"], seconds + 60
    )
    for line in out.splitlines():
        if line.startswith("BENCHJSON "):
            result: dict[str, Any] = json.loads(line[len("BENCHJSON ") :])
            result["rps"] = result["requests"] / (result["duration_us"] / 1e6)
            return result
    raise RuntimeError(f"wrk printed no result: {out[-500:]}")


def hey(harness: Harness, port: int, body: bytes, count: int) -> dict[str, Any]:
    argv = ["hey", "-n", str(count), "-c", "32", "-m", "POST", "-T", "application/json"]
    out = harness.loadgen([*argv, "-d", body.decode(), f"http://127.0.0.1:{port}/api/chat"], 600)
    ok = sum(
        int(line.split()[1])
        for line in out.splitlines()
        if line.strip().startswith("[200]") and "responses" in line
    )
    return {"requests": count, "ok": ok}


@contextmanager
def running(
    mode: Mode, pin: bool, skip_nginx: str | None
) -> Iterator[tuple[Harness, dict[str, Server]]]:
    """Start the upstreams and every contender; stop them all on the way out."""
    harness = Harness(Path(tempfile.mkdtemp(prefix="nvpair-bench-")), pin)
    try:
        servers: dict[str, Server] = {}
        up, frozen = free_port(), free_port()
        upstream = harness.spawn(
            "upstream", [PY, str(BENCH / "upstream.py"), str(up), "--slow-chunks", "30"]
        )
        servers["direct"] = Server("direct", up, upstream)
        harness.spawn("frozen", [PY, str(BENCH / "upstream.py"), str(frozen), "--frozen"])
        wait_ready(up, upstream)

        def nvpair(name: str, nodes: list[str], extra: list[str]) -> Server:
            port = free_port()
            # --assemble off: the relay is compared with RPR and nginx, which never assemble (and the
            # fast engine answers a stream on /api/chat as SSE); bench/assembly.py measures assembly.
            argv = [PY, "-m", "twisted", "nvpair", "--engine", "ollama", "--assemble", "off"]
            argv += ["--usage-db", "none"]
            argv += ["--listen", f"tcp:{port}:interface=127.0.0.1:backlog=4096"]
            argv += [a for node in nodes for a in ("--node", node)]
            argv += ["--admin", "none", "--log-level", "warn", "--max-connections", "4096"]
            return Server(name, port, harness.spawn(name, [*argv, *extra]))

        servers["nvpair-tw"] = nvpair("nvpair-tw", [f"a=http://127.0.0.1:{up}"], [])
        servers["nvpair-stall"] = nvpair(
            "nvpair-stall",
            [f"a=http://127.0.0.1:{frozen}", f"b=http://127.0.0.1:{up}"],
            ["--response-header-timeout", f"{HEADER_TIMEOUT:g}s"],
        )
        rpr = free_port()
        servers["rpr"] = Server(
            "rpr", rpr, harness.spawn("rpr", [PY, str(BENCH / "rpr.py"), str(rpr), str(up)])
        )
        if skip_nginx is None:
            port, stall = free_port(), free_port()
            conf = nginx_conf(harness.tmp, up, frozen, port, stall)
            argv = ["nginx", "-p", str(harness.tmp), "-c", str(conf), "-e", "stderr"]
            process = harness.spawn("nginx", argv)
            servers["nginx"] = Server("nginx", port, process)
            servers["nginx-stall"] = Server("nginx-stall", stall, process)
        for name, server in servers.items():
            wait_ready(server.port, server.process, chat=not name.endswith("-stall"))
        yield harness, servers
    finally:
        harness.stop()
        shutil.rmtree(harness.tmp, ignore_errors=True)


def nginx_conf(tmp: Path, up: int, frozen: int, port: int, stall: int) -> Path:
    proxy = (
        'proxy_http_version 1.1; proxy_set_header Connection ""; '
        "proxy_buffering off; proxy_request_buffering off;"
    )
    user = "user root;" if os.geteuid() == 0 else ""
    text = f"""
{user}
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
worker_rlimit_nofile 16384;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fcgi; uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
  upstream engine {{ server 127.0.0.1:{up}; keepalive 64; }}
  upstream stall {{
    server 127.0.0.1:{frozen} max_fails=1 fail_timeout=60s;
    server 127.0.0.1:{up} backup;
    keepalive 16;
  }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location / {{ proxy_pass http://engine; {proxy} proxy_read_timeout 120s; }}
  }}
  server {{
    listen 127.0.0.1:{stall};
    location / {{
      proxy_pass http://stall; {proxy}
      proxy_read_timeout {HEADER_TIMEOUT:g}s;
      proxy_next_upstream error timeout non_idempotent;
    }}
  }}
}}
"""
    path = tmp / "nginx.conf"
    path.write_text(text)
    return path


def ensure_tools() -> str | None:
    """Install wrk, hey and nginx when missing; return why nginx is skipped, if it is."""
    missing = [tool for tool in ("wrk", "hey", "nginx") if shutil.which(tool) is None]
    packages = {"wrk": "wrk", "hey": "hey", "nginx": "nginx-light"}
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        print(f"installing {', '.join(missing)} with apt-get", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", *(packages[t] for t in missing)],
            env=env,
            check=False,
        )
    for tool in ("wrk", "hey"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is required (apt-get install -y {tool})")
    if shutil.which("nginx") is None:
        return "nginx is not installed and apt-get could not install it"
    return None


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def scenario_small(
    harness: Harness, servers: dict[str, Server], names: Sequence[str], mode: Mode
) -> dict[str, Any]:
    """Scenario 1 and 5: latency at c=1, throughput and CPU per 1,000 requests at c=32."""
    rows: dict[str, dict[str, list[float]]] = {
        n: {"p50": [], "p99": [], "rps": [], "cpu": [], "errors": []} for n in names
    }
    for round_ in range(mode.rounds):
        for name in names:
            server = servers[name]
            print(f"  round {round_ + 1}: {name}", flush=True)
            c1 = wrk(harness, server.port, "/api/chat", CHAT, 1, mode.latency_seconds)
            before = server.cpu()
            c32 = wrk(harness, server.port, "/api/chat", CHAT, 32, mode.throughput_seconds)
            cpu = server.cpu() - before
            row = rows[name]
            row["p50"].append(c1["p50_us"] / 1000)
            row["p99"].append(c1["p99_us"] / 1000)
            row["rps"].append(c32["rps"])
            row["cpu"].append(cpu / max(c32["requests"], 1) * 1000)
            errors = c1["socket_errors"] + c1["status_errors"] + c32["socket_errors"]
            row["errors"].append(errors + c32["status_errors"] + c32["timeouts"] + c1["timeouts"])
    return {
        n: {
            "p50_ms": median(r["p50"]),
            "p99_ms": median(r["p99"]),
            "rps_c32": median(r["rps"]),
            "cpu_s_per_1000": median(r["cpu"]),
            "errors": sum(r["errors"]),
            "samples": r,
        }
        for n, r in rows.items()
    }


def scenario_stream(
    harness: Harness, servers: dict[str, Server], names: Sequence[str], mode: Mode
) -> dict[str, Any]:
    """Scenario 2: time to the first SSE event, and SSE chunks relayed per second at c=4."""
    out: dict[str, Any] = {}
    for name in names:
        port = servers[name].port
        print(f"  streaming: {name}", flush=True)
        firsts, totals, events = [], [], []
        for _ in range(mode.ttfb_requests):
            firsts.append(first_event(port) * 1000)
            response, _, total = http(port, b"/v1/chat/completions", STREAM)
            totals.append(total * 1000)
            events.append(response.count(b"data: "))
        run = wrk(harness, port, "/v1/chat/completions", STREAM, 4, mode.stream_seconds)
        out[name] = {
            "ttfb_ms": median(firsts),
            "stream_total_ms": median(totals),
            "events_per_stream_min": min(events),
            "chunks_per_s": run["rps"] * CHUNKS,
            "streams_per_s": run["rps"],
            "bytes_per_stream": run["bytes"] / max(run["requests"], 1),
            "errors": run["socket_errors"] + run["status_errors"] + run["timeouts"],
        }
    return out


def sequential(port: int, count: int) -> tuple[float, int]:
    """Seconds for ``count`` sequential chats, each with its own prompt (no affinity hits)."""
    start = time.perf_counter()
    ok = 0
    for i in range(count):
        body = CHAT.replace(b'"content":"hi"', b'"content":"hi %d"' % i)
        response = http(port, b"/api/chat", body)[0]
        ok += response.startswith(b"HTTP/1.1 200")
    return time.perf_counter() - start, ok


def scenario_stall(servers: dict[str, Server]) -> dict[str, Any]:
    """Scenario 3: 20 sequential requests with candidates [frozen, healthy]."""
    healthy, healthy_ok = sequential(servers["nvpair-tw"].port, STALL_REQUESTS)
    out: dict[str, Any] = {
        "healthy_total_s": healthy,
        "healthy_ok": healthy_ok,
        "budget_s": HEADER_TIMEOUT + healthy,
        "no_cooldown_s": STALL_REQUESTS * HEADER_TIMEOUT + healthy,
    }
    for name in ("nvpair-stall", "nginx-stall"):
        if name in servers:
            print(f"  stall: {name}", flush=True)
            total, ok = sequential(servers[name].port, STALL_REQUESTS)
            out[name] = {"total_s": total, "ok": ok}
    return out


def scenario_memory(
    harness: Harness, servers: dict[str, Server], names: Sequence[str], mode: Mode
) -> dict[str, Any]:
    """Scenario 4: RSS growth across many requests after warm-up; RSS per open stream."""
    out: dict[str, Any] = {}
    for name in names:
        server = servers[name]
        print(f"  memory: {name}", flush=True)
        hey(harness, server.port, CHAT, mode.warmup_requests)
        rss0 = server.rss()
        cpu0 = server.cpu()
        run = hey(harness, server.port, CHAT, mode.growth_requests)
        cpu = server.cpu() - cpu0
        rss1 = server.rss()
        idle = server.rss()
        fds0 = open_fds(server.pids())
        argv = ["wrk", "-t1", f"-c{OPEN_STREAMS}", f"-d{mode.open_seconds}s", "--timeout=60s"]
        script = wrk_script(harness.tmp, SLOW)
        url = f"http://127.0.0.1:{server.port}/v1/chat/completions"
        argv = [*argv, "-s", str(script), url]
        if harness.pin:
            argv = ["taskset", "-c", "1", *argv]
        client = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        peak, peak_fds = idle, fds0
        try:
            deadline = time.monotonic() + mode.open_seconds - 1
            while time.monotonic() < deadline:
                time.sleep(0.5)
                peak = max(peak, server.rss())
                peak_fds = max(peak_fds, open_fds(server.pids()))
        finally:
            client.wait(timeout=mode.open_seconds + 30)
        out[name] = {
            "rss_before_kib": rss0,
            "rss_after_kib": rss1,
            "growth_requests": mode.growth_requests,
            "growth_ok": run["ok"],
            "growth_pct": (rss1 - rss0) / rss0 * 100,
            "cpu_s_per_1000_hey": cpu / mode.growth_requests * 1000,
            "rss_idle_kib": idle,
            "rss_open_kib": peak,
            "open_fds_extra": peak_fds - fds0,
            "kib_per_stream": (peak - idle) / OPEN_STREAMS,
        }
        time.sleep(1)
    return out


def profile(harness: Harness, server: Server, seconds: int, dest: Path) -> Path | None:
    """py-spy (if installed) on nvpair-tw during a c=32 run: collapsed stacks."""
    spy = shutil.which("py-spy") or str(Path(PY).with_name("py-spy"))
    if not Path(spy).exists():
        print("  profile skipped: py-spy not installed", flush=True)
        return None
    out = dest.with_suffix(".pyspy.txt")
    argv = [spy, "record", "-p", str(server.process.pid), "-d", str(seconds), "-f", "raw"]
    recorder = subprocess.Popen(
        [*argv, "-o", str(out), "-r", "200"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wrk(harness, server.port, "/api/chat", CHAT, 32, seconds)
    recorder.wait(timeout=seconds + 30)
    return out


def summarise_profile(path: Path, top: int = 30) -> list[str]:
    """The reactor thread's hottest frames, inclusive, as percentages of its samples."""
    inclusive: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if any("threading.py" in f for f in frames):
            continue  # idle thread-pool workers
        total += int(count)
        for frame in set(frames):
            if "nvpair_tw" in frame or "twisted/web" in frame or "logger" in frame:
                inclusive[frame] = inclusive.get(frame, 0) + int(count)
    ranked = sorted(inclusive.items(), key=lambda item: -item[1])[:top]
    return [f"{n / max(total, 1) * 100:5.1f}% {frame}" for frame, n in ranked]


def fmt(value: float, digits: int = 2) -> str:
    return "n/a" if value != value else f"{value:,.{digits}f}"


def table(results: dict[str, Any]) -> str:
    small, stream, memory = results["small"], results["stream"], results["memory"]
    stall = results["stall"]
    direct = small["direct"]
    lines = [
        "| contender | added p50 ms (c=1) | added p99 ms (c=1) | req/s c=32 | x RPR | x nginx "
        "| CPU s / 1k req | added first-event ms | SSE chunks/s | KiB / open stream | RSS growth % |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in results["contenders"]:
        row = small[name]
        added = "—" if name == "direct" else fmt(row["p50_ms"] - direct["p50_ms"], 3)
        added99 = "—" if name == "direct" else fmt(row["p99_ms"] - direct["p99_ms"], 3)
        x_rpr = row["rps_c32"] / small["rpr"]["rps_c32"]
        x_nginx = row["rps_c32"] / small["nginx"]["rps_c32"] if "nginx" in small else float("nan")
        s = stream[name]
        ttfb = "—" if name == "direct" else fmt(s["ttfb_ms"] - stream["direct"]["ttfb_ms"], 3)
        mem = memory.get(name)
        lines.append(
            f"| {LABELS[name]} | {added} | {added99} | {fmt(row['rps_c32'], 0)} | {fmt(x_rpr)} "
            f"| {fmt(x_nginx)} | {fmt(row['cpu_s_per_1000'], 3)} | {ttfb} "
            f"| {fmt(s['chunks_per_s'], 0)} | {fmt(mem['kib_per_stream'], 1) if mem else '—'} "
            f"| {fmt(mem['growth_pct'], 1) if mem else '—'} |"
        )
    lines += [
        "",
        "| contender | p50 ms (c=1) | p99 ms (c=1) | first SSE event ms | 1,000-chunk burst ms "
        "| errors |",
        "|---|---|---|---|---|---|",
    ]
    for name in results["contenders"]:
        row, s = small[name], stream[name]
        lines.append(
            f"| {LABELS[name]} | {fmt(row['p50_ms'], 3)} | {fmt(row['p99_ms'], 3)} "
            f"| {fmt(s['ttfb_ms'], 3)} | {fmt(s['stream_total_ms'], 3)} "
            f"| {row['errors'] + s['errors']} |"
        )
    lines.append("")
    lines.append(
        f"Stall recovery ({STALL_REQUESTS} sequential requests, candidates [frozen, healthy], "
        f"{HEADER_TIMEOUT:g} s header timeout): healthy-only {fmt(stall['healthy_total_s'])} s; "
        f"budget (1 timeout + healthy) {fmt(stall['budget_s'])} s; "
        f"a proxy without cooldown {fmt(stall['no_cooldown_s'])} s."
    )
    for name in ("nvpair-stall", "nginx-stall"):
        if name in stall:
            lines.append(
                f"- {name.replace('-stall', '')}: {fmt(stall[name]['total_s'])} s "
                f"({stall[name]['ok']}/{STALL_REQUESTS} answered 200)"
            )
    return "\n".join(lines)


def targets(results: dict[str, Any]) -> list[str]:
    small, memory, stall = results["small"], results["memory"], results["stall"]
    nv, direct = small["nvpair-tw"], small["direct"]
    checks: list[tuple[str, float, float, Callable[[float, float], bool]]] = [
        ("added p50 at c=1 (ms) ≤", nv["p50_ms"] - direct["p50_ms"], 1.0, lambda a, b: a <= b),
        ("added p99 at c=1 (ms) ≤", nv["p99_ms"] - direct["p99_ms"], 3.0, lambda a, b: a <= b),
        (
            "throughput c=32 x RPR ≥",
            nv["rps_c32"] / small["rpr"]["rps_c32"],
            1.5,
            lambda a, b: a >= b,
        ),
    ]
    if "nvpair-stall" in stall:
        checks.append(
            (
                "stall recovery (s) ≤",
                stall["nvpair-stall"]["total_s"],
                stall["budget_s"],
                lambda a, b: a <= b,
            )
        )
    if "nvpair-tw" in memory:
        mem = memory["nvpair-tw"]
        checks.append(("KiB per open stream ≤", mem["kib_per_stream"], 64.0, lambda a, b: a <= b))
        checks.append(("RSS growth % ≤", mem["growth_pct"], 5.0, lambda a, b: a <= b))
    return [
        f"- {'MET ' if ok(value, limit) else 'MISSED'} {label} {limit:.3g}: {value:.3g}"
        for label, value, limit, ok in checks
    ]


def chart(results: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("chart skipped: matplotlib is not installed", flush=True)
        return
    small = results["small"]
    names = results["contenders"]
    proxies = [n for n in names if n != "direct"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.38
    xs = range(len(proxies))
    direct = small["direct"]
    left.bar(
        [x - width / 2 for x in xs],
        [small[n]["p50_ms"] - direct["p50_ms"] for n in proxies],
        width,
        label="p50",
    )
    left.bar(
        [x + width / 2 for x in xs],
        [small[n]["p99_ms"] - direct["p99_ms"] for n in proxies],
        width,
        label="p99",
    )
    left.set_xticks(list(xs), [LABELS[n] for n in proxies], fontsize=8)
    left.set_ylabel("ms added over direct")
    left.set_title("Added latency, small POST, concurrency 1")
    left.legend()
    right.bar([LABELS[n] for n in names], [small[n]["rps_c32"] for n in names], color="tab:green")
    right.set_yscale("log")
    right.set_ylabel("requests / s (log)")
    right.set_title("Throughput, small POST, concurrency 32")
    right.tick_params(axis="x", labelsize=8)
    for i, n in enumerate(names):
        right.annotate(
            f"{small[n]['rps_c32']:,.0f}",
            (i, small[n]["rps_c32"]),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    fig.suptitle(
        f"nvpair-tw benchmark ({results['mode']} run, medians of {results['rounds']} rounds)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"chart written to {path}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a ~2-minute smoke run")
    parser.add_argument("--profile", action="store_true", help="py-spy nvpair-tw at c=32")
    parser.add_argument("--no-nginx", action="store_true", help="skip the nginx contender")
    parser.add_argument("--chart", type=Path, default=REPO / "docs" / "performance.png")
    args = parser.parse_args()
    mode = QUICK if args.quick else FULL
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 16384), hard), hard))
    skip_nginx = "--no-nginx given" if args.no_nginx else ensure_tools()
    if skip_nginx:
        print(f"nginx contender skipped: {skip_nginx}", flush=True)
    cores = os.sched_getaffinity(0)
    pin = shutil.which("taskset") is not None and {0, 1} <= cores
    if pin:
        os.sched_setaffinity(0, {1})
    print(
        f"pinning: {'servers on core 0, load generators on core 1' if pin else 'off'}", flush=True
    )
    started = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started))
    results_dir = BENCH / "results"
    results_dir.mkdir(exist_ok=True)
    dest = results_dir / f"{stamp}.json"
    with running(mode, pin, skip_nginx) as (harness, servers):
        names = [n for n in CONTENDERS if n in servers]
        print("scenario 1/5: small POST", flush=True)
        small = scenario_small(harness, servers, names, mode)
        print("scenario 2: streaming", flush=True)
        stream = scenario_stream(harness, servers, names, mode)
        print("scenario 3: stall recovery", flush=True)
        stall = scenario_stall(servers)
        print("scenario 4: memory", flush=True)
        memory = scenario_memory(harness, servers, [n for n in names if n != "direct"], mode)
        spy = profile(harness, servers["nvpair-tw"], 10, dest) if args.profile else None
    results: dict[str, Any] = {
        "mode": "quick" if args.quick else "full",
        "rounds": mode.rounds,
        "started": stamp,
        "seconds": time.time() - started,
        "pinned": pin,
        "nginx_skipped": skip_nginx,
        "mode_sizes": mode.__dict__,
        "contenders": names,
        "small": small,
        "stream": stream,
        "stall": stall,
        "memory": memory,
        "profile": str(spy) if spy else None,
        "profile_top": summarise_profile(spy) if spy else [],
    }
    results["targets"] = targets(results)
    dest.write_text(json.dumps(results, indent=2))
    print()
    print(table(results))
    print()
    print("Targets (nvpair-tw):")
    print("\n".join(results["targets"]))
    if results["profile_top"]:
        print("\nnvpair-tw profile at c=32 (reactor thread, inclusive):")
        print("\n".join(results["profile_top"]))
    print(f"\nresults written to {dest} ({results['seconds']:.0f} s)")
    chart(results, args.chart)


if __name__ == "__main__":
    main()
