# -*- test-case-name: tests.app.test_summary -*-
"""The start-up summary (docs/operations.md, "Logs"): once every listener listens, a few lines
say where clients should point (each facade's URL and its ``/v1``), which nodes each facade has
and of which kind, where the status page and the control channel are, the key names and their
count, the state store and the usage database.

Nothing secret is in it: node URLs without userinfo, no key (only names: a key of the environment
is ``key-`` and 8 hex digits of its digest), the state store's URL with its password replaced.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from twisted.application import service
from twisted.internet.defer import gatherResults
from twisted.python.failure import Failure

from nvpair_tw._version import __version__
from nvpair_tw.app._config import Config
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.runtime import ListenerService, Runtime, client_url, openai_url

__all__ = ["announce_when_listening", "summary_lines"]

log = LevelledLogger(namespace=__name__)

_STATIC = {True: ", static list", False: ""}
_CORDONED = {True: " [cordoned]", False: ""}
_NO_KEYS = "keys: none (only local callers are served: docs/behaviour.md §14.2)"


def summary_lines(config: Config, runtime: Runtime, urls: Mapping[str, str]) -> list[str]:
    """The summary, one line each; ``urls`` maps each listener's label (``ollama facade``,
    ``admin``, ``control channel``) to its :func:`~nvpair_tw.runtime.client_url`."""
    lines = [f"nvpair-tw {__version__.public()} is ready"]
    for engine, facade in runtime.facades.items():
        url = urls.get(f"{engine} facade", config.listen.get(engine, "?"))
        lines.append(f"{engine} facade: {url}; OpenAI SDKs: {openai_url(url)}")
        nodes = [
            f"{n.id} ({n.kind_of(facade.profile).name}{_STATIC[n.models is not None]}) "
            f"{n.public_url}{_CORDONED[n.cordon]}"
            for n in facade.directory.nodes()
        ]
        lines.append(f"{engine} nodes: {', '.join(nodes) or 'none'}")
    admin = urls.get("admin")
    lines.append(f"status page: {admin.split(' ', 1)[0] + '/' if admin else 'off (--admin)'}")
    if config.control is not None:
        lines.append(f"control channel: {urls.get('control channel', config.control)}")
    ingress = config.ingress
    names = ingress.named.with_defaults(ingress.static_digests | ingress.file_digests).names()
    lines.append(f"keys: {len(names)} ({', '.join(names)})" if names else _NO_KEYS)
    state = str(config.state) if config.state is not None else "none (this proxy alone)"
    lines.append(f"state store: {state}")
    usage = config.usage_db if config.usage_db is not None else "none (usage kept in memory)"
    lines.append(f"usage database: {usage}")
    return lines


def _listeners(parent: service.IServiceCollection) -> Iterator[ListenerService]:
    for child in parent:
        if isinstance(child, ListenerService):
            yield child
        elif isinstance(child, service.MultiService):
            yield from _listeners(child)


def announce_when_listening(top: service.MultiService, runtime: Runtime, config: Config) -> None:
    """Log :func:`summary_lines` once every listener under ``top`` listens (never, when one
    cannot: the listener says why and the process stops)."""
    listeners = list(_listeners(top))

    def announce(_: object) -> None:
        urls = {
            each.label: client_url(each.port.getHost(), each.description)
            for each in listeners
            if each.port is not None
        }
        for line in summary_lines(config, runtime, urls):
            log.info("{line}", line=line)

    def quiet(_: Failure) -> None:
        """A listener that could not listen has said so itself."""

    ready = gatherResults([each.ready for each in listeners], consumeErrors=True)
    ready.addCallbacks(announce, quiet)
    ready.addErrback(lambda failure: log.failure("the start-up summary failed", failure))
