# -*- test-case-name: tests.ctl.test_commands -*-
"""``nvpair-ctl``, the control channel's console command (docs/control.md): nodes, drain,
cordon, uncordon, load, unload, usage and the log level, as a table or as JSON.

A short-lived client on the standard library's sockets: it imports neither Twisted nor the
proxy's own packages, so it starts at once and runs wherever the package is installed. It is
installed as a ``console_scripts`` entry point (``setup.cfg``); ``python -m nvpair_tw.ctl`` is the
same command.
"""

from nvpair_tw.ctl._commands import main
from nvpair_tw.ctl._endpoint import DEFAULT_CONTROL

__all__ = ["DEFAULT_CONTROL", "main"]
