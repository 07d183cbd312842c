"""Vellum: a distributed, replicated, durable log store on Apache BookKeeper's design.

``vellum.BookKeeper`` is the blocking client, ``vellum.aio.BookKeeper`` the asyncio one.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Imported lazily so that ``import vellum.format`` etc. stays light.
    if name == "BookKeeper":
        from vellum.client.blocking import BookKeeper

        return BookKeeper
    raise AttributeError(name)
