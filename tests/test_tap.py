# -*- test-case-name: tests.test_tap -*-
"""``twistd nvpair``: plugin discovery, option parsing, environment fallbacks and the real command line."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from twisted.application.service import IService, IServiceCollection, IServiceMaker, MultiService
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactor, MemoryReactorClock
from twisted.logger import LogLevel, formatEvent
from twisted.plugin import IPlugin, getPlugins
from twisted.python import usage
from zope.interface.verify import verifyObject

from nvpair_tw import __version__
from nvpair_tw import tap as tap_module
from nvpair_tw.app._config import Config
from nvpair_tw.app._wiring import assemble
from nvpair_tw.core._durations import Least, read_duration
from nvpair_tw.core._engines import ENGINES
from nvpair_tw.core._reactor import IProxyReactor
from nvpair_tw.core._resolved import FIRST_BODY_ENV, RESPONSE_HEADER_ENV, Settings
from nvpair_tw.inbound._ingress import KEYS_FILE_VAR, KEYS_VAR, IngressPolicy
from nvpair_tw.logs import current_level, set_level
from nvpair_tw.nodes._directory import Node
from nvpair_tw.ops._token import ControlToken
from nvpair_tw.runtime._collector import YOUNG_THRESHOLD
from nvpair_tw.runtime._service import ListenerService
from nvpair_tw.tap import Options, makeService, parse_size

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No ``NVPAIR_*`` variable of the outer shell leaks in; the log level is restored afterwards."""
    for name in list(os.environ):
        if name.startswith("NVPAIR_"):
            monkeypatch.delenv(name)
    level = current_level()
    set_level(LogLevel.info)
    yield
    set_level(level)


def parse(*args: str) -> Options:
    """Parse ``args`` as ``twistd nvpair`` would."""
    options = Options()
    options.parseOptions(list(args))
    return options


def config_of(*args: str) -> Config:
    """The configuration ``args`` parse into."""
    return parse(*args).config


def settings_of(*args: str) -> Settings:
    """The resolved settings of ``--engine ollama`` plus ``args``."""
    return config_of("--engine", "ollama", *args).settings


def services(top: IService) -> Iterator[IService]:
    """Every service in a tree, depth first."""
    yield top
    if IServiceCollection.providedBy(top):
        for child in cast(Any, top):
            yield from services(child)


def nvpair_plugin() -> Any:
    """The ``nvpair`` service maker found by Twisted's plugin system."""
    makers = [m for m in getPlugins(IServiceMaker) if m.tapname == "nvpair"]
    assert len(makers) == 1
    return makers[0]


def test_plugin_is_discovered_and_provides_the_interfaces() -> None:
    """``getPlugins(IServiceMaker)`` finds tapname ``nvpair``; it is a valid IServiceMaker and IPlugin."""
    maker = nvpair_plugin()
    assert maker.options is Options
    assert "LLM" in maker.description
    assert verifyObject(IServiceMaker, maker)
    assert IPlugin.providedBy(maker)


def test_plugin_options_parse_through_the_maker() -> None:
    """The maker's ``options`` class parses a command line into settings."""
    options = nvpair_plugin().options()
    options.parseOptions(["--engine", "lmstudio"])
    assert options.config.engines == ("lmstudio",)


def test_defaults_follow_the_spec() -> None:
    """``--engine lmstudio`` alone: the default listener, 120 s header timeout, first-body off."""
    config = config_of("--engine", "lmstudio")
    assert config.listen == {"lmstudio": "tcp:1235:interface=127.0.0.1"}
    assert config.settings == Settings()
    assert config.nodes == {"lmstudio": ()}
    assert config.sources == {
        "response-header-timeout": "default",
        "first-body-timeout": "default",
    }
    assert (config.admin, config.control, config.demo) == (
        "tcp:9180:interface=127.0.0.1",
        None,
        False,
    )
    assert config.log_level is LogLevel.info
    assert not config.ingress.keys_configured


def test_engine_is_repeatable() -> None:
    """``--engine`` (and ``-e``) may be given several times; order is kept, repeats collapse."""
    config = config_of("--engine", "omlx", "-e", "ollama", "--engine", "omlx")
    assert config.engines == ("omlx", "ollama")
    assert config.listen == {e: ENGINES[e].default_listen for e in ("omlx", "ollama")}


def test_unknown_engine_is_a_usage_error() -> None:
    """An engine name outside the four is refused with the closest one, else with the choices."""
    with pytest.raises(usage.UsageError) as far:
        parse("--engine", "vllm")
    assert str(far.value) == (
        "--engine: unknown engine 'vllm'; choose from lmstudio, ollama, omlx, openai"
    )
    with pytest.raises(usage.UsageError) as close:
        parse("--engine", "olama")
    assert str(close.value) == "--engine: unknown engine 'olama'; did you mean 'ollama'?"


def test_no_engine_is_a_usage_error() -> None:
    """At least one ``--engine`` is required."""
    with pytest.raises(usage.UsageError, match="at least one --engine"):
        parse("--max-body-size", "1MiB")


def test_single_listen_applies_to_the_only_engine() -> None:
    """With one engine, ``--listen ENDPOINT`` is that facade's listener."""
    config = config_of("--engine", "ollama", "--listen", "tcp:port=11600:interface=127.0.0.1")
    assert config.listen == {"ollama": "tcp:port=11600:interface=127.0.0.1"}


