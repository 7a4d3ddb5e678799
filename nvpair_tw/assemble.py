# -*- test-case-name: tests.test_assemble -*-
"""From parsed options to a running ``MultiService``: runtime, listeners, control, admin, demo nodes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from twisted.application import service

from nvpair_tw.durations import format_duration
from nvpair_tw.endpoints import own_urls
from nvpair_tw.logs import LevelledLogger
from nvpair_tw.runtime import Runtime, build_runtime
from nvpair_tw.service import ListenerService, RuntimeService

if TYPE_CHECKING:
    from nvpair_tw.tap import Options

__all__ = ["assemble"]

log = LevelledLogger()


def assemble(reactor: Any, options: Options, environ: Mapping[str, str]) -> service.MultiService:
    """Everything ``twistd nvpair`` runs, on the reactor it is given."""
    top = service.MultiService()
    settings = options["settings"]
    engines: list[str] = list(options["engines"])
    nodes = options.nodes_by_engine()
    if options.get("demo"):
        from nvpair_tw.demo import demo_nodes

        demo_nodes(reactor, engines, nodes).setServiceParent(top)
    runtime = build_runtime(
        reactor,
        settings,
        engines,
        nodes=nodes,
        nodes_file=options.get("nodes"),
        environ=environ,
    )
    for warning in options.get("warnings", []):
        log.warn("{warning}", warning=warning)
    sources = options.get("sources", {})
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
    RuntimeService(runtime).setServiceParent(top)
    for engine in engines:
        description = options["listen"][engine]
        runtime.facades[engine].directory.exclude_urls(own_urls(description))
        ListenerService(
            reactor, description, runtime.site_for(engine), f"{engine} facade"
        ).setServiceParent(top)
    _optional_services(reactor, runtime, options, top)
    return top


def _optional_services(
    reactor: Any, runtime: Runtime, options: Mapping[str, Any], top: service.MultiService
) -> None:
    """Control channel and admin listener, when configured; then the drain service around it all.

    ``MultiService`` stops its children all at once, so every service is moved under the drain
    service, which on stop closes the facade listeners, drains in-flight workloads while admin and
    control still run, then stops the rest one by one (last added first; the pool closes last).
    """
    from nvpair_tw.drain import adopt_all, drain_service

    listeners = [child for child in top if isinstance(child, ListenerService)]
    control = options.get("control")
    if control:
        from nvpair_tw.control import control_service

        control_service(reactor, runtime, control).setServiceParent(top)
    admin = options.get("admin")
    if admin and admin != "none":
        from nvpair_tw.admin import admin_service

        admin_service(reactor, runtime, admin).setServiceParent(top)
    adopt_all(top, drain_service(reactor, runtime, listeners))
