"""The declared public surface: the package's names, the twistd plugin, the event names, and an
``__all__`` that exists and resolves in every module of ``nvpair_tw``."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

import pytest

import nvpair_tw
from nvpair_tw import _version, events

# The wire names of the published events (docs/behaviour.md §7, the control channel, GET /events).
EVENT_NAMES = {
    "WORKLOAD_QUEUED": "workload:queued",
    "WORKLOAD_STARTED": "workload:started",
    "WORKLOAD_COMPLETED": "workload:completed",
    "WORKLOAD_ERRORED": "workload:errored",
    "PROXY_REQUEST": "proxy/request",
    "NODE_COOLDOWN": "node/cooldown",
    "NODE_COOLDOWN_ENDED": "node/cooldown-ended",
    "NODE_CORDON": "node/cordon",
    "NODE_UNCORDON": "node/uncordon",
}

# Each package's public face: what other packages (and users of nvpair_tw.testing) may import.
# A change to a face is a change to the design: update this table with it.
FACES: dict[str, list[str]] = {
    "app": ["Config", "assemble"],
    "assembly": [
        "Assembly",
        "AssemblyGate",
        "Dialect",
        "plan_assembly",
        "rewrite_body",
        "rewrite_outlined",
    ],
    "core": [
        "AnswerTooLarge",
        "BILLING_BLOCKS",
        "CallOrder",
        "ENGINES",
        "ERROR_HEADERS",
        "EVENT_ENDS",
        "Edit",
        "EngineProfile",
        "ErrorShape",
        "Events",
        "FanOutRoute",
        "Framing",
        "HOP_BY_HOP",
        "IProxyReactor",
        "IWriteHolding",
        "IdentityEnum",
        "IllegalCall",
        "LOOP_HEADER",
        "MODEL_NAMES",
        "Least",
        "Lines",
        "MalformedStream",
        "ModelChange",
        "ModelControl",
        "ModelListFormat",
        "ModelNames",
        "Outline",
        "Outlined",
        "PRIORITY_HEADER",
        "PROCESS_NONCE",
        "Priority",
        "ProxyBug",
        "RESPONSES_PATH",
        "ResidencyFormat",
        "Resolved",
        "RouteKind",
        "Settings",
        "SlotsFormat",
        "Span",
        "StreamCut",
        "TARGET_HEADER",
        "ToolCalls",
        "UPSTREAM_CLIENTS",
        "abort",
        "after_last_event",
        "byte_offsets",
        "close",
        "did_you_mean",
        "dump",
        "error_body",
        "error_document",
        "error_type",
        "event_end",
        "format_duration",
        "forward_headers",
        "header_tokens",
        "line_around",
        "line_start",
        "loop_marks",
        "media_type",
        "object_members",
        "one_send",
        "outline_body",
        "parse_duration",
        "priority_of",
        "raw_error_response",
        "read_duration",
        "resolve_first_body_timeout",
        "resolve_response_header_timeout",
        "set_members",
        "shape_of",
        "skip_whitespace",
        "upstream_request_headers",
    ],
    "ctl": ["DEFAULT_CONTROL", "main"],
    "corridor": [
        "FacadeResource",
        "FacadeState",
        "Shared",
        "WorkloadRegistry",
        "WorkloadState",
        "ask_node",
    ],
    "dialects": [
        "SYNTHESISED_ROUTES",
        "TRANSLATED_ROUTES",
        "AnswerTooLarge",
        "Chain",
        "MalformedAnswer",
        "ModelFacts",
        "StreamCut",
        "Transducer",
        "Translation",
        "Untranslatable",
        "Usage",
        "UsageMeter",
        "UsageStripper",
        "asks_usage",
        "client_fields",
        "facts_from",
        "record_for",
        "rename_outlined",
        "rename_request",
        "renamer",
        "show_answer",
        "synthesis",
        "translate",
        "untranslatable_field",
        "MESSAGES_PATH",
        "route_missing",
    ],
    "events": [
        "Attempt",
        "AttemptOutcome",
        "BusEvent",
        "Choice",
        "EVENT_KINDS",
        "Event",
        "EventBus",
        "FAN_OUT_PROGRESS",
        "FanOutProgress",
        "NODE_COOLDOWN",
        "NODE_COOLDOWN_ENDED",
        "NODE_CORDON",
        "NODE_UNCORDON",
        "NodeCooldown",
        "NodeCooldownEnded",
        "NodeCordon",
        "NodeUncordon",
        "Outcome",
        "PROXY_REQUEST",
        "PartProgress",
        "PartState",
        "Phase",
        "ProxyRequest",
        "REQUEST_PHASE",
        "RequestPhase",
        "StatusOutcome",
        "Subscription",
        "WORKLOAD_COMPLETED",
        "WORKLOAD_ERRORED",
        "WORKLOAD_QUEUED",
        "WORKLOAD_STARTED",
        "WorkloadCompleted",
        "WorkloadErrored",
        "WorkloadInfo",
        "WorkloadQueued",
        "WorkloadStarted",
        "WorkloadState",
        "log_events",
        "outcome_named",
    ],
    "fleet": ["FleetStore", "StateConfig", "parse_state_url", "read_secret"],
    "usage": [
        "DEFAULT_RETENTION",
        "DIMENSIONS",
        "Report",
        "Row",
        "UsageRecorder",
        "UsageSink",
        "parse_report",
        "parse_span",
    ],
    "inbound": [
        "LARGE_BODY",
        "LOCAL",
        "Caller",
        "Change",
        "CorsPolicy",
        "IngressConfig",
        "IngressConfigError",
        "IngressPolicy",
        "KeyBook",
        "KeyRules",
        "KeysFileError",
        "LimitCounters",
        "LimitedChannel",
        "LimitedRequest",
        "LimitedSite",
        "LocalNames",
        "Locality",
        "Parsed",
        "NOT_COUNTED",
        "Permit",
        "RateLimiter",
        "Refusal",
        "Rejection",
        "Role",
        "Target",
        "allow_origin",
        "env_key_name",
        "ingress_warnings",
        "locality",
        "make_site",
        "model_not_allowed",
        "model_rule",
        "parse_body",
        "parse_document",
        "parse_document_large",
        "parse_ingress",
        "parse_large",
        "parse_origin",
        "parse_target",
        "read_keys_file",
        "read_model",
        "read_models",
        "read_private_file",
    ],
    "nodes": [
        "Catalogue",
        "ModelNames",
        "ModelPolicy",
        "Node",
        "NodeDirectory",
        "NodeTrustPolicy",
        "NodesFileError",
        "SelfGuard",
        "is_self",
        "load_nodes_file",
        "public_url",
        "tls_endpoint",
        "validate_url",
    ],
    "ops": [
        "ControlToken",
        "admin_service",
        "adopt_all",
        "control_service",
        "drain_service",
        "needs_token",
        "read_control_token",
    ],
    "runtime": [
        "CannotListen",
        "ListenerService",
        "Runtime",
        "RuntimeService",
        "StallTrackerFactory",
        "build_runtime",
        "client_url",
        "openai_url",
        "own_urls",
        "owner_only",
        "steady_collector",
        "tcp_listener",
    ],
    "selection": [
        "CHAT_PATHS",
        "COMPLETION_PATHS",
        "PROBE_BOUND",
        "RETRY_AFTER_SECONDS",
        "Admission",
        "AffinityKey",
        "AffinityTable",
        "Booking",
        "Cooldown",
        "CooldownListener",
        "Cordon",
        "CordonBook",
        "CordonListener",
        "Cordons",
        "IStallTracker",
        "InventoryBook",
        "Probe",
        "ProgressBook",
        "QueueFull",
        "QueueTimeout",
        "ReservationLedger",
        "RouteGaps",
        "Slot",
        "StallTracker",
        "Waited",
        "Waiter",
        "affinity_key",
        "expiry_probe",
        "make_rank",
        "order_candidates",
        "slot_limit",
        "Answer",
        "FlightBook",
        "Landing",
        "Load",
        "Rates",
        "Reach",
        "Reachability",
        "RequestSize",
        "Sample",
        "SpeedBook",
        "Start",
        "Trip",
        "predict_all",
        "priority_note",
        "request_size",
        "sample_of",
        "Fit",
        "fit",
        "shown_contexts",
        "Patience",
        "Outlook",
        "HOLD_MAX",
        "FirstRun",
        "EXPLORE",
        "expected_completion",
        "predict",
        "slot_wait",
        "spare_busy_routers",
        "would_evict_busy_work",
        "BILLING_PREFIX",
        "SESSION_HEADERS",
        "Home",
        "Match",
        "Session",
        "SessionTable",
        "Warm",
        "is_billing_block",
        "session_name",
        "warm_node",
        "CacheBook",
        "Capacity",
        "CapacitySource",
        "Place",
    ],
    "simulated": [
        "Behaviour",
        "Machine",
        "Pace",
        "Policy",
        "Received",
        "SimulatedEngine",
        "alternate",
        "always",
        "once",
        "reply_frames",
        "stream_kind",
    ],
    # The public test double: the same names as when it was one module (users import them).
    "testing": [
        "Behaviour",
        "Clusters",
        "EngineHandle",
        "MemoryCluster",
        "MemoryNetwork",
        "MemoryResponse",
        "Policy",
        "ProxyCluster",
        "ProxyHandle",
        "Received",
        "SimulatedEngine",
        "alternate",
        "always",
        "http_client",
        "reply_frames",
        "start_engine",
        "start_proxy",
        "stream_kind",
    ],
    "traces": ["SERVICE_NAME", "RequestTracing", "SpanCounts", "otlp_tracing", "traces_url"],
    "upstream": [
        "MAX_JSON_BYTES",
        "TRANSPORT_FAILURES",
        "BadResponse",
        "BodyEnd",
        "BodyGate",
        "BodyReader",
        "BusyWait",
        "Discard",
        "FirstBodyTimeout",
        "FirstBodyTimer",
        "HeadParser",
        "HeaderTimeout",
        "NodeAgent",
        "NodeEndpointFactory",
        "ReadError",
        "ReadTimeout",
        "ResponseHead",
        "UpstreamClient",
        "WholeBody",
        "describe_failure",
        "get_json",
        "is_cancellation",
        "join_url",
        "make_http_client",
        "make_pool",
        "node_answers",
        "node_url",
        "post_json",
    ],
}


# Modules without an ``__all__`` yet: the testing/demo split (simulated.py + testing.py) adds it.
# strict: once they have one this fails, so the entry is removed.
NO_ALL_YET: set[str] = set()


def _modules() -> list[str]:
    """Every module of the tree, packages and their private modules included."""
    return sorted(
        info.name
        for info in pkgutil.walk_packages(nvpair_tw.__path__, "nvpair_tw.")
        if info.name != "nvpair_tw.static"
    )


def _with_all(module: ModuleType) -> list[str]:
    names = getattr(module, "__all__", None)
    assert isinstance(names, list), f"{module.__name__} has no __all__ list"
    return names


def test_package_exports_only_its_version() -> None:
    """``import nvpair_tw`` gives ``__version__``, the same object as ``nvpair_tw._version``'s."""
    assert nvpair_tw.__all__ == ["__version__"]
    assert nvpair_tw.__version__ is _version.__version__


