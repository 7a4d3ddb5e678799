"""Tests for nvpair_tw.nodes._directory: the nodes file, the merged directory, its watcher, the self-guard."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from twisted.internet.task import Clock

from nvpair_tw.core._engines import ENGINES, LMSTUDIO, OLLAMA
from nvpair_tw.nodes._directory import Node, NodeDirectory, NodesFileError, load_nodes_file, url_key

GOOD_FILE = """
[[node]]
id = "gpu1"
models = ["llama3:8b"]
[node.url]
ollama = "http://10.0.0.5:11434"
lmstudio = "http://10.0.0.5:1234"

[[node]]
id = "gpu2"
url = "http://10.0.0.6:9999/"

[[node]]
id = "mac"
url = { lmstudio = "https://mac.lan:1234" }
"""


def write(path: Path, text: str, mtime_ns: int | None = None) -> str:
    """Write a file and give it a distinct modification time."""
    path.write_text(text)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))
    return str(path)


def ids(directory: NodeDirectory) -> list[tuple[str, str]]:
    """(id, source) pairs of the merged view."""
    return [(n.id, n.source) for n in directory.nodes()]


def test_file_gives_each_engine_its_urls_and_static_models(tmp_path: Path) -> None:
    """Per-engine URLs, a plain URL for every engine, models for every engine, others skipped."""
    path = write(tmp_path / "nodes.toml", GOOD_FILE)
    assert load_nodes_file(path, "ollama") == [
        Node("gpu1", "http://10.0.0.5:11434", ("llama3:8b",), "file"),
        Node("gpu2", "http://10.0.0.6:9999/", None, "file"),
    ]
    assert [(n.id, n.url) for n in load_nodes_file(path, "lmstudio")] == [
        ("gpu1", "http://10.0.0.5:1234"),
        ("gpu2", "http://10.0.0.6:9999/"),
        ("mac", "https://mac.lan:1234"),
    ]


def test_file_cordon_is_read_onto_the_node(tmp_path: Path) -> None:
    """``cordon = true`` cordons that node (§13.1); absent or false, it serves."""
    text = "[[node]]\nid = 'a'\nurl = 'http://a'\ncordon = true\n[[node]]\nid = 'b'\nurl = 'http://b'\n"
    path = write(tmp_path / "nodes.toml", text)
    assert [(n.id, n.cordon) for n in load_nodes_file(path, "ollama")] == [
        ("a", True),
        ("b", False),
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[[node]]\nurl = 'http://a:1'\n", "node 1: id: required"),
        ("[[node]]\nid = ''\nurl = 'http://a:1'\n", "node 1: id: required"),
        (
            "[[node]]\nid = 'a'\nurl = 'http://a:1'\n[[node]]\nid = 'a'\nurl = 'http://b:1'\n",
            "node 2 (id 'a'): id: duplicate",
        ),
        ("[[node]]\nid = 'a'\nurl = 'ftp://a:1'\n", "node 1 (id 'a'): url: must be an http"),
        ("[[node]]\nid = 'a'\nurl = 'http://'\n", "url: must be an http"),
        ("[[node]]\nid = 'a'\nurl = 'file:///etc/passwd'\n", "url: must be an http"),
        ('[[node]]\nid = "a"\nurl = "http://a\\nb:1"\n', "url: must not contain spaces"),
        ("[[node]]\nid = 'a'\nurl = 'http://a:99999'\n", "url: must be an http"),
        ("[[node]]\nid = 'a'\n[node.url]\nollama = 'nope'\n", "(id 'a'): url.ollama: must be"),
        (
            "[[node]]\nid = 'a'\n[node.url]\nollamma = 'http://a'\n",
            "url.ollamma: unknown engine; did you mean 'ollama'?",
        ),
        (
            "[[node]]\nid = 'a'\n[node.url]\nvllm = 'http://a'\n",
            "url.vllm: unknown engine (known: lmstudio, ollama, omlx, openai)",
        ),
        ("[[node]]\nid = 'gpu1'\nulr = 'http://a:1'\n", "unknown field 'ulr'; did you mean 'url'?"),
        ("[[node]]\nid = 'a'\nurl = 'http://a'\nzzz = 1\n", "unknown field 'zzz'"),
        ("[[node]]\nid = 'a'\n", "(id 'a'): url: required"),
        ("[[node]]\nid = 'a'\nurl = 'http://a'\nmodels = 'm'\n", "models: must be a list"),
        ("[[node]]\nid = 'a'\nurl = 'http://a'\nmodels = [1]\n", "models: must be a list"),
        (
            "[[node]]\nid = 'a'\nurl = 'http://a'\nmodles = []\n",
            "unknown field 'modles'; did you mean 'models'?",
        ),
        ("[[node]]\nid = 'a'\nurl = 'http://a'\nslots = -1\n", "slots: must be a whole number"),
        ("[[node]]\nid = 'a'\nurl = 'http://a'\nslots = '2'\n", "slots: must be a whole number"),
        ("[[node]]\nid = 'a'\nurl = 'http://a'\nslots = 1.5\n", "slots: must be a whole number"),
        ("[[node]]\nid = 'a'\nurl = 'http://a'\nslots = true\n", "slots: must be a whole number"),
        ("[[node]]\nid = 'a'\nurl = 'http://a'\ncordon = 'yes'\n", "cordon: must be true or false"),
        ("nodes = 1\n", "unknown top-level key 'nodes'; did you mean 'node'?"),
        ("node = 1\n", "'node' must be an array of tables"),
        ("[[node]\n", "invalid TOML"),
    ],
)
def test_bad_file_names_file_node_and_field(tmp_path: Path, text: str, expected: str) -> None:
    """Every validation error is one NodesFileError line naming the file, node and field."""
    path = write(tmp_path / "nodes.toml", text)
    with pytest.raises(NodesFileError) as caught:
        load_nodes_file(path, "ollama")
    message = str(caught.value)
    assert message.startswith(f"nodes file {path}: ")
    assert expected in message
    assert "\n" not in message


def test_slots_in_the_file_are_per_node_and_unset_means_the_default(tmp_path: Path) -> None:
    """``slots = N`` sets a node's slots (0 = unlimited); a node without it has ``slots`` None."""
    text = (
        "[[node]]\nid = 'a'\nurl = 'http://a:1'\nslots = 2\n"
        "[[node]]\nid = 'b'\nurl = 'http://b:1'\nslots = 0\n"
        "[[node]]\nid = 'c'\nurl = 'http://c:1'\n"
    )
    path = write(tmp_path / "nodes.toml", text)
    assert [(n.id, n.slots) for n in load_nodes_file(path, "ollama")] == [
        ("a", 2),
        ("b", 0),
        ("c", None),
    ]


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    """A file that cannot be read says so without a traceback."""
    with pytest.raises(NodesFileError, match="cannot read"):
        load_nodes_file(str(tmp_path / "absent.toml"), "ollama")


