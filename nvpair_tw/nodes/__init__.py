"""The machines behind a facade: nodes merged from every source into one view, and TLS trust toward
HTTPS nodes.
"""

from __future__ import annotations

from nvpair_tw.nodes._directory import (
    Node,
    NodeDirectory,
    NodesFileError,
    load_nodes_file,
    public_url,
    validate_url,
)
from nvpair_tw.nodes._tls import NodeTrustPolicy, tls_endpoint

__all__ = [
    "Node",
    "NodeDirectory",
    "NodeTrustPolicy",
    "NodesFileError",
    "load_nodes_file",
    "public_url",
    "tls_endpoint",
    "validate_url",
]