def test_engine_prefixed_listen_forms() -> None:
    """``--listen ENGINE=ENDPOINT`` sets one facade; the others keep their defaults."""
    config = config_of("-e", "ollama", "-e", "lmstudio", "-e", "omlx", "--listen", "omlx=tcp:8101")
    assert config.listen == {
        "ollama": "tcp:11435:interface=127.0.0.1",
        "lmstudio": "tcp:1235:interface=127.0.0.1",
        "omlx": "tcp:8101",
    }


def test_unprefixed_listen_with_two_engines_is_a_usage_error() -> None:
    """With several engines a bare ``--listen`` is ambiguous."""
    with pytest.raises(usage.UsageError, match="ENGINE=ENDPOINT"):
        parse("-e", "ollama", "-e", "lmstudio", "--listen", "tcp:9000")


def test_listen_for_an_engine_not_served_is_a_usage_error() -> None:
    """``--listen omlx=...`` without ``--engine omlx`` is refused."""
    with pytest.raises(usage.UsageError, match="omlx, which is not an --engine"):
        parse("-e", "ollama", "--listen", "omlx=tcp:8101")


@pytest.mark.parametrize(
    ("flag", "description"),
    [
        ("--listen", "bogus:1"),
        ("--listen", "tcp:abc"),
        ("--listen", "ssl:8443:privateKey=/nonexistent/key.pem"),
        ("--admin", "tcp:nine"),
        ("--listen", "tcp:70000:interface=127.0.0.1"),
    ],
)
def test_bad_endpoints_are_usage_errors(flag: str, description: str) -> None:
    """Endpoint strings are parsed up front, so a typo is a usage error, not a traceback at start."""
    with pytest.raises(usage.UsageError, match="not a server endpoint"):
        parse("--engine", "ollama", flag, description)


def test_nodes_for_every_engine_and_for_one() -> None:
    """``--node ID=URL`` goes to every facade; ``--node ENGINE:ID=URL`` to one."""
    options = parse(
        "-e",
        "ollama",
        "-e",
        "lmstudio",
        "--node",
        "gpu1=http://10.0.0.5:11434/",
        "--node",
        "lmstudio:gpu2=https://studio.lan:1234",
    )
    gpu1 = Node(id="gpu1", url="http://10.0.0.5:11434", source="flag")
    gpu2 = Node(id="gpu2", url="https://studio.lan:1234", source="flag")
    assert options["node"] == [(None, gpu1), ("lmstudio", gpu2)]
    assert options.config.nodes == {"ollama": (gpu1,), "lmstudio": (gpu1, gpu2)}


def test_node_slots_apply_to_the_named_node_for_every_engine_or_one() -> None:
    """``--node-slots ID=N`` sets that --node's slots in every facade; ``ENGINE:ID=N`` in one (and
    wins there); a node without it keeps None (the --default-slots)."""
    config = config_of(
        "-e",
        "ollama",
        "-e",
        "lmstudio",
        "--node",
        "a=http://10.0.0.5:11434",
        "--node",
        "b=http://10.0.0.6:11434",
        "--node-slots",
        "a=2",
        "--node-slots",
        "lmstudio:a=0",
        "--default-slots",
        "1",
    )
    assert [(n.id, n.slots) for n in config.nodes["ollama"]] == [("a", 2), ("b", None)]
    assert [(n.id, n.slots) for n in config.nodes["lmstudio"]] == [("a", 0), ("b", None)]
    assert config.settings.default_slots == 1


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--node-slots", "a"], "--node-slots wants ID=N"),
        (["--node-slots", "a=-1"], "--node-slots wants ID=N"),
        (["--node-slots", "a=two"], "--node-slots wants ID=N"),
        (["--node-slots", "=2"], "--node-slots wants ID=N"),
        (["--node-slots", "a=2"], "no --node a"),
        (["--node", "a=http://10.0.0.5:1", "--node-slots", "lmstudio:a=2"], "not an --engine"),
        (
            ["--node", "ollama:a=http://h:1", "-e", "lmstudio", "--node-slots", "lmstudio:a=1"],
            "no --node a",
        ),
    ],
)
def test_bad_node_slots_are_usage_errors(args: list[str], needle: str) -> None:
    """A malformed count, a negative one, or slots for a node or engine not given are refused."""
    with pytest.raises(usage.UsageError, match=needle):
        parse("--engine", "ollama", *args)


@pytest.mark.parametrize(
    "text",
    [
        "gpu1",
        "=http://10.0.0.5:11434",
        "gpu1=",
        "ollama:=http://10.0.0.5:11434",
        "gpu1=10.0.0.5:11434",
        "gpu1=ftp://10.0.0.5:11434",
        "gpu1=http://:11434",
        "gpu1=http://10.0.0.5:70000",
        "gpu1=http://10.0.0.5:0",
        "gpu1=http://10.0.0.5:port",
        "gpu1=file:///etc/passwd",
        "gpu1=http://10.0.0.5:11434/?x=1",
        "gpu1=http://10.0.\t0.5:11434",
    ],
)
def test_bad_nodes_are_usage_errors(text: str) -> None:
    """Missing id, missing or non-http URL, and ports outside 1-65535 are refused."""
    with pytest.raises(usage.UsageError, match="--node"):
        parse("--engine", "ollama", "--node", text)


