"""The longest time the proxy's reactor is held while it takes a 32 MiB body (docs/behaviour.md
§14.1), measured inside the proxy: ``python bench/reactorhold.py``.

The proxy runs in this process (``nvpair_tw.testing.start_proxy``, assembly on as the ollama facade's
default) in front of the fast fake engine (``bench/upstream.py``); the large body is posted by a
child process, so no client thread competes for this interpreter's lock. A 1 ms heartbeat on the
reactor records the longest gap between two beats while each body is read, parsed, forwarded and
answered; a watchdog thread names the code running when a gap passes 20 ms. Unlike
``bench/bigbody.py`` (a small request's time, end to end), this figure does not depend on how the
machine's cores are shared between the client, the engine and the proxy.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from bigbody import SHAPES  # noqa: E402
from run import PY, free_port, wait_ready  # noqa: E402
from twisted.internet import reactor, task  # noqa: E402
from twisted.internet.defer import ensureDeferred  # noqa: E402
from twisted.internet.threads import deferToThread  # noqa: E402

from nvpair_tw.core import Settings  # noqa: E402
from nvpair_tw.nodes import Node  # noqa: E402
from nvpair_tw.testing import start_proxy  # noqa: E402

POST = """
import sys, socket
body = sys.stdin.buffer.read()
head = b"POST /api/chat HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\nContent-Length: %d\\r\\n\\r\\n" % len(body)
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=120) as s:
    s.sendall(head + body)
    answer = s.recv(12)
print(answer.decode(errors="replace"))
"""


class Heart:
    """The reactor's heartbeat, and the longest gap seen since :meth:`reset`."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.longest = 0.0
        self.where: list[tuple[float, str]] = []

    def beat(self) -> None:
        now = time.monotonic()
        self.longest = max(self.longest, now - self.last)
        self.last = now

    def reset(self) -> None:
        self.last, self.longest, self.where = time.monotonic(), 0.0, []

    def watch(self, main: int) -> None:
        seen = ""
        while True:
            time.sleep(0.005)
            lag = time.monotonic() - self.last
            if lag > 0.02:
                frame = sys._current_frames().get(main)
                stack = "".join(traceback.format_stack(frame, limit=6)[-3:])
                if stack != seen:
                    self.where.append((lag, stack))
                    seen = stack


async def measure(heart: Heart) -> list[tuple[str, float, str]]:
    up = free_port()
    env = {**os.environ, "PYTHONPATH": str(BENCH.parent)}
    engine = subprocess.Popen([PY, str(BENCH / "upstream.py"), str(up)], env=env)
    rows = []
    try:
        await deferToThread(wait_ready, up, engine)
        nodes = {"ollama": [Node("a", f"http://127.0.0.1:{up}")]}
        proxy = await start_proxy(reactor, nodes, Settings(max_body_size=64 << 20))
        port = proxy.ports["ollama"].getHost().port  # type: ignore[attr-defined]
        await deferToThread(wait_ready, port, engine)
        for shape, make in SHAPES.items():
            body = make()
            heart.reset()
            done = await deferToThread(
                subprocess.run, [PY, "-c", POST, str(port)], input=body, capture_output=True
            )
            where = heart.where[0][1].strip().splitlines()[-1] if heart.where else ""
            rows.append((shape, heart.longest * 1000, done.stdout.decode().strip() or where))
        await proxy.stop()
    finally:
        engine.terminate()
    return rows


def main() -> None:
    heart = Heart()
    task.LoopingCall(heart.beat).start(0.001)
    threading.Thread(target=heart.watch, args=(threading.main_thread().ident,), daemon=True).start()
    result: dict[str, Any] = {}

    def run() -> None:
        d = ensureDeferred(measure(heart))
        d.addBoth(lambda r: (result.setdefault("rows", r), reactor.stop()))  # type: ignore[attr-defined]

    reactor.callWhenRunning(run)  # type: ignore[attr-defined]
    reactor.run()  # type: ignore[attr-defined]
    print("| large body | longest reactor hold ms | answer |")
    print("|---|---|---|")
    for shape, longest, answer in result["rows"]:
        print(f"| {shape} | {longest:.1f} | {answer} |")


if __name__ == "__main__":
    main()
