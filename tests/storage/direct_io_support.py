"""Where direct I/O tests can write: a directory whose filesystem takes ``O_DIRECT`` (imported by
name: tests/ has no packages).

pytest's ``tmp_path`` lives under ``/tmp``, which may be a tmpfs that refuses ``O_DIRECT``
(``EINVAL``). ``direct_io_dir`` probes it; if refused, it uses ``.pytest-directio/`` in the
checkout (the disk the project lives on); if that refuses too the test is skipped, saying so.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from vellum.storage.direct_io import O_DIRECT

CHECKOUT_DIR = Path(__file__).resolve().parents[2] / ".pytest-directio"


def takes_direct_io(directory: Path) -> str | None:
    """None if an aligned ``O_DIRECT`` write works in ``directory``, else why not."""
    if not O_DIRECT:
        return "O_DIRECT is not available on this platform"
    probe = directory / ".o_direct_probe"
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT | O_DIRECT, 0o644)
    except OSError as e:
        return f"open(O_DIRECT) in {directory}: {e.strerror}"
    buf = mmap.mmap(-1, 4096)
    try:
        os.pwrite(fd, buf, 0)
    except OSError as e:
        return f"aligned O_DIRECT write in {directory}: {e.strerror}"
    finally:
        buf.close()
        os.close(fd)
        probe.unlink()
    return None


@pytest.fixture
def direct_io_dir(tmp_path: Path) -> Iterator[Path]:
    """A fresh directory on a filesystem that takes O_DIRECT (see the module docstring)."""
    why = takes_direct_io(tmp_path)
    if why is None:
        yield tmp_path
        return
    CHECKOUT_DIR.mkdir(exist_ok=True)
    why_checkout = takes_direct_io(CHECKOUT_DIR)
    if why_checkout is not None:
        pytest.skip(f"no directory takes O_DIRECT: {why}; {why_checkout}")
    path = Path(tempfile.mkdtemp(dir=CHECKOUT_DIR))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
