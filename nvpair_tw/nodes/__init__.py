"""The machines behind a facade: nodes merged from every source into one view, and TLS trust toward
HTTPS nodes, and the model catalogue of the nodes file (one model under many names), and the
self-loop check (a node that is this very process).
"""

from __future__ import annotations

from nvpair_tw.nodes._catalogue import Catalogue, ModelNames
from nvpair_tw.nodes._directory import (
    Node,
    NodeDirectory,
    NodesFileError,
    load_nodes_file,
    public_url,
    validate_url,
)
from nvpair_tw.nodes._guard import SelfGuard
from nvpair_tw.nodes._policy import ModelPolicy
from nvpair_tw.nodes._self import is_self
from nvpair_tw.nodes._tls import NodeTrustPolicy, tls_endpoint

__all__ = [
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
]
