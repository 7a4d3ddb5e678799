"""A loopback proxy over simulated engines whose nodes file has ``[[model]]`` tables, for the tests
of docs/behaviour.md §16.1 and §16.2 (real sockets: what a node receives is what went over TCP)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrs import define

from nvpair_tw.core import Settings
from nvpair_tw.runtime import build_runtime
from nvpair_tw.simulated import SimulatedEngine
from nvpair_tw.testing import ProxyCluster, ProxyHandle

__all__ = ["CataloguedCluster", "folded_duplicates"]


@define
class CataloguedCluster(ProxyCluster):
    """Engines listed in a nodes file (each with its ``models`` and ``kind``) plus ``tables``."""

    async def start_catalogued(
        self,
        engines: Mapping[str, SimulatedEngine],
        tables: str,
        directory: Path,
        *,
        settings: Settings | None = None,
        keys_file: str | None = None,
        node_lines: Mapping[str, str] | None = None,
    ) -> ProxyHandle:
        """Listen ``engines``, write the nodes file (``node_lines``: more lines of a node's
        table, by id), then start the proxy over it."""
        lines: list[str] = []
        for node_id, engine in engines.items():
            node = await self.add_engine(node_id, engine)
            lines += [
                "[[node]]",
                f'id = "{node_id}"',
                f'url = "{node.url}"',
                f"models = {json.dumps(list(engine.models))}",
                f'kind = "{engine.kind or "ollama"}"',
                (node_lines or {}).get(node_id, ""),
                "",
            ]
        path = directory / "nodes.toml"
        path.write_text("\n".join(lines) + "\n" + tables)
        runtime = build_runtime(
            self.reactor,
            settings if settings is not None else Settings(),
            [self.engine_name],
            nodes_file=str(path),
            environ={},
            keys_file=keys_file,
        )
        runtime.start()
        port = self.reactor.listenTCP(
            0, runtime.site_for(self.engine_name), backlog=16, interface="127.0.0.1"
        )
        self.proxy = ProxyHandle(runtime, {self.engine_name: runtime.self_guard.listened(port)})
        runtime.shared.bus.subscribe(self.events.append, name="test")
        return self.proxy

    def bodies(self, node_id: str) -> list[bytes]:
        """The POST bodies the engine of ``node_id`` received."""
        handle = next(h for h in self.handles if h.url == self._url_of(node_id))
        return [r.body for r in handle.engine.received if r.method == b"POST"]

    def _url_of(self, node_id: str) -> str:
        assert self.proxy is not None
        node = self.proxy.runtime.facades[self.engine_name].directory.get(node_id)
        assert node is not None
        return node.url


def folded_duplicates(body: bytes) -> list[str]:
    """The top-level keys of ``body`` that equal an earlier one under ``casefold()``."""
    seen: set[str] = set()
    repeated: list[str] = []

    top: list[tuple[str, Any]] = json.loads(body, object_pairs_hook=lambda items: items)
    for key, _ in top:
        if key.casefold() in seen:
            repeated.append(key)
        seen.add(key.casefold())
    return repeated
