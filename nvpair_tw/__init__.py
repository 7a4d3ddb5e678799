"""nvpair-tw: one address in front of several local LLM engines, with failover past stalled nodes.

What is public, and kept stable:

- The twistd plugin: ``twistd -n nvpair --engine ollama ...`` (``twisted/plugins/nvpair_plugin.py``,
  options and service in :mod:`nvpair_tw.tap`), and the log observer for twistd's ``--logger``:
  ``nvpair_tw.logs.compactJson``.
- The console command ``nvpair-ctl`` (:mod:`nvpair_tw.ctl`, a ``console_scripts`` entry point):
  the control channel from a shell.
- :mod:`nvpair_tw.testing`: the public test double, simulated engines behind an in-process proxy,
  for tests of code that talks to nvpair-tw.
- The event names (constants in :mod:`nvpair_tw.events`), as published on the control channel,
  ``GET /events`` on the admin listener and in the logs: ``workload:queued``,
  ``workload:started``, ``workload:completed``, ``workload:errored``, ``proxy/request``,
  ``node/cooldown``, ``node/cooldown-ended``, ``node/cordon``, ``node/uncordon``.
- ``__version__``.

Every other module is internal: each subpackage declares its face in ``__all__`` for the package's
own use, and may change between releases.
"""

from nvpair_tw._version import __version__

__all__ = ["__version__"]