def test_default_node_only_when_no_source_has_any() -> None:
    """The engine's default node appears when empty and disappears once any node exists."""
    directory = NodeDirectory(OLLAMA, Clock())
    assert directory.nodes() == (Node("default", "http://127.0.0.1:11434", None, "default"),)
    directory.set_discovered([Node("d1", "http://10.0.0.9:11434")])
    assert ids(directory) == [("d1", "discovery")]
    directory.set_discovered([])
    assert ids(directory) == [("default", "default")]


def test_precedence_manual_over_discovery_over_file_over_flag(tmp_path: Path) -> None:
    """The same id from several sources takes the highest source's node; the view is by id."""
    path = write(
        tmp_path / "nodes.toml",
        "[[node]]\nid = 'n'\nurl = 'http://file:1'\n[[node]]\nid = 'a'\nurl = 'http://file:2'\n",
    )
    directory = NodeDirectory(
        OLLAMA,
        Clock(),
        flag_nodes=[Node("n", "http://flag:1"), Node("z", "http://flag:2")],
        nodes_file=path,
    )
    assert directory.get("n") == Node("n", "http://flag:1")
    directory.start()
    assert directory.get("n") == Node("n", "http://file:1", source="file")
    directory.set_discovered([Node("n", "http://disc:1")])
    assert directory.get("n") == Node("n", "http://disc:1", source="discovery")
    assert directory.add_manual(Node("n", "http://manual:1"))
    assert directory.get("n") == Node("n", "http://manual:1", source="manual")
    assert ids(directory) == [("a", "file"), ("n", "manual"), ("z", "flag")]
    assert directory.remove_manual("n")
    assert directory.get("n") == Node("n", "http://disc:1", source="discovery")
    directory.stop()


