# -*- test-case-name: tests.ctl.test_commands -*-
"""``python -m nvpair_tw.ctl``: the ``nvpair-ctl`` command."""

import sys

from nvpair_tw.ctl import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
