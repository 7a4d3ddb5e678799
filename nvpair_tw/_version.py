"""
Provides nvpair_tw version information.
"""

# This file is auto-generated! Do not edit!
# Use `incremental` to change this file.

from incremental import Version

__version__ = Version("nvpair_tw", 26, 11, 0)
__all__ = ["__version__"]