def test_add_manual_reports_change_and_remove_reports_presence() -> None:
    """add_manual is True only when something changed; remove_manual only when it existed."""
    directory = NodeDirectory(LMSTUDIO, Clock())
    assert directory.add_manual(Node("m", "http://m:1"))
    assert not directory.add_manual(Node("m", "http://m:1"))
    assert directory.add_manual(Node("m", "http://m:2"))
    assert directory.remove_manual("m")
    assert not directory.remove_manual("m")
    assert directory.get("m") is None


def test_subscribers_hear_changes_until_unsubscribed() -> None:
    """A subscriber is called after each change of the view, not after no-ops or unsubscribe."""
    directory = NodeDirectory(OLLAMA, Clock())
    calls: list[list[str]] = []
    unsubscribe = directory.subscribe(lambda: calls.append([n.id for n in directory.nodes()]))
    directory.add_manual(Node("m", "http://m:1"))
    directory.add_manual(Node("m", "http://m:1"))
    directory.set_discovered([])
    assert calls == [["m"]]
    unsubscribe()
    directory.remove_manual("m")
    assert calls == [["m"]]


def test_failing_subscriber_does_not_stop_the_others() -> None:
    """One subscriber raising is logged; the next one still runs."""
    directory = NodeDirectory(OLLAMA, Clock())
    heard: list[int] = []

    def broken() -> None:
        raise RuntimeError("boom")

    directory.subscribe(broken)
    directory.subscribe(lambda: heard.append(1))
    directory.add_manual(Node("m", "http://m:1"))
    assert heard == [1]


def test_watcher_picks_up_a_changed_file(tmp_path: Path) -> None:
    """A file rewritten on disk is reloaded on the next watch tick; stop cancels the timer."""
    clock = Clock()
    path = write(tmp_path / "nodes.toml", "[[node]]\nid = 'a'\nurl = 'http://a:1'\n", 10**18)
    directory = NodeDirectory(OLLAMA, clock, nodes_file=path, watch_interval=2.0)
    directory.start()
    seen: list[int] = []
    directory.subscribe(lambda: seen.append(len(directory.nodes())))
    assert ids(directory) == [("a", "file")]
    write(tmp_path / "nodes.toml", "[[node]]\nid = 'b'\nurl = 'http://b:1'\n", 2 * 10**18)
    clock.advance(1.9)
    assert ids(directory) == [("a", "file")]
    clock.advance(0.1)
    assert ids(directory) == [("b", "file")]
    assert seen == [1]
    directory.stop()
    assert clock.getDelayedCalls() == []


def test_bad_file_on_reload_keeps_the_old_set(tmp_path: Path) -> None:
    """A broken or vanished file on reload logs and keeps the previous nodes."""
    clock = Clock()
    path = write(tmp_path / "nodes.toml", "[[node]]\nid = 'a'\nurl = 'http://a:1'\n", 10**18)
    directory = NodeDirectory(OLLAMA, clock, nodes_file=path)
    directory.start()
    write(tmp_path / "nodes.toml", "[[node]]\nid = 'a'\nurl = 'gopher://a'\n", 2 * 10**18)
    clock.advance(2)
    assert ids(directory) == [("a", "file")]
    assert not directory.reload_file()
    os.remove(path)
    clock.advance(2)
    assert ids(directory) == [("a", "file")]
    directory.stop()


