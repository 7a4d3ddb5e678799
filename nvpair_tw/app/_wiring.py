# -*- test-case-name: tests.app.test_wiring -*-
"""From a :class:`~nvpair_tw.app._config.Config` to a ``MultiService``: runtime, listeners, control,
admin, and the start-up summary once they all listen (:mod:`~nvpair_tw.app._summary`)."""

from __future__ import annotations

from twisted.application import service
from twisted.internet.interfaces import IListeningPort

from nvpair_tw.app._config import Config
from nvpair_tw.app._summary import announce_when_listening
from nvpair_tw.core import IProxyReactor, Priority, format_duration
from nvpair_tw.inbound import ingress_warnings
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.nodes import Node
from nvpair_tw.runtime import (
    ListenerService,
    Runtime,
    RuntimeService,
    build_runtime,
    client_url,
    own_urls,
)
from nvpair_tw.selection import priority_note

__all__ = ["assemble"]

log = LevelledLogger(namespace=__name__)


def assemble(reactor: IProxyReactor, config: Config) -> service.MultiService:
    """Everything ``twistd nvpair`` runs, on the reactor it is given; nothing is started."""
    top = service.MultiService()
    settings = config.settings
    engines = list(config.engines)
    nodes: dict[str, list[Node]] = {e: list(config.nodes.get(e, ())) for e in engines}
    demo = _demo_nodes(reactor, engines, nodes) if config.demo else None
    if demo is not None:
        demo.setServiceParent(top)
    runtime = build_runtime(
        reactor,
        settings,
        engines,
        nodes=nodes,
        nodes_file=config.nodes_file,
        ingress=config.ingress,
        state=config.state,
        usage_db=config.usage_db,
        usage_retention=config.usage_retention,
    )
    if config.state is not None:
        log.info(
            "fleet store {store}: sharing cooldowns, affinity and reservations",
            store=str(config.state),
        )
    for warning in (*config.warnings, *ingress_warnings(config.ingress)):
        log.warn("{warning}", warning=warning)
    _priority_note(runtime, config)
    _timeouts_note(config)
    RuntimeService(runtime).setServiceParent(top)
    own = [
        url
        for d in (*config.listen.values(), config.admin, config.control)
        if d
        for url in own_urls(d)
    ]
    for engine in engines:
        description = config.listen[engine]
        runtime.facades[engine].directory.exclude_urls(own)
        listener = ListenerService(
            reactor, description, runtime.site_for(engine), f"{engine} facade"
        )
        listener.ready.addCallback(_learn_url, runtime, engine, description)
        listener.setServiceParent(top)
    _optional_services(reactor, runtime, config, top)
    _learn_ports(top, runtime, other_servers=demo)
    announce_when_listening(top, runtime, config)
    return top


def _demo_nodes(
    reactor: IProxyReactor, engines: list[str], nodes: dict[str, list[Node]]
) -> service.IService:
    """``--demo``'s simulated nodes, added to ``nodes`` (the module is imported only then)."""
    from nvpair_tw.app._demo import demo_nodes

    return demo_nodes(reactor, engines, nodes)


def _timeouts_note(config: Config) -> None:
    """One line: the timers in force and where each came from."""
    settings, sources = config.settings, config.sources
    log.info(
        "timeouts: connect {connect}, response-header {header} ({header_source}), "
        "first-body {first} ({first_source}), cooldown {cooldown}",
        connect=format_duration(settings.connect_timeout),
        header=format_duration(settings.response_header_timeout),
        header_source=sources.get("response-header-timeout", "default"),
        first=(
            format_duration(settings.first_body_timeout)
            if settings.first_body_timeout > 0
            else "disabled"
        ),
        first_source=sources.get("first-body-timeout", "default"),
        cooldown=format_duration(settings.cooldown),
    )


def _priority_note(runtime: Runtime, config: Config) -> None:
    """One line when keys are given ``priority = "batch"`` but no node has slots (§16.3)."""
    batch = sum(1 for e in config.ingress.named.entries if e.rules.priority is Priority.BATCH)
    nodes = [n for facade in runtime.facades.values() for n in facade.directory.nodes()]
    note = priority_note(batch, nodes, config.settings.default_slots)
    if note is not None:
        log.info("{note}", note=note)


def _learn_url(
    port: IListeningPort, runtime: Runtime, engine: str, description: str
) -> IListeningPort:
    """Keep where clients reach the ``engine`` facade now that it listens (the status page)."""
    runtime.facade_urls[engine] = client_url(port.getHost(), description)
    return port


def _learn_ports(
    parent: service.IServiceCollection, runtime: Runtime, other_servers: service.IService | None
) -> None:
    """Every listener of the proxy's own under ``parent`` (the facades and the control channel; the
    admin listener sits one level down) reports its port to the self-loop check once it listens
    (docs/behaviour.md §14.3).

    ``other_servers`` (``--demo``'s simulated nodes) only share the process: they are nodes, other
    servers, so their listeners are not this process and are skipped."""
    for child in parent:
        if child is other_servers:
            continue
        if isinstance(child, ListenerService):
            child.ready.addCallback(runtime.self_guard.listened)
        elif isinstance(child, service.MultiService):
            _learn_ports(child, runtime, other_servers)


def _optional_services(
    reactor: IProxyReactor, runtime: Runtime, config: Config, top: service.MultiService
) -> None:
    """Control channel and admin listener, when configured; then the drain service around it all.

    ``MultiService`` stops its children all at once, so every service is moved under the drain
    service, which on stop closes the facade listeners, drains in-flight workloads while admin and
    control still run, then stops the rest one by one (last added first; the pool closes last).
    """
    from nvpair_tw.ops import adopt_all, drain_service

    listeners = [child for child in top if isinstance(child, ListenerService)]
    if config.control is not None:
        from nvpair_tw.ops import control_service

        control_service(
            reactor, runtime, config.control, token=config.control_token
        ).setServiceParent(top)
    if config.admin is not None:
        from nvpair_tw.ops import admin_service

        admin_service(reactor, runtime, config.admin).setServiceParent(top)
    adopt_all(top, drain_service(reactor, runtime, listeners))
