"""Fixtures for the GC tests: a real ZooKeeper (session scope) for the metadata-driver cases."""

from __future__ import annotations





# zk_server: one ZooKeeper per session, in tests/conftest.py