BEFORE = """
[[node]]
id = "gpu1"
url = "http://ops:first-secret@10.0.0.5:11434"
api_key = "sk-first"

[[node]]
id = "gpu2"
url = "http://10.0.0.6:11434"

[[model]]
name = "llama3"
aliases = ["meta-llama-3-8b"]
"""

AFTER = """
[[node]]
id = "gpu1"
url = "http://ops:second-secret@10.0.0.5:11434"
api_key = "sk-second"
slots = 2

[[node]]
id = "gpu3"
url = "http://10.0.0.7:11434"

[[model]]
name = "llama3"
aliases = ["meta-llama-3-8b-instruct"]

[[model]]
name = "qwen"
fallbacks = ["llama3"]
"""


def test_a_reload_logs_what_changed_by_id_and_field_never_a_secret(
    tmp_path: Path, log_lines: list[str]
) -> None:
    """One line per reload: nodes added, removed, and changed with the names of the changed
    fields (credentials named, never shown), and the catalogue's public names; a file rewritten
    the same says ``no change``."""
    clock = Clock()
    path = write(tmp_path / "nodes.toml", BEFORE, 10**18)
    directory = NodeDirectory(OLLAMA, clock, nodes_file=path)
    directory.start()
    write(tmp_path / "nodes.toml", AFTER, 2 * 10**18)
    clock.advance(2)
    write(tmp_path / "nodes.toml", AFTER, 3 * 10**18)
    clock.advance(2)
    directory.stop()
    assert [line for line in log_lines if "nodes file" in line] == [
        f"nodes file {path} reloaded for the ollama facade: added gpu3; removed gpu2; changed gpu1 "
        "(url credentials, slots, api_key); models added qwen, changed llama3",
        f"nodes file {path} reloaded for the ollama facade: no change",
    ]
    assert not [line for line in log_lines if "secret" in line or "sk-" in line]


def test_bad_file_at_start_raises(tmp_path: Path) -> None:
    """start() refuses a bad nodes file and leaves no watcher behind."""
    clock = Clock()
    path = write(tmp_path / "nodes.toml", "[[node]]\nid = 'a'\n")
    directory = NodeDirectory(OLLAMA, clock, nodes_file=path)
    with pytest.raises(NodesFileError, match="url: required"):
        directory.start()
    assert clock.getDelayedCalls() == []


def test_reload_file_reads_now(tmp_path: Path) -> None:
    """reload_file re-reads without waiting for the watcher."""
    path = write(tmp_path / "nodes.toml", "[[node]]\nid = 'a'\nurl = 'http://a:1'\n")
    directory = NodeDirectory(OLLAMA, Clock(), nodes_file=path)
    assert directory.reload_file()
    assert ids(directory) == [("a", "file")]


def test_self_guard_drops_own_listener_urls() -> None:
    """Nodes at this proxy's own listener (any loopback spelling, default port) are dropped."""
    directory = NodeDirectory(
        OLLAMA,
        Clock(),
        flag_nodes=[
            Node("self1", "http://localhost:11435"),
            Node("self2", "http://[::1]:11435/"),
            Node("other-port", "http://127.0.0.1:11434"),
            Node("remote", "http://10.0.0.5:11435"),
            Node("web", "http://proxy.lan"),
        ],
    )
    directory.exclude_urls(["http://127.0.0.1:11435", "http://PROXY.lan:80"])
    assert [n.id for n in directory.nodes()] == ["other-port", "remote"]


def test_self_guard_applies_to_the_default_node() -> None:
    """A proxy listening on the engine's own port does not loop to itself via the default node."""
    directory = NodeDirectory(OLLAMA, Clock())
    directory.exclude_urls(["http://0.0.0.0:11434"])
    assert directory.nodes() == ()


def test_url_key_normalises_scheme_host_and_port() -> None:
    """Loopback spellings are one host; default ports are filled in; junk gives None."""
    assert url_key("http://LOCALHOST") == url_key("http://127.0.0.1:80")
    assert url_key("https://[::1]/x") == ("https", "<loopback>", 443)
    assert url_key("http://a:1") != url_key("https://a:1")
    assert url_key("not a url") is None


