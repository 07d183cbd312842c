"""Which values are secrets, and hiding them: the one redaction rule of every view of the
cluster (the bookies' admin HTTP answers, the operator console's pages).

A value is secret when its key names a password or a master key (``password``, ``passwd``,
``masterKey``, in any case and with ``_`` / ``-`` / ``.`` anywhere, so the custom-metadata key
``application.password`` is one). ``redact`` replaces such values, at any depth of dicts and
lists, with ``REDACTED``; the key stays visible (that a ledger has a password is not a secret).
"""

from __future__ import annotations

from typing import Any

REDACTED = "(redacted)"


def is_secret_key(name: str) -> bool:
    """Whether values under the key ``name`` are secrets."""
    low = name.lower().replace("_", "").replace("-", "")
    return "password" in low or "passwd" in low or "masterkey" in low


def redact(data: Any) -> tuple[Any, bool]:
    """``data`` with every value under a secret key (``is_secret_key``) replaced by
    ``REDACTED``; and whether anything was."""
    if isinstance(data, dict):
        out: dict[Any, Any] = {}
        changed = False
        for k, v in data.items():
            if isinstance(k, str) and is_secret_key(k):
                out[k] = REDACTED
                changed = changed or v != REDACTED
            else:
                out[k], c = redact(v)
                changed = changed or c
        return out, changed
    if isinstance(data, list):
        items = [redact(v) for v in data]
        return [v for v, _ in items], any(c for _, c in items)
    return data, False