def test_package_docstring_names_the_public_surface() -> None:
    """The docstring names the plugin, the JSON logger, the test double and every event name."""
    doc = nvpair_tw.__doc__ or ""
    for public in ("twistd -n nvpair", "nvpair_tw.logs.compactJson", "nvpair_tw.testing"):
        assert public in doc
    for name in EVENT_NAMES.values():
        assert f"``{name}``" in doc


def test_event_names_are_exported_constants_with_their_wire_values() -> None:
    """Each event name is a constant in ``nvpair_tw.events.__all__`` with its published value."""
    for constant, value in EVENT_NAMES.items():
        assert constant in events.__all__
        assert getattr(events, constant) == value


def test_twistd_plugin_points_at_the_tap_module() -> None:
    """The plugin is named ``nvpair`` and loads ``nvpair_tw.tap``'s Options and makeService."""
    from nvpair_tw import tap
    from twisted.plugins.nvpair_plugin import nvpair

    assert nvpair.tapname == "nvpair"
    assert nvpair.module == "nvpair_tw.tap"
    assert {"Options", "makeService"} <= set(tap.__all__)
    assert nvpair.options is tap.Options


def test_every_module_of_the_package_is_checked() -> None:
    """The module list below is not empty and holds the public ones, so a rename cannot hide."""
    modules = _modules()
    assert {"nvpair_tw.events", "nvpair_tw.logs", "nvpair_tw.tap", "nvpair_tw.testing"} <= set(
        modules
    )


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            m,
            marks=pytest.mark.xfail(strict=True, reason="no __all__ until the testing split"),
        )
        if m in NO_ALL_YET
        else m
        for m in _modules()
    ],
)
def test_module_declares_all_and_every_name_resolves(name: str) -> None:
    """Each module has an ``__all__`` of unique names, each an attribute of the module."""
    module = importlib.import_module(name)
    names = _with_all(module)
    assert len(names) == len(set(names)), f"{name}.__all__ repeats a name"
    missing = [n for n in names if not hasattr(module, n)]
    assert missing == [], f"{name}.__all__ names what it does not define: {missing}"