def test_api_key_in_the_file_is_the_nodes_bearer_credential(tmp_path: Path) -> None:
    """``api_key`` becomes ``Authorization: Bearer``, trimmed; it stays out of the node's repr."""
    path = write(
        tmp_path / "nodes.toml",
        "[[node]]\nid = 'a'\nurl = 'http://a:1'\napi_key = ' sk-secret '\n"
        "[[node]]\nid = 'b'\nurl = 'http://b:1'\n",
    )
    a, b = load_nodes_file(path, "ollama")
    assert (a.api_key, a.authorization) == ("sk-secret", b"Bearer sk-secret")
    assert b.authorization is None
    assert "sk-secret" not in repr(a)


@pytest.mark.parametrize("value", ["''", "1", '"two\\nlines"'])
def test_a_bad_api_key_is_refused_without_echoing_it(tmp_path: Path, value: str) -> None:
    path = write(
        tmp_path / "nodes.toml", f"[[node]]\nid = 'a'\nurl = 'http://a:1'\napi_key = {value}\n"
    )
    with pytest.raises(NodesFileError, match="api_key: must be a non-empty single-line string"):
        load_nodes_file(path, "ollama")


def test_url_userinfo_is_basic_authorization_and_never_shown() -> None:
    """``user:pass@`` (percent-decoded) is Basic; the public URL and the repr drop it; an
    ``api_key`` wins over it."""
    node = Node("a", "http://al%20ice:s3cr%3At@[::1]:11434/base")
    assert node.authorization == b"Basic YWwgaWNlOnMzY3I6dA=="  # base64("al ice:s3cr:t")
    assert node.public_url == "http://[::1]:11434/base"
    assert "s3cr" not in repr(node)
    assert Node("a", "http://u@h:1").authorization == b"Basic dTo="  # base64("u:")
    keyed = Node("a", "http://u:p@h:1", api_key="k")
    assert keyed.authorization == b"Bearer k"
    assert Node("a", "http://h:1").public_url == "http://h:1"


# --- node kinds (docs/behaviour.md §11.1) --------------------------------------------------------

KINDS_FILE = """
[[node]]
id = "mac"
url = "http://10.0.0.20:1234"
kind = "lmstudio"

[[node]]
id = "box"
url = "http://10.0.0.30:11434"
kind = "ollama"
facades = ["ollama", "openai"]

[[node]]
id = "plain"
url = "http://10.0.0.40:8080"
"""


def test_a_node_with_a_kind_stands_behind_every_facade_unless_restricted(tmp_path: Path) -> None:
    path = write(tmp_path / "nodes.toml", KINDS_FILE)
    by_facade = {e: [(n.id, n.kind) for n in load_nodes_file(path, e)] for e in ENGINES}
    assert by_facade == {
        "ollama": [("mac", "lmstudio"), ("box", "ollama"), ("plain", None)],
        "lmstudio": [("mac", "lmstudio"), ("plain", None)],
        "omlx": [("mac", "lmstudio"), ("plain", None)],
        "openai": [("mac", "lmstudio"), ("box", "ollama"), ("plain", None)],
    }