@pytest.mark.parametrize(
    ("text", "size"),
    [("32MiB", 33554432), ("32m", 33554432), ("1000", 1000), ("2kb", 2000), ("1 GiB", 1 << 30)],
)
def test_sizes_parse(text: str, size: int) -> None:
    """Sizes take bytes, decimal (kb, mb, gb) and binary (k, m, g, KiB, MiB, GiB) units."""
    assert parse_size(text) == size


def test_max_body_size_option() -> None:
    """``--max-body-size 32MiB`` is 33554432 bytes."""
    assert settings_of("--max-body-size", "32MiB").max_body_size == 33554432
    assert settings_of("--max-body-size", "1k").max_body_size == 1024


@pytest.mark.parametrize("size", ["lots", "-1", "0", "1.5m", "5tb"])
def test_bad_max_body_size_is_a_usage_error(size: str) -> None:
    """A size that is not a positive whole number of bytes is refused."""
    with pytest.raises(usage.UsageError, match="max-body-size"):
        parse("--engine", "ollama", "--max-body-size", size)


def test_durations_use_go_syntax() -> None:
    """Duration options take Go durations and are stored in seconds."""
    settings = settings_of(
        "--connect-timeout",
        "300ms",
        "--inventory-interval",
        "1m30s",
        "--affinity-ttl",
        "1.5h",
        "--write-stall-timeout",
        "2s",
        "--shutdown-grace",
        "0",
    )
    assert settings.connect_timeout == pytest.approx(0.3)
    assert settings.inventory_interval == 90.0
    assert settings.affinity_ttl == 5400.0
    assert settings.write_stall_timeout == 2.0
    assert settings.shutdown_grace == 0.0


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--connect-timeout", "0"),
        ("--connect-timeout", "10"),
        ("--inventory-interval", "soon"),
        ("--affinity-ttl", "-1s"),
        ("--write-stall-timeout", "0s"),
        ("--shutdown-grace", "-1s"),
        ("--max-connections", "0"),
        ("--max-connections", "many"),
        ("--affinity-max-entries", "0"),
    ],
)
def test_bad_durations_and_counts_are_usage_errors(flag: str, value: str) -> None:
    """Unparseable, unitless, zero (where positive is needed) or negative values are refused."""
    with pytest.raises(usage.UsageError, match=flag.lstrip("-")):
        parse("--engine", "ollama", flag, value)


def test_timer_flags_set_the_timeouts() -> None:
    """``--response-header-timeout`` and ``--first-body-timeout`` take Go durations."""
    config = config_of(
        "-e", "ollama", "--response-header-timeout", "2s", "--first-body-timeout", "1m"
    )
    assert config.settings.response_header_timeout == 2.0
    assert config.settings.cooldown == 2.0
    assert config.settings.first_body_timeout == 60.0
    assert config.sources == {"response-header-timeout": "flag", "first-body-timeout": "flag"}


def test_timer_environment_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without flags, the two ``NVPAIR_PROXY_*_TIMEOUT`` variables are used."""
    monkeypatch.setenv(RESPONSE_HEADER_ENV, "45s")
    monkeypatch.setenv(FIRST_BODY_ENV, "30s")
    settings = settings_of()
    assert settings.response_header_timeout == 45.0
    assert settings.first_body_timeout == 30.0


def test_timer_flags_beat_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flag wins over its variable; ``--first-body-timeout 0`` disables an environment opt-in."""
    monkeypatch.setenv(RESPONSE_HEADER_ENV, "45s")
    monkeypatch.setenv(FIRST_BODY_ENV, "30s")
    settings = settings_of("--response-header-timeout", "5s", "--first-body-timeout", "0")
    assert settings.response_header_timeout == 5.0
    assert settings.first_body_timeout == 0.0


