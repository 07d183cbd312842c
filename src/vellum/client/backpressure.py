"""Back-pressure policy of the client: what a writer or reader does when a bookie answers
TOOMANYREQUESTS (its ``maxAddsInProgressLimit`` / ``maxReadsInProgressLimit`` is reached).

Responsibility: the retry delays and the send-window arithmetic, apart from the I/O that applies
them (``ledger_writer.py`` for adds, ``replica_read.py`` for reads). Pure apart from the jitter's
random numbers: no I/O, no clock.

Invariants:
- back-pressure is not a failure: a refused request goes to the same bookie again after
  :func:`backoff_delay` (exponential from ``BACKOFF_INITIAL_S``, capped at ``BACKOFF_MAX_S``,
  jittered to ``[base / 2, base]`` so that refused requests do not come back in one burst);
- a writer's send window is cut by :func:`cut_window` (halved, never below ``MIN_WINDOW``) at most
  once per ``WINDOW_CUT_INTERVAL_S`` and grows back by about one per window of acknowledged adds
  (TCP-like AIMD; the growth is inline on the writer's ack path), up to its maximum.
"""

from __future__ import annotations

import random

#: first delay before re-sending to a bookie that pushed back, and the cap of its exponential growth
BACKOFF_INITIAL_S = 0.005
BACKOFF_MAX_S = 0.2
#: floor of a writer's send window under back-pressure, and the least interval between two cuts
MIN_WINDOW = 16
WINDOW_CUT_INTERVAL_S = 0.005


def backoff_delay(attempt: int) -> float:
    """Delay before retry ``attempt`` (0-based) after back-pressure: exponential from 5 ms,
    capped at 200 ms, with jitter so that rejected requests do not come back in one burst."""
    base = min(BACKOFF_MAX_S, BACKOFF_INITIAL_S * (1 << min(attempt, 16)))
    return base * (0.5 + random.random() / 2)


def cut_window(window: float, in_flight: int) -> float:
    """The send window after a bookie pushed back: half of what was really in flight (the
    bookies' limit is below it), never below ``MIN_WINDOW``."""
    return max(MIN_WINDOW, min(window, in_flight) // 2)
