"""nvpair-tw: one address in front of several local LLM engines, with failover past stalled nodes."""

from nvpair_tw._version import __version__

__all__ = ["__version__"]