@pytest.mark.parametrize(
    ("variable", "value", "line"),
    [
        (
            RESPONSE_HEADER_ENV,
            "0",
            f"{RESPONSE_HEADER_ENV}: '0' must be more than zero; write 5s, 2m or 1m30s",
        ),
        (
            FIRST_BODY_ENV,
            "-5s",
            f"{FIRST_BODY_ENV}: '-5s' must be zero or more; write 5s, 2m or 1m30s",
        ),
        (FIRST_BODY_ENV, "30", f"{FIRST_BODY_ENV}: '30' is not a duration; write 30s, 2m or 1m30s"),
    ],
)
def test_invalid_timer_environment_values_are_usage_errors(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, line: str
) -> None:
    """A bad timer variable stops the start, named: no warning, no silent 120 s or off."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(usage.UsageError) as raised:
        parse("-e", "ollama")
    assert str(raised.value) == line


DURATION_OPTIONS = [
    "--connect-timeout",
    "--response-header-timeout",
    "--first-body-timeout",
    "--inventory-interval",
    "--affinity-ttl",
    "--session-ttl",
    "--write-stall-timeout",
    "--shutdown-grace",
    "--queue-timeout",
    "--batch-max-wait",
    "--busy-max-wait",
    "--load-timeout",
]


@pytest.mark.parametrize("option", DURATION_OPTIONS)
@pytest.mark.parametrize("value", ["5", "5x"])
def test_every_duration_option_refuses_a_non_duration_with_the_hint(
    option: str, value: str
) -> None:
    """One rule, one sentence for every duration option: what was given and how to write it."""
    with pytest.raises(usage.UsageError) as raised:
        parse("-e", "ollama", option, value)
    assert str(raised.value) == f"{option}: {value!r} is not a duration; write 5s, 2m or 1m30s"


def test_every_duration_option_is_in_the_list_above() -> None:
    """The list the test above walks holds every option whose default is a duration (a new
    duration option joins it or fails here)."""
    defaults = Options().defaults
    durations = {f"--{n}" for n, d in defaults.items() if isinstance(d, str) and _is_duration(d)}
    assert durations - {"--usage-retention"} <= set(DURATION_OPTIONS)


def _is_duration(text: str) -> bool:
    try:
        read_duration("x", text, Least.ZERO)
    except ValueError:
        return False
    return not text.isdigit()


def test_log_level_option() -> None:
    """``--log-level`` is parsed into the configuration; an unknown name is a usage error."""
    assert config_of("-e", "ollama", "--log-level", "debug").log_level is LogLevel.debug
    assert config_of("-e", "ollama", "--log-level", "WARNING").log_level is LogLevel.warn
    with pytest.raises(usage.UsageError, match="unknown log level 'bogus'"):
        parse("-e", "ollama", "--log-level", "bogus")


def test_upstream_client_option() -> None:
    """``--upstream-client`` picks the upstream hop's HTTP client (native by default)."""
    assert config_of("-e", "ollama").settings.upstream_client == "native"
    chosen = config_of("-e", "ollama", "--upstream-client", "twisted").settings.upstream_client
    assert chosen == "twisted"
    with pytest.raises(usage.UsageError, match="--upstream-client must be one of native, twisted"):
        parse("-e", "ollama", "--upstream-client", "curl")


def test_nodes_file_is_checked(tmp_path: Path) -> None:
    """A readable, valid ``--nodes`` file is accepted; bad TOML or a missing file is a usage error."""
    good = tmp_path / "nodes.toml"
    good.write_text('[[node]]\nid = "gpu1"\nurl = "http://10.0.0.5:11434"\n')
    assert config_of("-e", "ollama", "--nodes", str(good)).nodes_file == str(good)
    bad = tmp_path / "bad.toml"
    bad.write_text("[[node]\nid = ")
    with pytest.raises(usage.UsageError, match="invalid TOML"):
        parse("-e", "ollama", "--nodes", str(bad))
    with pytest.raises(usage.UsageError, match="cannot read"):
        parse("-e", "ollama", "--nodes", str(tmp_path / "missing.toml"))


def test_bad_allowed_cidrs_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A malformed ``NVPAIR_PROXY_ALLOWED_CIDRS`` stops the start with a clear message."""
    monkeypatch.setenv("NVPAIR_PROXY_API_KEYS", "k" * 32)
    monkeypatch.setenv("NVPAIR_PROXY_ALLOWED_CIDRS", "10.0.0.0/8, not-a-net")
    with pytest.raises(usage.UsageError, match="NVPAIR_PROXY_ALLOWED_CIDRS: entry 2"):
        parse("-e", "ollama")


def test_version_option_prints_the_nvpair_version(capsys: pytest.CaptureFixture[str]) -> None:
    """``--version`` prints nvpair-tw's version (not Twisted's) and exits 0."""
    with pytest.raises(SystemExit) as exited:
        parse("--version")
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"nvpair-tw {__version__.public()}\n"


def test_assembled_process_has_a_listener_per_engine() -> None:
    """The plugin's options assemble (on a fake reactor) into a MultiService with each facade listener."""
    config = config_of("-e", "ollama", "-e", "omlx", "--listen", "omlx=tcp:8101", "--admin", "none")
    assert config.admin is None
    top = assemble(cast(IProxyReactor, MemoryReactorClock()), config)
    assert isinstance(top, MultiService)
    assert not top.running
    listeners = {s.label: s.description for s in services(top) if isinstance(s, ListenerService)}
    assert listeners == {
        "ollama facade": "tcp:11435:interface=127.0.0.1",
        "omlx facade": "tcp:8101",
    }


