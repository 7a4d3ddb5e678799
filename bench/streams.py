"""Many slow streams and relay cost (issue 16): direct vs nvpair-tw vs ReverseProxyResource vs nginx.

``python bench/streams.py [--quick] [--streams 500,1000,2000] [--seconds 30] [--no-nginx]
[--contenders direct,nvpair-tw,rpr,nginx]`` builds ``bench/streamgen.c`` (a paced token engine and an
epoll load generator in C), starts the engine and every contender in front of it, and measures

- **slow streams**: N concurrent SSE (``/v1/chat/completions``) and NDJSON (``/api/chat``) streams
  at 20 tokens/s; the inter-token latency added by each proxy (client receive time minus the
  engine's send stamp in each event, minus direct's), the proxy's CPU % and RSS per open stream;
- **relay cost**: one and 64 keep-alive connections asking for 1,000-event bursts back to back;
  chunks relayed per second and proxy CPU microseconds per chunk.

The engine and the load generator run on core 1, every proxy alone on core 0 (see
docs/performance.md, "Many slow streams and relay cost"). Prints Markdown tables, writes
``bench/results/streams-<UTC timestamp>.json`` and draws ``docs/performance-streams.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from run import BENCH, LABELS, PY, REPO, Harness, Server, fmt, free_port, open_fds, proc_stat

RATE = 20  # tokens per second per slow stream
FRAMINGS = {"sse": "/v1/chat/completions", "ndjson": "/api/chat"}
CONTENDERS = ("direct", "nvpair-tw", "nvpair-agent", "rpr", "nginx")
RELAY_EVENTS = 1000  # events per burst response in the relay scenario
RELAY_CONNS = (1, 64)
# Events per engine write in a burst. One send per event costs the engine ~2-6 µs of syscall and
# loopback delivery per event, which caps the engine + client core at ~250-350k events/s: below
# what nginx relays, so the generator would be the limit. 50 events (~10 KiB) per send lifts that
# ceiling to ~1M/s; every event is still its own HTTP chunk. --relay-batch 1 restores per-event sends.
RELAY_BATCH = 50
# Core 1 (engine + client) at least this busy: the generator may have been the limit.
GENERATOR_BOUND = 90.0
# A socket its process still holds: ESTABLISHED, SYN_RECV, CLOSE_WAIT (/proc/net/tcp states).
HELD = {"01", "03", "08"}
FD_SLACK = 8
SETTLE_TIMEOUT = 120.0


@dataclass(frozen=True)
class Mode:
    """Sizes of one run; --quick shrinks them."""

    streams: tuple[int, ...]
    ramp: float  # seconds over which the N streams are opened
    warm: float  # seconds after the ramp before the window opens
    window: float  # seconds of latency samples, CPU and RSS
    margin: float  # every stream outlives the window by at least this much
    relay_seconds: float

    @property
    def events(self) -> int:
        """Events per slow stream: the first stream opened still runs `margin` s after the window."""
        return int(RATE * (self.ramp + self.warm + self.window + self.margin))

    @property
    def client_timeout(self) -> float:
        """The load generator gives up here; streams not finished by then count as errors."""
        return self.ramp + 2 * self.events / RATE + 10


FULL = Mode((500, 1000, 2000), 2.0, 2.0, 30.0, 2.0, 5.0)
QUICK = Mode((500, 2000), 2.0, 1.0, 5.0, 1.0, 3.0)


# ------------------------------------------------------------------------------------ processes


def build_streamgen(tmp: Path) -> Path:
    binary = tmp / "streamgen"
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("a C compiler (cc) is required to build bench/streamgen.c")
    subprocess.run([cc, "-O2", "-o", str(binary), str(BENCH / "streamgen.c")], check=True)
    return binary


def ensure_nginx() -> str | None:
    """Install nginx when missing (root + apt-get); return why it is skipped, if it is."""
    if shutil.which("nginx") is None and os.geteuid() == 0 and shutil.which("apt-get"):
        print("installing nginx-light with apt-get", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False)
        subprocess.run(["apt-get", "install", "-y", "-qq", "nginx-light"], env=env, check=False)
    if shutil.which("nginx") is None:
        return "nginx is not installed and apt-get could not install it"
    return None


def nginx_conf(tmp: Path, up: int, port: int, streams: int) -> Path:
    """One worker, relay unbuffered, keep-alive upstream (as bench/run.py), room for `streams`."""
    connections = max(8192, 2 * streams + 1024)  # a client and an upstream socket per stream
    user = "user root;" if os.geteuid() == 0 else ""
    text = f"""
{user}
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
worker_rlimit_nofile {2 * connections};
events {{ worker_connections {connections}; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fcgi; uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
  upstream engine {{ server 127.0.0.1:{up}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location / {{
      proxy_pass http://engine; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_buffering off; proxy_request_buffering off; proxy_read_timeout 300s;
    }}
  }}
}}
"""
    path = tmp / "nginx-streams.conf"
    path.write_text(text)
    return path


def pinned(harness: Harness, argv: list[str]) -> list[str]:
    return ["taskset", "-c", "1", *argv] if harness.pin else argv


def client(harness: Harness, argv: list[str]) -> subprocess.Popen[bytes]:
    """A load generator on core 1; registered so that it is killed if the run is interrupted."""
    process = subprocess.Popen(
        pinned(harness, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    harness.servers.append(process)
    return process


def reap(process: subprocess.Popen[bytes]) -> tuple[dict[str, Any], float]:
    """(the client's JSON line, its user+system CPU seconds from its rusage)."""
    assert process.stdout is not None and process.stderr is not None
    out = process.stdout.read().decode(errors="replace")
    err = process.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    for line in out.splitlines():
        if line.startswith("{"):
            result: dict[str, Any] = json.loads(line)
            return result, usage.ru_utime + usage.ru_stime
    raise RuntimeError(f"streamgen printed no result (exit {process.returncode}): {err[-500:]}")


def probe(harness: Harness, streamgen: Path, port: int, path: str) -> bool:
    """One burst stream of 5 events through `port` answers 200 and ends properly."""
    argv = [str(streamgen), "load", str(port), path, "1", "0", "5", "0", "0", "0", "5"]
    done = subprocess.run(pinned(harness, argv), capture_output=True, timeout=30, check=False)
    try:
        result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        return False
    return bool(result["completed"] == 1 and result["errors"] == 0)


def wait_ready(bench: Bench, server: Server, seconds: float = 30.0) -> None:
    """Until both framings stream through `server` (nvpair-tw: once it has polled the inventory)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.process.returncode}")
        if all(
            probe(bench.harness, bench.streamgen, server.port, path) for path in FRAMINGS.values()
        ):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{server.name} on port {server.port} not ready after {seconds} s")


@dataclass
class Bench:
    """The harness, the streamgen binary, the engine, and how to start each contender."""

    harness: Harness
    streamgen: Path
    max_streams: int
    engine: Server | None = None

    def start_engine(self) -> Server:
        """A fresh engine on core 1 (the previous one, if any, stopped first)."""
        if self.engine is not None:
            halt(self.engine)
        port = free_port()
        argv = [str(self.streamgen), "serve", str(port)]
        self.engine = Server("direct", port, self.harness.spawn("engine", argv, core=1))
        wait_ready(self, self.engine)
        return self.engine

    def start(self, name: str) -> Server:
        """A fresh contender in front of the current engine, on core 0, ready to stream."""
        assert self.engine is not None
        if name == "direct":
            return self.engine
        up, port = self.engine.port, free_port()
        if name in ("nvpair-tw", "nvpair-agent"):
            # --assemble off: the relay is compared with RPR and nginx, which never assemble.
            # nvpair-agent: the same proxy over Twisted's stock Agent (--upstream-client twisted).
            argv = [PY, "-m", "twisted", "nvpair", "--engine", "ollama", "--assemble", "off"]
            argv += ["--usage-db", "none"]
            argv += ["--listen", f"tcp:{port}:interface=127.0.0.1:backlog=4096"]
            argv += ["--node", f"a=http://127.0.0.1:{up}", "--admin", "none", "--log-level"]
            argv += ["warn", "--max-connections", str(max(8192, 4 * self.max_streams))]
            if name == "nvpair-agent":
                argv += ["--upstream-client", "twisted"]
        elif name == "rpr":
            argv = [PY, str(BENCH / "rpr.py"), str(port), str(up)]
        else:
            conf = nginx_conf(self.harness.tmp, up, port, self.max_streams)
            argv = ["nginx", "-p", str(self.harness.tmp), "-c", str(conf), "-e", "stderr"]
        server = Server(name, port, self.harness.spawn(name, argv))
        wait_ready(self, server)
        return server


def halt(server: Server) -> None:
    """Stop one process (nginx: its master, which stops its worker) and reap it."""
    if server.process.poll() is None:
        server.process.terminate()
        try:
            server.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


@contextmanager
def running(pin: bool, max_streams: int) -> Iterator[Bench]:
    """Build streamgen and start the engine; every process started is stopped on the way out."""
    harness = Harness(Path(tempfile.mkdtemp(prefix="nvpair-streams-")), pin)
    try:
        bench = Bench(harness, build_streamgen(harness.tmp), max_streams)
        bench.start_engine()
        yield bench
    finally:
        harness.stop()
        shutil.rmtree(harness.tmp, ignore_errors=True)


# ------------------------------------------------------------------------------------- sockets


def tcp_sockets() -> list[tuple[int, int, str]]:
    """(local port, remote port, state) of every IPv4 TCP socket (/proc/net/tcp)."""
    rows = []
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            rows.append((int(fields[1][-4:], 16), int(fields[2][-4:], 16), fields[3]))
    return rows


def settle(server: Server, engine: Server, fd_base: int) -> tuple[float, bool]:
    """Until the previous run's sockets are closed: (seconds waited, whether it happened).

    The proxy holds no client socket on its port any more, the engine holds no socket but those of
    a proxy's idle keep-alive pool, and the proxy's descriptors are back to its idle count plus
    those pooled connections.
    """
    start = time.monotonic()
    while True:
        rows = tcp_sockets()
        pooled = sum(1 for _, remote, state in rows if remote == engine.port and state == "01")
        at_engine = sum(1 for local, _, state in rows if local == engine.port and state in HELD)
        clients = 0
        if server is not engine:
            clients = sum(1 for local, _, state in rows if local == server.port and state in HELD)
        fds = open_fds(server.pids())
        if not clients and at_engine <= pooled and fds <= fd_base + pooled + FD_SLACK:
            return time.monotonic() - start, True
        if time.monotonic() - start > SETTLE_TIMEOUT:
            print(
                f"    warning: {server.name} not settled after {SETTLE_TIMEOUT:g} s "
                f"(client sockets {clients}, engine sockets {at_engine}, pooled {pooled}, "
                f"fds {fds} vs idle {fd_base})",
                flush=True,
            )
            return time.monotonic() - start, False
        time.sleep(0.1)


# ----------------------------------------------------------------------------------- scenarios


def cpu_of(pid: int) -> float:
    """CPU seconds of a child that may have exited (a zombie still has /proc/PID/stat).

    Not Popen.poll(): that would reap the child, and reap() needs its rusage from os.wait4.
    """
    try:
        return proc_stat(pid)[1]
    except OSError:
        return float("nan")


def sleep_until(deadline: float) -> None:
    remaining = deadline - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)


def core_times() -> list[tuple[int, int]]:
    """(busy, total) jiffies of each CPU (/proc/stat; idle and iowait are not busy)."""
    out = []
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3].isdigit():
            ticks = [int(v) for v in line.split()[1:]]
            out.append((sum(ticks) - ticks[3] - ticks[4], sum(ticks)))
    return out


def core_busy(before: list[tuple[int, int]], after: list[tuple[int, int]]) -> list[float]:
    """Busy % of each CPU between two core_times() samples (every process, ours or not)."""
    return [
        (b1 - b0) / max(t1 - t0, 1) * 100 for (b0, t0), (b1, t1) in zip(before, after, strict=True)
    ]


def others(busy: list[float], proxy_pct: float, core1_pct: float, direct: bool) -> dict[str, float]:
    """What else ran on the two cores during a measurement (the machine may be shared).

    /proc/stat's per-CPU busy time is tick-sampled and the processes' CPU is not, so on bursty
    network loads the "other" figures are only good to about ±25 points: enough to see a foreign
    process taking half a core, not more.
    """
    core1 = busy[1] if len(busy) > 1 else float("nan")
    return {
        "generator_bound": not direct and core1 >= GENERATOR_BOUND,
        "core0_busy_pct": busy[0],
        "core1_busy_pct": core1,
        # direct's "proxy" is the engine, on core 1: then nothing of ours is on core 0
        "core0_other_pct": busy[0] - (0.0 if direct else proxy_pct),
        "core1_other_pct": core1 - core1_pct,
    }


def slow_run(bench: Bench, server: Server, path: str, streams: int, mode: Mode) -> dict[str, Any]:
    """One load of `streams` slow streams through `server`; CPU and RSS over the window only."""
    assert bench.engine is not None
    engine = bench.engine
    fds0 = open_fds(server.pids())
    rss0 = server.rss()
    argv = [str(bench.streamgen), "load", str(server.port), path, str(streams), str(RATE)]
    argv += [str(mode.events), f"{mode.ramp:g}", f"{mode.warm:g}", f"{mode.window:g}"]
    argv += [f"{mode.client_timeout:g}"]
    started = time.monotonic()
    process = client(bench.harness, argv)
    opens = started + mode.ramp + mode.warm
    closes = opens + mode.window
    sleep_until(opens)
    cpu0, engine0, client0, cores0 = server.cpu(), engine.cpu(), cpu_of(process.pid), core_times()
    window0 = time.monotonic()
    peak_rss, peak_fds = rss0, fds0
    while time.monotonic() < closes:
        time.sleep(min(0.5, max(closes - time.monotonic(), 0)))
        peak_rss = max(peak_rss, server.rss())
        peak_fds = max(peak_fds, open_fds(server.pids()))
    cpu1, engine1, client1, cores1 = server.cpu(), engine.cpu(), cpu_of(process.pid), core_times()
    window = time.monotonic() - window0
    result, client_cpu = reap(process)
    wall = time.monotonic() - started
    expected = streams * RATE * mode.window
    proxy_pct = (cpu1 - cpu0) / window * 100
    engine_pct = (engine1 - engine0) / window * 100
    client_pct = (client1 - client0) / window * 100
    direct = server is engine
    return {
        **result,
        "errors_total": result["errors"] + result["unfinished"],
        "delivered_pct": result["samples"] / expected * 100,
        "proxy_cpu_pct": proxy_pct,
        "engine_cpu_pct": engine_pct,
        "client_cpu_pct_window": client_pct,
        "client_cpu_pct": client_cpu / wall * 100,
        "client_wall_s": wall,
        **others(core_busy(cores0, cores1), proxy_pct, engine_pct + client_pct, direct),
        "rss_before_kib": rss0,
        "rss_peak_kib": peak_rss,
        "kib_per_stream": (peak_rss - rss0) / streams,
        "fds_before": fds0,
        "fds_extra_peak": peak_fds - fds0,
    }


def relay_run(
    bench: Bench, server: Server, path: str, conns: int, seconds: float, batch: int
) -> dict[str, Any]:
    """`conns` keep-alive connections of back-to-back 1,000-event bursts for `seconds`."""
    assert bench.engine is not None
    engine = bench.engine
    argv = [str(bench.streamgen), "relay", str(server.port), path, str(conns), str(RELAY_EVENTS)]
    argv += [f"{seconds:g}", str(batch)]
    cpu0, engine0, cores0 = server.cpu(), engine.cpu(), core_times()
    started = time.monotonic()
    process = client(bench.harness, argv)
    result, client_cpu = reap(process)
    cpu, engine_cpu, cores1 = server.cpu() - cpu0, engine.cpu() - engine0, core_times()
    wall = time.monotonic() - started
    events = max(result["events"], 1)
    proxy_pct, engine_pct = cpu / wall * 100, engine_cpu / wall * 100
    client_pct = client_cpu / wall * 100
    direct = server is engine
    return {
        **result,
        "chunks_per_s": result["events"] / result["seconds"],
        "proxy_cpu_us_per_chunk": cpu / events * 1e6,
        "proxy_cpu_pct": proxy_pct,
        "engine_cpu_pct": engine_pct,
        "client_cpu_pct": client_pct,
        **others(core_busy(cores0, cores1), proxy_pct, engine_pct + client_pct, direct),
    }


def scenario_slow(bench: Bench, names: Sequence[str], mode: Mode) -> list[dict[str, Any]]:
    """Every framing and N; for each, every contender in turn (direct first), each one fresh.

    A fresh engine per framing and N, and a fresh proxy per run: RSS never falls back after a
    load (the allocator keeps what it freed), so "RSS before" must be a process that has not yet
    carried a larger load.
    """
    rows = []
    for framing, path in FRAMINGS.items():
        for streams in mode.streams:
            engine = bench.start_engine()
            engine_fds = open_fds(engine.pids())
            for name in names:
                server = bench.start(name)
                print(f"  slow {framing} N={streams}: {name}", end="", flush=True)
                row = slow_run(bench, server, path, streams, mode)
                # The run is over when the proxy has closed its sockets (it may still be
                # draining a backlog); then it is stopped and the engine must be idle again.
                waited, settled = settle(server, engine, row["fds_before"])
                if server is not engine:
                    halt(server)
                    settle(engine, engine, engine_fds)
                row.update(framing=framing, streams=streams, contender=name)
                row.update(settle_s=waited, settled=settled)
                print(
                    f" p50 {row['p50_us'] / 1000:.2f} ms, p99 {row['p99_us'] / 1000:.2f} ms, "
                    f"CPU {row['proxy_cpu_pct']:.0f} %, errors {row['errors_total']}, "
                    f"delivered {row['delivered_pct']:.0f} %, "
                    f"core 0 busy {row['core0_busy_pct']:.0f} %",
                    flush=True,
                )
                rows.append(row)
    for row in rows:
        base = find(rows, contender="direct", framing=row["framing"], streams=row["streams"])
        assert base is not None
        for q in ("p50", "p99", "max"):
            row[f"added_{q}_ms"] = (row[f"{q}_us"] - base[f"{q}_us"]) / 1000
    return rows


def scenario_relay(
    bench: Bench, names: Sequence[str], mode: Mode, batch: int
) -> list[dict[str, Any]]:
    """Every framing and connection count; every contender in turn on the same live processes."""
    engine = bench.start_engine()
    servers = {name: bench.start(name) for name in names}
    fd_base = {name: open_fds(server.pids()) for name, server in servers.items()}
    rows = []
    for framing, path in FRAMINGS.items():
        for conns in RELAY_CONNS:
            for name, server in servers.items():
                waited, settled = settle(server, engine, fd_base[name])
                row = relay_run(bench, server, path, conns, mode.relay_seconds, batch)
                row.update(framing=framing, contender=name, settle_s=waited, settled=settled)
                print(
                    f"  relay {framing} c={conns}: {name} {row['chunks_per_s']:,.0f} chunks/s, "
                    f"{row['proxy_cpu_us_per_chunk']:.2f} µs/chunk, errors {row['errors']}, "
                    f"core 0 busy {row['core0_busy_pct']:.0f} %",
                    flush=True,
                )
                rows.append(row)
    for server in servers.values():
        if server is not engine:
            halt(server)
    return rows


# -------------------------------------------------------------------------------------- output


def ratio(value: float, base: float | None) -> str:
    if base is None or base == 0 or value != value or base != base:
        return "n/a"
    return f"{value / base:.2f}"


def find(rows: list[dict[str, Any]], **key: Any) -> dict[str, Any] | None:
    return next((r for r in rows if all(r[k] == v for k, v in key.items())), None)


def label(row: dict[str, Any]) -> str:
    return LABELS[row["contender"]] + (" †" if row["generator_bound"] else "")


def slow_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| framing | streams | contender | p50 ms | p99 ms | max ms | added p50 ms "
        "| added p99 ms | added max ms | added p99 x RPR | proxy CPU % | CPU x RPR "
        "| KiB / stream | delivered % | errors | core 0 busy % |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        direct = row["contender"] == "direct"
        rpr = find(rows, framing=row["framing"], streams=row["streams"], contender="rpr")

        def added(q: str, row: dict[str, Any] = row, direct: bool = direct) -> str:
            return "—" if direct else fmt(row[f"added_{q}_ms"], 3)

        lines.append(
            f"| {row['framing']} | {row['streams']:,} | {label(row)} "
            f"| {fmt(row['p50_us'] / 1000, 3)} | {fmt(row['p99_us'] / 1000, 3)} "
            f"| {fmt(row['max_us'] / 1000, 1)} | {added('p50')} | {added('p99')} | {added('max')} "
            f"| {'—' if direct else ratio(row['added_p99_ms'], rpr and rpr['added_p99_ms'])} "
            f"| {fmt(row['proxy_cpu_pct'], 0)} "
            f"| {ratio(row['proxy_cpu_pct'], rpr and rpr['proxy_cpu_pct'])} "
            f"| {fmt(row['kib_per_stream'], 1)} | {fmt(row['delivered_pct'], 0)} "
            f"| {row['errors_total']} | {fmt(row['core0_busy_pct'], 0)} |"
        )
    return "\n".join(lines)


def generator_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| framing | streams | direct p99 ms | engine CPU % (window) | client CPU % (window) "
        "| client CPU % (whole run, rusage) | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row["contender"] == "direct":
            lines.append(
                f"| {row['framing']} | {row['streams']:,} | {fmt(row['p99_us'] / 1000, 3)} "
                f"| {fmt(row['engine_cpu_pct'], 1)} | {fmt(row['client_cpu_pct_window'], 1)} "
                f"| {fmt(row['client_cpu_pct'], 1)} | {row['errors_total']} |"
            )
    return "\n".join(lines)


def relay_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| framing | connections | contender | chunks/s | x RPR | proxy CPU µs / chunk | x RPR "
        "| proxy CPU % | client CPU % | errors | core 0 busy % |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        rpr = find(rows, framing=row["framing"], conns=row["conns"], contender="rpr")
        lines.append(
            f"| {row['framing']} | {row['conns']} | {label(row)} "
            f"| {fmt(row['chunks_per_s'], 0)} | {ratio(row['chunks_per_s'], rpr and rpr['chunks_per_s'])} "
            f"| {fmt(row['proxy_cpu_us_per_chunk'], 2)} "
            f"| {ratio(row['proxy_cpu_us_per_chunk'], rpr and rpr['proxy_cpu_us_per_chunk'])} "
            f"| {fmt(row['proxy_cpu_pct'], 0)} | {fmt(row['client_cpu_pct'], 0)} | {row['errors']} "
            f"| {fmt(row['core0_busy_pct'], 0)} |"
        )
    return "\n".join(lines)


FLOOR_MS = 0.01  # added latencies at or below this (noise, or negative) are drawn on the floor


def chart(results: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("chart skipped: matplotlib is not installed", flush=True)
        return
    rows = results["slow"]
    fig, panels = plt.subplots(1, len(FRAMINGS), figsize=(11, 4.4), sharey=True)
    for axis, framing in zip(panels, FRAMINGS, strict=True):
        for name in results["contenders"]:
            mine = sorted(
                (r for r in rows if r["framing"] == framing and r["contender"] == name),
                key=lambda r: r["streams"],
            )
            xs = [r["streams"] for r in mine]
            if name == "direct":
                ys = [r["p99_us"] / 1000 for r in mine]
                axis.plot(xs, ys, "k--", marker=".", label="direct p99 (the baseline, not added)")
            else:
                ys = [max(r["added_p99_ms"], FLOOR_MS) for r in mine]
                axis.plot(xs, ys, marker="o", label=LABELS[name])
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xticks(list(results["mode_sizes"]["streams"]))
        axis.set_xticklabels([f"{n:,}" for n in results["mode_sizes"]["streams"]])
        axis.minorticks_off()
        axis.set_xlabel(f"concurrent streams at {RATE} tokens/s")
        axis.set_title(f"{framing.upper()} ({FRAMINGS[framing]})")
        axis.grid(True, which="major", alpha=0.3)
    panels[0].set_ylabel(f"added p99 inter-token latency, ms (log; floor {FLOOR_MS:g})")
    panels[0].legend(fontsize=8)
    window = results["mode_sizes"]["window"]
    fig.suptitle(
        f"Added p99 inter-token latency vs streams ({results['mode']} run, {window:g} s window, "
        f"{results['started_utc']} UTC)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"chart written to {path}", flush=True)


# ---------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a ~4-minute smoke run")
    parser.add_argument("--streams", help="comma-separated stream counts (default 500,1000,2000)")
    parser.add_argument("--seconds", type=float, help="the measurement window per load")
    parser.add_argument("--no-nginx", action="store_true", help="skip the nginx contender")
    parser.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help="comma-separated subset of direct,nvpair-tw,nvpair-agent,rpr,nginx (direct always runs)",
    )
    parser.add_argument(
        "--relay-batch",
        type=int,
        default=RELAY_BATCH,
        help=f"events per engine write in the relay bursts, 1-64 (default {RELAY_BATCH})",
    )
    parser.add_argument("--only", choices=("slow", "relay"), help="run one scenario")
    parser.add_argument(
        "--chart",
        type=Path,
        default=REPO / "docs" / "performance-streams.png",
        help="where to draw the chart (default docs/performance-streams.png)",
    )
    args = parser.parse_args()
    mode = QUICK if args.quick else FULL
    if args.streams:
        mode = Mode(
            tuple(int(n) for n in args.streams.split(",")),
            mode.ramp,
            mode.warm,
            mode.window,
            mode.margin,
            mode.relay_seconds,
        )
    if args.seconds:
        mode = Mode(
            mode.streams, mode.ramp, mode.warm, args.seconds, mode.margin, mode.relay_seconds
        )
    wanted = {n.strip() for n in args.contenders.split(",")} | {"direct"}
    unknown = wanted - set(CONTENDERS)
    if unknown:
        raise SystemExit(f"unknown contenders: {', '.join(sorted(unknown))}")
    skip_nginx = None
    if "nginx" in wanted:
        skip_nginx = "--no-nginx given" if args.no_nginx else ensure_nginx()
        if skip_nginx:
            print(f"nginx contender skipped: {skip_nginx}", flush=True)
            wanted.discard("nginx")
    names = [n for n in CONTENDERS if n in wanted]
    # Every process spawned inherits this (streamgen also raises its own soft limit to the hard one).
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < 4 * max(mode.streams) + 1024:
        print(f"warning: RLIMIT_NOFILE hard limit {hard} is low for {max(mode.streams)} streams")
    cores = os.sched_getaffinity(0)
    pin = shutil.which("taskset") is not None and {0, 1} <= cores
    if pin:
        os.sched_setaffinity(0, {1})
    print(
        "pinning: "
        + (
            "each proxy alone on core 0; engine, load generator and harness on core 1"
            if pin
            else "off"
        ),
        flush=True,
    )
    # Unwind through running()'s finally, which stops every process: SIGTERM as an exit, SIGINT
    # as KeyboardInterrupt even when started with SIGINT ignored (a background job).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started))
    results_dir = BENCH / "results"
    results_dir.mkdir(exist_ok=True)
    dest = results_dir / f"streams-{stamp}.json"
    with running(pin, max(mode.streams)) as bench:
        print(
            f"slow streams: {RATE} tokens/s, {mode.events} events per stream, ramp {mode.ramp:g} s, "
            f"warm-up {mode.warm:g} s, window {mode.window:g} s",
            flush=True,
        )
        slow = scenario_slow(bench, names, mode) if args.only != "relay" else []
        relay = []
        if args.only != "slow":
            print(
                f"relay cost: {RELAY_EVENTS}-event bursts, {args.relay_batch} events per engine "
                f"write, {mode.relay_seconds:g} s each",
                flush=True,
            )
            relay = scenario_relay(bench, names, mode, args.relay_batch)
    results: dict[str, Any] = {
        "mode": "quick" if args.quick else "full",
        "started": stamp,
        "started_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)),
        "seconds": time.time() - started,
        "pinned": pin,
        "nginx_skipped": skip_nginx,
        "rate": RATE,
        "relay_batch": args.relay_batch,
        "relay_events": RELAY_EVENTS,
        "mode_sizes": {
            **asdict(mode),
            "events": mode.events,
            "client_timeout": mode.client_timeout,
        },
        "contenders": names,
        "slow": slow,
        "relay": relay,
    }
    dest.write_text(json.dumps(results, indent=2))
    if slow:
        print(
            "\nMany slow streams (latencies at the client; added = contender - direct, same N):\n"
        )
        print(slow_table(slow))
        print("\nLoad generator ceiling (the direct runs; engine and client share core 1):\n")
        print(generator_table(slow))
    if relay:
        print(
            f"\nRelay cost ({RELAY_EVENTS}-event bursts back to back per connection, "
            f"{args.relay_batch} events per engine write):\n"
        )
        print(relay_table(relay))
    if any(r["generator_bound"] for r in slow + relay):
        print(
            f"\n† core 1 (engine + load generator) was at least {GENERATOR_BOUND:g} % busy: "
            "the generator, not the proxy, may have been the limit in that run."
        )
    print(f"\nresults written to {dest} ({results['seconds']:.0f} s)")
    if slow:
        chart(results, args.chart)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("\ninterrupted: every process started was stopped", file=sys.stderr)
        sys.exit(130)