def test_a_node_without_a_kind_takes_the_kind_of_each_facade(tmp_path: Path) -> None:
    path = write(tmp_path / "nodes.toml", KINDS_FILE)
    [plain] = [n for n in load_nodes_file(path, "lmstudio") if n.id == "plain"]
    assert plain.kind_of(LMSTUDIO) is LMSTUDIO and plain.kind_of(OLLAMA) is OLLAMA
    assert plain.speaks(LMSTUDIO, "/api/anything") and plain.speaks(OLLAMA, "/api/pull")
    [mac] = [n for n in load_nodes_file(path, "ollama") if n.id == "mac"]
    assert mac.kind_of(OLLAMA) is LMSTUDIO
    assert not mac.speaks(OLLAMA, "/api/chat") and mac.speaks(OLLAMA, "/v1/chat/completions")


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ('kind = "vllm"', "kind: one of lmstudio, ollama, omlx, openai, not 'vllm'"),
        (
            'kind = "lmstudo"',
            "kind: one of lmstudio, ollama, omlx, openai, not 'lmstudo'; did you mean 'lmstudio'?",
        ),
        ("kind = 3", "kind: one of"),
        ('facades = ["ollama"]', "facades: needs a kind"),
        ('kind = "ollama"\nfacades = []', "facades: a non-empty list"),
        ('kind = "ollama"\nfacades = ["llamacpp"]', "facades: a non-empty list"),
        ('kind = "ollama"\nfacades = ["opneai"]', "omlx, openai; did you mean 'openai'?"),
    ],
)
def test_bad_kinds_are_refused_with_one_clear_line(tmp_path: Path, entry: str, needle: str) -> None:
    text = f'[[node]]\nid = "a"\nurl = "http://10.0.0.1:1"\n{entry}\n'
    path = write(tmp_path / "nodes.toml", text)
    with pytest.raises(NodesFileError, match=re.escape(needle)):
        load_nodes_file(path, "ollama")


def test_a_node_with_a_kind_has_one_url(tmp_path: Path) -> None:
    text = '[[node]]\nid = "a"\nkind = "ollama"\n[node.url]\nollama = "http://10.0.0.1:1"\n'
    path = write(tmp_path / "nodes.toml", text)
    with pytest.raises(NodesFileError, match="a node with a kind has one URL"):
        load_nodes_file(path, "ollama")


def test_the_openai_facade_defaults_to_one_node_of_each_local_engine() -> None:
    """§11.2: no node given, ``--engine openai`` fronts Ollama, LM Studio and oMLX by their kinds."""
    directory = NodeDirectory(ENGINES["openai"], Clock())
    assert [(n.id, n.url, n.kind, n.source) for n in directory.nodes()] == [
        ("lmstudio", "http://127.0.0.1:1234", "lmstudio", "default"),
        ("ollama", "http://127.0.0.1:11434", "ollama", "default"),
        ("omlx", "http://127.0.0.1:8000", "omlx", "default"),
    ]
    assert [n.id for n in NodeDirectory(OLLAMA, Clock()).nodes()] == ["default"]


def test_the_catalogue_comes_and_goes_with_the_nodes_file(tmp_path: Path) -> None:
    """§11.4: ``[[model]]`` reloads with the file; a bad table keeps the previous one."""
    clock = Clock()
    base = '[[node]]\nid = "a"\nurl = "http://10.0.0.1:1"\n'
    good = base + '[[model]]\nname = "llama3.1:8b"\naliases = ["meta-llama-3.1-8b-instruct"]\n'
    path = write(tmp_path / "nodes.toml", good, mtime_ns=1_000_000_000)
    directory = NodeDirectory(OLLAMA, clock, nodes_file=path, watch_interval=1.0)
    directory.start()
    assert directory.catalogue.public("meta-llama-3.1-8b-instruct") == "llama3.1:8b"
    clash = good + '[[model]]\nname = "other"\naliases = ["meta-llama-3.1-8b-instruct"]\n'
    write(tmp_path / "nodes.toml", clash, mtime_ns=2_000_000_000)
    clock.advance(1.0)
    assert directory.catalogue.public("meta-llama-3.1-8b-instruct") == "llama3.1:8b"
    write(tmp_path / "nodes.toml", base, mtime_ns=3_000_000_000)
    clock.advance(1.0)
    assert directory.catalogue.public("meta-llama-3.1-8b-instruct") == "meta-llama-3.1-8b-instruct"
    directory.stop()


def test_speed_in_the_file_seeds_a_nodes_rates(tmp_path: Path) -> None:
    """``speed = X`` (docs/behaviour.md §15.1): a number > 0, kept as a float; unset is None."""
    text = (
        "[[node]]\nid = 'a'\nurl = 'http://a:1'\nspeed = 5\n"
        "[[node]]\nid = 'b'\nurl = 'http://b:1'\nspeed = 0.5\n"
        "[[node]]\nid = 'c'\nurl = 'http://c:1'\n"
    )
    path = write(tmp_path / "nodes.toml", text)
    assert [(n.id, n.speed) for n in load_nodes_file(path, "ollama")] == [
        ("a", 5.0),
        ("b", 0.5),
        ("c", None),
    ]