@pytest.mark.parametrize("package", sorted(FACES))
def test_package_face_is_pinned(package: str) -> None:
    """Each subpackage's ``__init__`` exports exactly the names pinned in ``FACES``."""
    module = importlib.import_module(f"nvpair_tw.{package}")
    assert sorted(_with_all(module)) == sorted(FACES[package])


def test_every_subpackage_has_a_pinned_face() -> None:
    """A new subpackage must declare its face here too."""
    packages = {info.name for info in pkgutil.iter_modules(nvpair_tw.__path__) if info.ispkg} - {
        "static"
    }
    assert packages == set(FACES)


def test_modules_of_a_subpackage_are_private() -> None:
    """Behind each face, every module is private (``_name.py``)."""
    public = [
        name
        for name in _modules()
        if name.count(".") == 2 and not name.rsplit(".", 1)[1].startswith("_")
    ]
    assert public == []


def _private_imports_across_packages(path: Path, own: str | None) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if (
                len(parts) >= 3
                and parts[0] == "nvpair_tw"
                and parts[1] in FACES
                and parts[1] != own
                and parts[2].startswith("_")
            ):
                found.append(f"{path}:{node.lineno} imports {module}")
    return found


def test_code_outside_a_package_imports_only_its_face() -> None:
    """No module of ``nvpair_tw`` imports another package's private module: across packages,
    the face is the only way in."""
    root = Path(nvpair_tw.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        own = parts[0] if len(parts) > 1 else None
        found += _private_imports_across_packages(path, own)
    assert found == []
