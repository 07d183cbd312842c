"""Direct I/O for big entries (target 3 of docs/benchmarks.md), side by side in one process and one run.

At ``--size`` bytes per entry (64 KiB by default), ``--inflight`` entries outstanding:

(a)  plain: a Python loop appending ``--inflight`` entries' worth of bytes with one ``os.write``
     and one ``fdatasync`` per batch, buffered (the disk's buffered group-commit limit as Python
     sees it); (a2) is the same loop on another file: the A/A control;
(b)  the journal path, buffered: a ``Journal`` with the bookie's group-commit settings, each
     entry acknowledged after the fdatasync that covers it, freed slots refilled as one batch;
(c)  the same journal with ``journalDirectIO`` (``O_DIRECT``, aligned buffers); (c2) also with
     ``journalForceWriteThread`` (the next batch is written while the last one is fsynced);
(d)  the bookie's add path (journal + DbLedgerStorage write cache, flushed to entry logs in the
     background) with ``journalDirectIO`` and ``dbStorage_directIOEntryLogger``; with ``--all``
     also (d0), the same add path buffered.

Slices of ``--seconds`` rotate through the modes, in reverse order every other round (ABBA over
the modes); each mode's MB/s is divided by (a)'s in the same round, and the median of those
per-round ratios is reported with p10..p90.

    ./run bench direct_io_bench [--size 65536] [--inflight 64] [--seconds 1.0] [--rounds 10]
                                [--dir DIR] [--all] [--json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_bookie import AddPath, Entries, plain_slice, run_window
from bench_common import emit, pct

from vellum.bookie.assembly import journal_from_config
from vellum.config import ServerConfig

Slice = Callable[[float], tuple[int, float]]


class JournalPath:
    """A bare ``Journal`` with the bookie's defaults (Vellum's ServerConfig), buffered or direct."""

    def __init__(self, base: Path, size: int, inflight: int, *, direct: bool, force_write_thread: bool = False) -> None:
        config = ServerConfig(journal_force_write_thread=force_write_thread, journal_direct_io=direct)
        self.journal = journal_from_config(config, base, max_size_mb=256, max_backups=0)
        self.journal.start()
        if direct and not self.journal.direct_io:
            raise SystemExit(f"{base}: the filesystem refused O_DIRECT; pass --dir on a disk that takes it")
        self.entries = Entries(size)
        self.inflight = inflight

    def slice(self, seconds: float) -> tuple[int, float]:
        out = run_window(self.journal.log_entries, self.entries, self.inflight, seconds)
        self.journal.gc_journals(self.journal.current_mark())  # keep the disk from filling up
        return out

    def close(self) -> None:
        self.journal.shutdown()


def interleave(modes: dict[str, Slice], rounds: int, seconds: float, size: int) -> dict[str, Any]:
    """Rotate through ``modes`` (reversed every other round); per-round ratios against the
    first mode."""
    names = list(modes)
    rates: dict[str, list[float]] = {n: [] for n in names}
    ratios: dict[str, list[float]] = {n: [] for n in names[1:]}
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        got: dict[str, float] = {}
        for name in order:
            n, elapsed = modes[name](seconds)
            got[name] = n * size / elapsed / 1e6
        for name in names:
            rates[name].append(got[name])
        for name in names[1:]:
            ratios[name].append(got[name] / got[names[0]])
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {got[n]:.0f} MB/s" for n in names), file=sys.stderr)
    report: dict[str, Any] = {}
    for name in names:
        entry: dict[str, float] = {"median_mb_per_s": statistics.median(rates[name]),
                                   "p10_mb_per_s": pct(rates[name], 0.1), "p90_mb_per_s": pct(rates[name], 0.9)}
        if name in ratios:
            entry["ratio_vs_a_median"] = statistics.median(ratios[name])
            entry["ratio_vs_a_p10"] = pct(ratios[name], 0.1)
            entry["ratio_vs_a_p90"] = pct(ratios[name], 0.9)
        report[name] = entry
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=65536, help="entry payload bytes")
    ap.add_argument("--inflight", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=1.0, help="length of one slice")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir under ./data)")
    ap.add_argument("--all", action="store_true", help="also the bookie add path buffered (d0)")
    ap.add_argument("--no-bookie", action="store_true", help="skip the bookie add path (d)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    root = Path(args.dir or "data")
    root.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "size": args.size, "inflight": args.inflight,
        "slice_seconds": args.seconds, "rounds": args.rounds,
    }
    closers: list[Callable[[], None]] = []
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        base = Path(tmp)
        try:
            modes: dict[str, Slice] = {
                "(a) plain write+fdatasync": lambda s: plain_slice(base / "plain.bin", args.size, args.inflight, s),
                "(a2) plain, A/A control": lambda s: plain_slice(base / "plain2.bin", args.size, args.inflight, s),
            }
            jb = JournalPath(base / "journal-buffered", args.size, args.inflight, direct=False)
            closers.append(jb.close)
            modes["(b) journal buffered"] = jb.slice
            jd = JournalPath(base / "journal-direct", args.size, args.inflight, direct=True)
            closers.append(jd.close)
            modes["(c) journal direct I/O"] = jd.slice
            jf = JournalPath(base / "journal-direct-fw", args.size, args.inflight, direct=True, force_write_thread=True)
            closers.append(jf.close)
            modes["(c2) journal direct I/O, force-write thread"] = jf.slice
            if not args.no_bookie:
                bd = AddPath(base / "bookie-direct", args.size, args.inflight,
                             {"journal_direct_io": True, "db_storage_direct_io_entry_logger": True})
                closers.append(bd.close)
                modes["(d) add path, direct journal + entry logs"] = bd.slice
                if args.all:
                    bb = AddPath(base / "bookie-buffered", args.size, args.inflight, {})
                    closers.append(bb.close)
                    modes["(d0) add path, buffered"] = bb.slice
            report.update(interleave(modes, args.rounds, args.seconds, args.size))
        finally:
            for close in reversed(closers):
                close()
    emit(report, as_json=args.json)


if __name__ == "__main__":
    main()