@pytest.mark.parametrize("value", ["0", "-1", "true", "'fast'"])
def test_a_speed_that_is_not_a_positive_number_is_refused(tmp_path: Path, value: str) -> None:
    path = write(
        tmp_path / "nodes.toml", f"[[node]]\nid = 'a'\nurl = 'http://a:1'\nspeed = {value}\n"
    )
    with pytest.raises(NodesFileError, match="speed: must be a number > 0"):
        load_nodes_file(path, "ollama")


def test_cache_conversations_in_the_file_sets_a_nodes_cache_capacity(tmp_path: Path) -> None:
    """``cache_conversations = N`` (docs/behaviour.md §5.3.1): a whole number >= 0; unset is None."""
    text = (
        "[[node]]\nid = 'a'\nurl = 'http://a:1'\ncache_conversations = 6\n"
        "[[node]]\nid = 'b'\nurl = 'http://b:1'\ncache_conversations = 0\n"
        "[[node]]\nid = 'c'\nurl = 'http://c:1'\n"
    )
    path = write(tmp_path / "nodes.toml", text)
    assert [(n.id, n.cache_conversations) for n in load_nodes_file(path, "ollama")] == [
        ("a", 6),
        ("b", 0),
        ("c", None),
    ]


@pytest.mark.parametrize("value", ["-1", "2.5", "true", "'6'", "[6]"])
def test_a_cache_capacity_that_is_not_a_whole_number_is_refused_in_one_line(
    tmp_path: Path, value: str
) -> None:
    """The error names the file, the node and the field, with what it must be."""
    path = write(
        tmp_path / "nodes.toml",
        f"[[node]]\nid = 'a'\nurl = 'http://a:1'\ncache_conversations = {value}\n",
    )
    with pytest.raises(NodesFileError) as raised:
        load_nodes_file(path, "ollama")
    assert str(raised.value) == (
        f"nodes file {path}: node 1 (id 'a'): cache_conversations: must be a whole number >= 0"
        " (0 = the engine keeps no prompt cache)"
    )


def test_a_misspelt_cache_field_is_named_with_a_hint(tmp_path: Path) -> None:
    path = write(
        tmp_path / "nodes.toml",
        "[[node]]\nid = 'a'\nurl = 'http://a:1'\ncache_conversation = 6\n",
    )
    with pytest.raises(
        NodesFileError, match=r"unknown field 'cache_conversation'.*cache_conversations"
    ):
        load_nodes_file(path, "ollama")


def test_slots_reserved_is_read_below_the_nodes_slots(tmp_path: Path) -> None:
    """``slots_reserved = N`` (docs/behaviour.md §16.3); unset is 0."""
    text = (
        "[[node]]\nid = 'a'\nurl = 'http://a:1'\nslots = 4\nslots_reserved = 3\n"
        "[[node]]\nid = 'b'\nurl = 'http://b:1'\n"
    )
    path = write(tmp_path / "nodes.toml", text)
    assert [(n.id, n.slots_reserved) for n in load_nodes_file(path, "ollama")] == [
        ("a", 3),
        ("b", 0),
    ]


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ("slots = 2\nslots_reserved = 2", "must be below the node's slots"),
        ("slots = 0\nslots_reserved = 1", "must be below the node's slots"),
        ("slots_reserved = 1", "must be below the node's slots"),
        ("slots = 2\nslots_reserved = -1", "whole number >= 0"),
        ("slots = 2\nslots_reserved = true", "whole number >= 0"),
    ],
)
def test_slots_reserved_not_below_slots_is_refused_at_load(
    tmp_path: Path, fields: str, why: str
) -> None:
    path = write(tmp_path / "nodes.toml", f"[[node]]\nid = 'a'\nurl = 'http://a:1'\n{fields}\n")
    with pytest.raises(NodesFileError, match=why):
        load_nodes_file(path, "ollama")
