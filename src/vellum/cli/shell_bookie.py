"""Shell commands inspecting a bookie's directories offline: ``lastmark`` and ``cookie``.

Both only read files; they are safe while the bookie runs (the mark may be a checkpoint old).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click

from vellum.cli.output import emit_json, emit_kv, emit_table
from vellum.errors import VellumError
from vellum.format.lastmark import ZERO_MARK, LogMark
from vellum.storage.checkpoint import last_mark_path, read_last_mark_file, read_last_marks
from vellum.storage.cookies import cookie_path, read_cookie
from vellum.storage.dirs import current_dir

_MULTI_MARK = re.compile(r"^lastMark\.(\d+)$")


def _detect_journal_count(dirs: list[Path]) -> int:
    """1 if only ``lastMark`` files exist, else one more than the highest ``lastMark.<i>``."""
    highest = -1
    for d in dirs:
        cur = current_dir(d)
        if not cur.is_dir():
            continue
        for p in cur.iterdir():
            m = _MULTI_MARK.match(p.name)
            if m:
                highest = max(highest, int(m.group(1)))
    return highest + 1 if highest >= 0 else 1


def _mark_fields(mark: LogMark) -> dict[str, Any]:
    return {
        "journal_id": mark.journal_id,
        "journal_id_hex": f"{mark.journal_id:x}",
        "offset": mark.offset,
    }


def register(shell: click.Group) -> None:
    @shell.command("lastmark")
    @click.option(
        "--dir", "dirs", multiple=True, required=True, type=click.Path(file_okay=False, path_type=Path),
        help="ledger directory (repeat for each)",
    )
    @click.option(
        "--journals", type=click.IntRange(min=1), default=None,
        help="number of journals (default: detected from the lastMark files)",
    )
    @click.option("--json", "as_json", is_flag=True, help="machine-readable output")
    def lastmark(dirs: tuple[Path, ...], journals: int | None, as_json: bool) -> None:
        """Show the lastMark file(s) of ledger dirs and the effective mark replay starts from."""
        dir_list = list(dirs)
        count = journals or _detect_journal_count(dir_list)
        rows: list[dict[str, Any]] = []
        for d in dir_list:
            for i in range(count):
                path = last_mark_path(d, i, count)
                row: dict[str, Any] = {"dir": str(d), "journal": i, "file": path.name}
                try:
                    mark = read_last_mark_file(path)
                except VellumError as e:
                    row.update(status="corrupt", error=str(e))
                else:
                    if mark is None:
                        row["status"] = "missing"
                    else:
                        row.update(status="ok", **_mark_fields(mark))
                rows.append(row)
        try:
            effective = read_last_marks(dir_list, count)
        except VellumError as e:
            raise click.ClickException(str(e)) from None
        eff_rows = [
            {"journal": i, **_mark_fields(m), "from_start": m == ZERO_MARK} for i, m in enumerate(effective)
        ]
        if as_json:
            emit_json({"journal_count": count, "files": rows, "effective": eff_rows})
            return
        emit_table(
            ["dir", "file", "status", "journal id (hex)", "journal id", "offset"],
            [
                (r["dir"], r["file"], r["status"] if r["status"] != "corrupt" else f"corrupt: {r['error']}",
                 r.get("journal_id_hex"), r.get("journal_id"), r.get("offset"))
                for r in rows
            ],
            title="lastMark files",
        )
        emit_table(
            ["journal", "journal id (hex)", "journal id", "offset"],
            [(r["journal"], r["journal_id_hex"], r["journal_id"], r["offset"]) for r in eff_rows],
            title="effective mark (max over dirs; replay starts here)",
        )

    @shell.command("cookie")
    @click.option(
        "--dir", "dir_", required=True, type=click.Path(file_okay=False, path_type=Path),
        help="journal, ledger or index directory",
    )
    @click.option("--json", "as_json", is_flag=True, help="machine-readable output")
    def cookie(dir_: Path, as_json: bool) -> None:
        """Print the cookie (current/VERSION) stamped in a bookie directory."""
        try:
            c = read_cookie(dir_)
        except VellumError as e:
            raise click.ClickException(str(e)) from None
        if c is None:
            raise click.ClickException(f"no cookie in {cookie_path(dir_)}")
        data = {
            "file": str(cookie_path(dir_)),
            "layout_version": c.layout_version,
            "bookie_id": c.bookie_id,
            "journal_dirs": list(c.journal_dirs),
            "ledger_dirs": list(c.ledger_dirs),
            "index_dirs": list(c.index_dirs) if c.index_dirs else None,
            "instance_id": c.instance_id,
        }
        if as_json:
            emit_json(data)
            return
        emit_kv(
            {k: (", ".join(v) if isinstance(v, list) else v) for k, v in data.items()},
            title=f"cookie of {dir_}",
        )
