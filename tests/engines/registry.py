"""A package index on loopback for the installers' tests: the real ``pip download`` fetches small
wheels made here over real HTTP, without the network, with pip's configuration and cache set
aside."""

from __future__ import annotations

import hashlib
import os
import re
import threading
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

MEGABYTE = 1 << 20
"""pip shows a download's progress only for files over 512 kB."""


def make_wheel(root: Path, name: str, version: str, files: Mapping[str, bytes]) -> str:
    """A wheel of ``files`` (plus its dist-info) published in the index at ``root``; its
    sha256. Stored, not compressed, so its size is that of ``files``."""
    stem = f"{name.replace('-', '_')}-{version}"
    filename = f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(root / filename, "w", zipfile.ZIP_STORED) as archive:
        for path, content in files.items():
            archive.writestr(path, content)
        metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        archive.writestr(f"{stem}.dist-info/METADATA", metadata)
        wheel = "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        archive.writestr(f"{stem}.dist-info/WHEEL", wheel)
        archive.writestr(f"{stem}.dist-info/RECORD", "")
    digest = hashlib.sha256((root / filename).read_bytes()).hexdigest()
    project = root / "simple" / re.sub(r"[-_.]+", "-", name).lower()
    project.mkdir(parents=True, exist_ok=True)
    (project / "index.html").write_text(
        f'<a href="../../{filename}#sha256={digest}">{filename}</a>\n'
    )
    return digest


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """No access log on the test's standard error."""


@contextmanager
def serving(root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Serve the index at ``root`` on loopback and point pip at it alone (no configuration file,
    a cache of its own); yields the index URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/simple/"
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", url)
    monkeypatch.setenv("PIP_CACHE_DIR", str(root.parent / "pip-cache"))
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
