"""The client side of the wire: protocol limits on a facade's ``Site``, who may talk to it (the
``local`` test, keys and roles, docs/behaviour.md §14.2), and how much (named keys with scopes and
limits)."""

from __future__ import annotations

from nvpair_tw.inbound._cors import CorsPolicy, parse_origin
from nvpair_tw.inbound._ingress import (
    IngressConfig,
    IngressConfigError,
    IngressPolicy,
    Rejection,
    ingress_warnings,
    model_not_allowed,
    parse_ingress,
)
from nvpair_tw.inbound._keys import (
    LOCAL,
    Caller,
    KeyBook,
    KeyRules,
    KeysFileError,
    Role,
    env_key_name,
    read_keys_file,
    read_private_file,
)
from nvpair_tw.inbound._limits import (
    LimitedChannel,
    LimitedRequest,
    LimitedSite,
    allow_origin,
    make_site,
)
from nvpair_tw.inbound._local import Locality, LocalNames, locality
from nvpair_tw.inbound._parse import (
    LARGE_BODY,
    Parsed,
    model_rule,
    parse_body,
    parse_document,
    parse_document_large,
    parse_large,
    read_model,
    read_models,
)
from nvpair_tw.inbound._rates import (
    NOT_COUNTED,
    Change,
    LimitCounters,
    Permit,
    RateLimiter,
    Refusal,
)
from nvpair_tw.inbound._target import Target, parse_target

__all__ = [
    "LARGE_BODY",
    "LOCAL",
    "NOT_COUNTED",
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
]
