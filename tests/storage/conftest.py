"""Fixtures of the storage tests: ``direct_io_dir`` (a directory whose filesystem takes O_DIRECT,
see ``direct_io_support.py``)."""

from __future__ import annotations

from direct_io_support import direct_io_dir

__all__ = ["direct_io_dir"]
