"""The client side of the wire: protocol limits on a facade's ``Site``, who may talk to it, and how
much (named keys with scopes and limits), and one strict reading of a request's path and body."""

from __future__ import annotations

from nvpair_tw.inbound._cors import CorsPolicy, parse_origin
from nvpair_tw.inbound._ingress import (
    IngressConfig,
    IngressConfigError,
    IngressPolicy,
    Rejection,
    model_not_allowed,
    parse_ingress,
)
from nvpair_tw.inbound._keys import (
    LOCAL,
    Caller,
    KeyBook,
    KeyRules,
    KeysFileError,
    env_key_name,
    read_keys_file,
)
from nvpair_tw.inbound._limits import LimitedChannel, LimitedSite, allow_origin, make_site
from nvpair_tw.inbound._parse import (
    LARGE_BODY,
    Target,
    parse_body,
    parse_large,
    parse_target,
    read_model,
)
from nvpair_tw.inbound._rates import Change, LimitCounters, Permit, RateLimiter, Refusal

__all__ = [
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
    "LimitedSite",
    "Permit",
    "RateLimiter",
    "Refusal",
    "Rejection",
    "Target",
    "allow_origin",
    "env_key_name",
    "make_site",
    "model_not_allowed",
    "parse_body",
    "parse_ingress",
    "parse_large",
    "parse_origin",
    "parse_target",
    "read_keys_file",
    "read_model",
]
