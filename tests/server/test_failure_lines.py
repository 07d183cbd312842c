"""``Channel.status_for``'s log lines: an unexpected failure is one ERROR line with its
traceback and ids, at most one per ``FAILURE_LOG_INTERVAL_S``; the next line says how many were
left out; the status and the count never depend on whether the line was written."""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest

from vellum.errors import EINTERNAL, EIO
from vellum.server import processors
from vellum.server.processors import Channel, Counters


def _channel() -> Channel:
    counters = Counters(max_adds=0, max_reads=0, max_frame_size=1 << 20)
    return Channel(cast(Any, None), counters, cast(Any, None), cast(Any, None), lambda: "10.0.0.1:5")


def test_unexpected_failures_are_one_line_per_interval_and_the_next_counts_those_left_out(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    monkeypatch.setattr(processors, "_monotonic", lambda: now[0])
    monkeypatch.setattr(processors, "_UNEXPECTED", processors._RateLimitedLog(logging.ERROR, 5.0))
    monkeypatch.setattr(processors, "_IO_ERRORS", processors._RateLimitedLog(logging.WARNING, 5.0))
    ch = _channel()
    with caplog.at_level(logging.DEBUG, logger="vellum.server.bookie_server"):
        assert ch.status_for(KeyError("bug 1"), "READ", 7, 1) == EINTERNAL
        assert ch.status_for(KeyError("bug 2"), "READ", 7, 2) == EINTERNAL  # left out
        assert ch.status_for(OSError("disk"), "READ", 7, 3) == EIO  # its own kind: written
        now[0] += 5.0
        assert ch.status_for(KeyError("bug 3"), "READ", 8, 4) == EINTERNAL
    lines = [r for r in caplog.records if r.name == "vellum.server.bookie_server"]
    assert [(r.levelno, r.getMessage()) for r in lines] == [
        (logging.ERROR, "READ of entry 1 of ledger 7 from 10.0.0.1:5 failed unexpectedly, answering EINTERNAL: "
                        "KeyError('bug 1')"),
        (logging.WARNING, "READ of entry 3 of ledger 7 from 10.0.0.1:5: answering EIO: disk"),
        (logging.ERROR, "READ of entry 4 of ledger 8 from 10.0.0.1:5 failed unexpectedly, answering EINTERNAL: "
                        "KeyError('bug 3') (1 more since the last such line)"),
    ]
    assert lines[0].exc_info is not None and lines[0].exc_info[1] is not None
    assert lines[1].exc_info is None
    assert (lines[2].ledger_id, lines[2].entry_id) == (8, 4)  # type: ignore[attr-defined]
    assert ch.counters.errors[("READ", "EINTERNAL")] == 3 and ch.counters.errors[("READ", "EIO")] == 1
