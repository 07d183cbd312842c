"""Child process of the compaction crash test: opens a ledger storage on argv[1] and runs one
forced GC pass in which metadata lists only the ledgers in argv[2] (comma-separated). When the
compaction step named by the ``VELLUM_GC_CRASH_AT`` environment variable is reached (for the
``VELLUM_GC_CRASH_NTH``-th time, default 1), the process kills itself with SIGKILL."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from gc_support import FakeLister, open_storage

from vellum.storage.gc import GarbageCollectorThread, GcSettings


def main() -> None:
    base = Path(sys.argv[1])
    live = [int(x) for x in sys.argv[2].split(",")]
    crash_at = os.environ.get("VELLUM_GC_CRASH_AT", "")
    nth = int(os.environ.get("VELLUM_GC_CRASH_NTH", "1"))
    seen = [0]

    def hook(step: str) -> None:
        if step == crash_at:
            seen[0] += 1
            if seen[0] == nth:
                sys.stdout.write(f"CRASH {step}\n")
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)

    st = open_storage(base)
    gc = GarbageCollectorThread(st, GcSettings(), lister=FakeLister(live), step_hook=hook)
    gc.run_once(force=True)
    sys.stdout.write("DONE\n")
    st.close()


if __name__ == "__main__":
    main()
