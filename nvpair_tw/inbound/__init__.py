"""The client side of the wire: protocol limits on a facade's ``Site`` and who may talk to it."""

from __future__ import annotations

from nvpair_tw.inbound._cors import CorsPolicy, parse_origin
from nvpair_tw.inbound._ingress import (
    IngressConfig,
    IngressConfigError,
    IngressPolicy,
    Rejection,
    parse_ingress,
)
from nvpair_tw.inbound._limits import LimitedChannel, LimitedSite, allow_origin, make_site

__all__ = [
    "CorsPolicy",
    "IngressConfig",
    "IngressConfigError",
    "IngressPolicy",
    "LimitedChannel",
    "LimitedSite",
    "Rejection",
    "allow_origin",
    "make_site",
    "parse_ingress",
    "parse_origin",
]