def test_effective_timeouts_are_logged_at_start(
    log_events: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Assembling logs each timer with its value and where it came from."""
    monkeypatch.setenv(FIRST_BODY_ENV, "1m30s")
    config = config_of("-e", "ollama", "--response-header-timeout", "45s", "--admin", "none")
    assemble(cast(IProxyReactor, MemoryReactorClock()), config)
    messages = [
        formatEvent(e) for e in log_events if e.get("log_namespace") == "nvpair_tw.app._wiring"
    ]
    summary = (
        "timeouts: connect 10s, response-header 45s (flag), "
        f"first-body 90s (${FIRST_BODY_ENV}), cooldown 45s"
    )
    assert summary in messages


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--engine", "olama"], "--engine: unknown engine 'olama'; did you mean 'ollama'?"),
        (["-e", "ollama", "--ndoes", "n.toml"], "unknown option --ndoes; did you mean --nodes?"),
        (
            ["-e", "ollama", "--frobnicate"],
            "unknown option --frobnicate (twistd nvpair --help lists the options)",
        ),
        (["-e", "ollama", "-x"], "unknown option -x (twistd nvpair --help lists the options)"),
        (
            ["-e", "ollama", "--pidfile=x"],
            "unknown option --pidfile: it is twistd's own option; give it before nvpair",
        ),
        (["-e", "ollama", "--node"], "--node needs a value"),
        (["-e"], "-e needs a value"),
        (["-e", "ollama", "--demo=yes"], "--demo takes no value"),
        (
            ["-e", "ollama", "--node-k", "a=1"],
            "--node-k is the start of --node-key-file, --node-kind; write one out",
        ),
        (
            ["-e", "ollama", "--no", "a"],
            "--no is the start of --node, --node-key-file, --node-kind, --node-slots, --nodes; write one out",
        ),
        (
            ["-e", "ollama", "ollama"],
            "unexpected argument 'ollama': every option starts with -- (twistd nvpair --help lists them)",
        ),
        (
            ["-e", "ollama", "--affinity-ttl", "300"],
            "--affinity-ttl: '300' is not a duration; write 300s, 2m or 1m30s",
        ),
    ],
)
def test_under_twistd_a_mistake_is_one_line_on_stderr_and_status_2(
    capsys: pytest.CaptureFixture[str], args: list[str], line: str
) -> None:
    """Parsed as twistd's sub-command (twistd's real ``ServerOptions``), a mistake is ``nvpair:``
    and one line naming the option, on stderr alone (no help), and exit status 2."""
    from twisted.scripts._twistd_unix import ServerOptions

    with pytest.raises(SystemExit) as exited:
        ServerOptions().parseOptions(["nvpair", *args])
    assert exited.value.code == 2
    assert capsys.readouterr() == ("", f"nvpair: {line}\n")


def test_parsed_on_its_own_a_mistake_is_a_usage_error() -> None:
    """Outside twistd (a library, these tests) the same mistake is a ``UsageError`` of that line,
    and nothing is printed."""
    with pytest.raises(usage.UsageError) as raised:
        parse("-e", "ollama", "--ndoes", "n.toml")
    assert str(raised.value) == "unknown option --ndoes; did you mean --nodes?"


def test_demo_shortens_the_default_header_timeout_only() -> None:
    """--demo uses a 5 s response-header timeout unless one was given (so a failover shows at once)."""
    demo = config_of("--engine", "ollama", "--demo")
    assert demo.demo
    assert demo.settings.response_header_timeout == 5.0
    assert demo.sources["response-header-timeout"] == "demo default"
    given = config_of("--engine", "ollama", "--demo", "--response-header-timeout", "30s")
    assert given.settings.response_header_timeout == 30.0
    assert settings_of().response_header_timeout == 120.0


# ---- parsing is pure; makeService applies ----------------------------------------------------


def _refuse(what: str) -> Any:
    def refuse(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError(f"option parsing built a {what}")

    return refuse


def test_parsing_has_no_side_effects(
    reactor: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Parsing builds no clock, fake reactor or gate, schedules nothing, and leaves the level alone."""
    keys = tmp_path / "keys"
    keys.write_text("k-0123456789abcdef\n")
    keys.chmod(0o600)
    monkeypatch.setenv(KEYS_FILE_VAR, str(keys))
    monkeypatch.setattr(Clock, "__init__", _refuse("task.Clock"))
    monkeypatch.setattr(MemoryReactor, "__init__", _refuse("MemoryReactor"))
    monkeypatch.setattr(IngressPolicy, "__init__", _refuse("IngressPolicy"))
    before = set(reactor.getDelayedCalls())
    config = config_of(
        "-e", "ollama", "--log-level", "debug", "--control", "unix:/tmp/nvpair-control.sock"
    )
    assert config.log_level is LogLevel.debug
    assert config.ingress.key_file == str(keys) and config.ingress.keys_configured
    assert current_level() is LogLevel.info
    assert set(reactor.getDelayedCalls()) == before


def test_parsing_twice_gives_equal_configurations() -> None:
    """The same command line and environment always resolve to the same value."""
    args = ("-e", "ollama", "-e", "omlx", "--node", "gpu1=http://10.0.0.5:11434", "--demo")
    assert config_of(*args) == config_of(*args)


def test_options_read_the_environment_they_are_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Options(environ=...)`` resolves from that mapping instead of ``os.environ``."""
    monkeypatch.setenv(RESPONSE_HEADER_ENV, "45s")
    options = Options(environ={RESPONSE_HEADER_ENV: "7s", KEYS_VAR: "k-0123456789abcdef"})
    options.parseOptions(["-e", "ollama"])
    assert options.config.settings.response_header_timeout == 7.0
    assert options.config.sources["response-header-timeout"] == f"${RESPONSE_HEADER_ENV}"
    assert options.config.ingress.keys_configured


@pytest.mark.parametrize(
    ("flag", "description"),
    [
        ("--listen", "unix:/tmp/nvpair-test.sock:mode=600"),
        ("--listen", "tcp6:port=0:interface=\\:\\:1"),
        ("--admin", "tcp:0:interface=127.0.0.1"),
        ("--control", "unix:/tmp/nvpair-control.sock:mode=660"),
        ("--control", "stdio"),
    ],
)
def test_good_endpoints_of_every_kind_parse(flag: str, description: str) -> None:
    """TCP, TCP6 and UNIX endpoint strings (and ``--control stdio``) pass the parse-time check."""
    config = config_of("-e", "ollama", flag, description)
    given = {"--listen": config.listen["ollama"], "--admin": config.admin}
    assert given.get(flag, config.control) == description


def test_a_control_socket_without_a_mode_is_made_owner_only() -> None:
    """``--control unix:PATH`` resolves to ``unix:PATH:mode=600`` (Twisted's default is 666)."""
    config = config_of("-e", "ollama", "--control", "unix:/run/nvpair/ctl.sock")
    assert config.control == "unix:/run/nvpair/ctl.sock:mode=600"


def test_make_service_applies_the_log_level_and_assembles(log_events: list[dict[str, Any]]) -> None:
    """``makeService`` sets the parsed level before assembling: the summary obeys ``warn``."""
    options = parse("-e", "ollama", "--log-level", "warn")
    assert current_level() is LogLevel.info
    top = makeService(options)
    assert current_level() is LogLevel.warn
    assert not top.running
    listeners = {s.label for s in services(top) if isinstance(s, ListenerService)}
    assert listeners == {"ollama facade", "admin"}
    ours = [formatEvent(e) for e in log_events if e.get("log_namespace") == "nvpair_tw.app._wiring"]
    assert not [line for line in ours if line.startswith("timeouts:")]


def test_make_service_at_debug_lets_debug_through() -> None:
    """``--log-level debug`` reaches the process only through ``makeService``."""
    options = parse("-e", "ollama", "--log-level", "debug", "--admin", "none")
    assert current_level() is LogLevel.info
    makeService(options)
    assert current_level() is LogLevel.debug


def test_make_service_settles_the_garbage_collector() -> None:
    """Once built, the process's start-up heap is frozen and young passes are spaced."""
    thresholds = gc.get_threshold()
    try:
        makeService(parse("-e", "ollama", "--admin", "none"))
        assert gc.get_threshold()[0] == YOUNG_THRESHOLD and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


@pytest.mark.parametrize(
    ("module", "absent"),
    [
        ("nvpair_tw.tap", "twisted.internet.testing"),
        ("nvpair_tw.app._wiring", "nvpair_tw.tap"),
        ("nvpair_tw.app._config", "twisted.internet.reactor"),
    ],
)
def test_import_graph(module: str, absent: str) -> None:
    """Production option parsing needs no test doubles, and assembly does not import the CLI."""
    code = f"import sys, {module}; print({absent!r} in sys.modules)"
    environ = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", code], env=environ, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_admission_and_deadline_options_reach_the_settings() -> None:
    """--default-slots, --queue-size, --queue-timeout, --busy-max-wait, --load-timeout and
    --assemble land in Settings; unset ones keep their defaults."""
    options = Options(environ={})
    options.parseOptions(
        [
            "--engine", "ollama", "--engine", "lmstudio",
            "--default-slots", "2", "--queue-size", "8", "--queue-timeout", "30s",
            "--busy-max-wait", "0", "--load-timeout", "45s",
            "--assemble", "off", "--assemble", "lmstudio=on",
        ]
    )  # fmt: skip
    settings = options.config.settings
    assert (settings.default_slots, settings.queue_size, settings.queue_timeout) == (2, 8, 30.0)
    assert (settings.busy_max_wait, settings.load_timeout) == (0.0, 45.0)
    assert settings.cold_load_allowance == 45.0
    assert (settings.assembles("ollama"), settings.assembles("lmstudio")) == (False, True)
    defaults = Options(environ={})
    defaults.parseOptions(["--engine", "ollama", "--response-header-timeout", "7s"])
    plain = defaults.config.settings
    assert (plain.default_slots, plain.queue_size, plain.queue_timeout) == (0, 256, 600.0)
    assert plain.cold_load_allowance == 7.0
    assert plain.assembles("ollama") and not plain.assembles("omlx")


def test_batch_max_wait_reaches_the_settings_and_defaults_to_two_minutes() -> None:
    """--batch-max-wait (docs/behaviour.md §16.3): a duration, 0 allowed (batch waits behind
    nothing), default 2m."""
    options = Options(environ={})
    options.parseOptions(["--engine", "ollama", "--batch-max-wait", "45s"])
    assert options.config.settings.batch_max_wait == 45.0
    defaults = Options(environ={})
    defaults.parseOptions(["--engine", "ollama"])
    assert defaults.config.settings.batch_max_wait == 120.0
    with pytest.raises(usage.UsageError, match="batch-max-wait"):
        Options(environ={}).parseOptions(["--engine", "ollama", "--batch-max-wait", "soon"])


@pytest.mark.parametrize(
    "args",
    [
        ["--default-slots", "-1"],
        ["--queue-size", "0"],
        ["--queue-timeout", "0"],
        ["--assemble", "maybe"],
        ["--assemble", "vllm=on"],
    ],
)
def test_bad_admission_options_are_usage_errors(args: list[str]) -> None:
    """Each bad value is a usage error naming the option, not a traceback."""
    with pytest.raises(usage.UsageError, match=args[0].lstrip("-")):
        Options(environ={}).parseOptions(["--engine", "ollama", *args])


def test_node_key_file_gives_that_flag_node_its_key(tmp_path: Path) -> None:
    """``--node-key-file ID=PATH`` reads the key from PATH's first line, for ``--node ID`` only."""
    key_file = tmp_path / "gpu1.key"
    key_file.write_text("  sk-from-file  \nignored\n")
    config = config_of(
        "-e",
        "ollama",
        "--node",
        "gpu1=http://a:1",
        "--node",
        "gpu2=http://b:1",
        "--node-key-file",
        f"gpu1={key_file}",
    )
    gpu1, gpu2 = config.nodes["ollama"]
    assert (gpu1.api_key, gpu2.api_key) == ("sk-from-file", None)


@pytest.mark.parametrize(
    ("content", "node", "expected"),
    [
        (None, "gpu1", "cannot read"),
        ("\n\n", "gpu1", "must hold the key on its first line"),
        ("sk-x", "other", "no --node has this id"),
    ],
)
def test_node_key_file_errors_name_the_file_never_the_key(
    tmp_path: Path, content: str | None, node: str, expected: str
) -> None:
    key_file = tmp_path / "k"
    if content is not None:
        key_file.write_text(content)
    with pytest.raises(usage.UsageError, match=expected) as raised:
        parse("-e", "ollama", "--node", "gpu1=http://a:1", "--node-key-file", f"{node}={key_file}")
    assert "sk-x" not in str(raised.value)


def test_a_bad_node_url_is_reported_without_its_password() -> None:
    with pytest.raises(usage.UsageError) as raised:
        parse("-e", "ollama", "--node", "a=http://u:hunter2@h:99999")
    assert "hunter2" not in str(raised.value)


def test_state_is_off_by_default() -> None:
    assert config_of("--engine", "ollama").state is None


def test_state_url_and_files_resolve_into_the_config(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("from-file\n")
    (tmp_path / "secret").write_bytes(b"hmac-secret\n")
    state = config_of(
        "--engine",
        "ollama",
        "--state",
        "redis://:in-url@store.local:6380/3",
        "--state-password-file",
        str(tmp_path / "pw"),
        "--state-secret-file",
        str(tmp_path / "secret"),
    ).state
    assert state is not None
    assert (state.host, state.port, state.db) == ("store.local", 6380, 3)
    assert (state.password, state.secret) == ("from-file", b"hmac-secret")


@pytest.mark.parametrize(
    "args",
    [
        ("--state", "http://:pw-canary@h/0"),
        ("--state", "redis://:pw-canary@h/notadb"),
        ("--state-password-file", "/nonexistent/pw-canary"),
        ("--state", "redis://h/0", "--state-password-file", "NOT_UTF8"),
        ("--state", "redis://h/0", "--state-secret-file", "EMPTY"),
    ],
)
def test_bad_state_options_are_usage_errors_that_never_quote_a_password(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    files = {"NOT_UTF8": tmp_path / "pw", "EMPTY": tmp_path / "secret"}
    files["NOT_UTF8"].write_bytes(b"pw-canary\xff\n")
    files["EMPTY"].write_bytes(b"\n")
    with pytest.raises(usage.UsageError) as raised:
        parse("--engine", "ollama", *(str(files[a]) if a in files else a for a in args))
    assert "pw-canary" not in str(raised.value).replace(str(tmp_path), "")


@pytest.mark.parametrize(
    ("option", "problem"),
    [
        ("--state-password-file", "cannot read: No such file or directory"),
        ("--state-secret-file", "cannot read: No such file or directory"),
    ],
)
def test_a_state_file_that_cannot_be_read_is_named(option: str, problem: str) -> None:
    """The option and the file are named, so the operator knows which of the two to fix."""
    with pytest.raises(usage.UsageError) as raised:
        parse("--engine", "ollama", "--state", "redis://h/0", option, "/nonexistent/file")
    assert str(raised.value) == f"{option} /nonexistent/file: {problem}"


def test_node_kind_gives_a_flag_node_its_kind_behind_every_facade() -> None:
    """§11.1: ``--node-kind ID=KIND`` beside ``--node ID=URL``."""
    options = parse(
        "-e",
        "ollama",
        "-e",
        "openai",
        "--node",
        "mac=http://10.0.0.20:1234",
        "--node",
        "box=http://10.0.0.30:11434",
        "--node-kind",
        "mac=lmstudio",
    )
    nodes = options.config.nodes
    assert [(n.id, n.kind) for n in nodes["ollama"]] == [("mac", "lmstudio"), ("box", None)]
    assert [(n.id, n.kind) for n in nodes["openai"]] == [("mac", "lmstudio"), ("box", None)]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--node-kind", "mac=vllm"], "--node-kind mac: unknown kind 'vllm'; choose from lmstudio"),
        (["--node-kind", "mac=lmstuido"], "--node-kind mac: unknown kind 'lmstuido'; did you mean"),
        (["--node-kind", "mac"], "--node-kind wants ID=KIND"),
        (["--node-kind", "ghost=ollama"], "--node-kind ghost: no --node has this id"),
        (
            ["--node", "ollama:s=http://10.0.0.1:1", "--node-kind", "s=ollama"],
            "give that --node as ID=URL",
        ),
    ],
)
def test_bad_node_kinds_are_usage_errors(args: list[str], needle: str) -> None:
    with pytest.raises(usage.UsageError, match=re.escape(needle)):
        parse("-e", "ollama", "--node", "mac=http://10.0.0.20:1234", *args)


def test_the_openai_facade_is_an_engine_with_its_own_listener() -> None:
    """§11.2: ``--engine openai`` alone listens on its default port."""
    options = parse("--engine", "openai")
    assert options.config.engines == ("openai",)
    assert options.config.listen == {"openai": "tcp:4000:interface=127.0.0.1"}


def test_usage_options_default_to_a_file_here_and_90_days() -> None:
    """``--usage-db`` defaults to ``nvpair-usage.sqlite3``, ``none`` keeps usage in memory;
    ``--usage-retention`` takes days or Go durations and refuses less than a minute."""
    config = parse("-e", "ollama").config
    assert config.usage_db == "nvpair-usage.sqlite3" and config.usage_retention == 90 * 86400
    config = parse("-e", "ollama", "--usage-db", "none", "--usage-retention", "720h").config
    assert config.usage_db is None and config.usage_retention == 720 * 3600
    assert parse("-e", "ollama", "--usage-retention", "1d12h").config.usage_retention == 129600
    for bad, why in (
        ("soon", "'soon' is not a duration; write 90d, 720h or 30m"),
        ("90", "'90' is not a duration; write 90d, 720h or 30m"),
        ("0", "'0' must be a minute or more; write 90d, 720h or 30m"),
        ("30s", "'30s' must be a minute or more; write 90d, 720h or 30m"),
        ("-1d", "'-1d' is not a duration; write 90d, 720h or 30m"),
    ):
        with pytest.raises(usage.UsageError) as raised:
            parse("-e", "ollama", "--usage-retention", bad)
        assert str(raised.value) == f"--usage-retention: {why}"


def _token_file(tmp_path: Path, mode: int = 0o600) -> str:
    path = tmp_path / "control.token"
    path.write_text("s3cret-token\n")
    path.chmod(mode)
    return str(path)


def test_a_tcp_control_channel_runs_with_a_token_file(tmp_path: Path) -> None:
    """``--control tcp:… --control-token FILE``: the token is read at parse time into the config."""
    config = config_of(
        "-e", "ollama", "--control", "tcp:7070:interface=127.0.0.1",
        "--control-token", _token_file(tmp_path),
    )  # fmt: skip
    assert config.control_token == ControlToken(b"s3cret-token")
    assert config_of("-e", "ollama", "--control", "stdio").control_token is None


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--control", "tcp:7070"], "needs --control-token FILE"),
        (["--control", "tcp6:port=7070:interface=\\:\\:1"], "needs --control-token FILE"),
        (["--control-token", "TOKEN"], "--control-token is given without --control"),
        (["--control", "tcp:7070", "--control-token", "LOOSE"], "mode 0644"),
        (["--control", "tcp:7070", "--control-token", "/nonexistent/t"], "cannot be read"),
    ],
)
def test_control_token_mistakes_are_usage_errors(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    """A TCP control channel without a token, a token without a channel, a token file readable by
    others or missing: the process refuses to start, with one clear line."""
    paths = {"TOKEN": _token_file(tmp_path), "LOOSE": _token_file(tmp_path, 0o644)}
    with pytest.raises(usage.UsageError, match=re.escape(needle)):
        parse("-e", "ollama", *(paths.get(a, a) for a in args))


def test_sessions_and_the_billing_block_have_their_options() -> None:
    """``--session-ttl`` (1 h), ``--session-header`` (a header name, kept in lower case) and
    ``--billing-block`` (``remove`` by default, or ``keep``), docs/behaviour.md §5.3."""
    default = settings_of()
    assert (default.session_ttl, default.session_header, default.billing_block) == (
        3600.0,
        None,
        "remove",
    )
    chosen = settings_of(
        "--session-ttl", "2h", "--session-header", "X-Team-Thread", "--billing-block", "keep"
    )
    assert (chosen.session_ttl, chosen.session_header, chosen.billing_block) == (
        7200.0,
        b"x-team-thread",
        "keep",
    )


@pytest.mark.parametrize(
    ("flag", "value", "line"),
    [
        ("--session-header", "X Session", "--session-header: 'X Session' is not a header name"),
        ("--session-header", "", "--session-header: '' is not a header name"),
        ("--billing-block", "drop", "--billing-block must be one of remove, keep, not 'drop'"),
    ],
)
def test_a_bad_session_header_or_billing_block_stops_the_start(
    flag: str, value: str, line: str
) -> None:
    with pytest.raises(usage.UsageError, match=line):
        parse("-e", "ollama", flag, value)


def test_every_option_is_in_exactly_one_help_group() -> None:
    """``--help``'s groups hold every option of the plugin once (a new option must be placed)."""
    placed = [name for _, names in tap_module._GROUPS for name in names]
    assert sorted(placed) == sorted(o.rstrip("=") for o in Options().longOpt)
    assert len(placed) == len(set(placed))
    assert [title for title, _ in tap_module._GROUPS] == [
        "Facades",
        "Nodes",
        "Routing and timeouts",
        "Keys",
        "State and usage",
        "Operations",
    ]
