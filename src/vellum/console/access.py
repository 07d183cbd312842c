"""Who may use the console: its own addresses (``AddressCheck``) and its users' sessions
(``Sessions``); docs/console.md, "Who may use the console".

- ``AddressCheck``: a request's ``Host`` must name the console: the address the connection
  arrived on (``localhost`` too when that is a loopback address), the name it was told to
  listen on, or one of its configured public names. A page on another site that resolves its
  own name to the console's address (DNS rebinding) sends its own name as ``Host`` and is
  refused. A request that changes something must also carry an ``Origin`` naming the console:
  a form on another site, or a request without one, is refused.
- ``Sessions``: a login makes a ``Session``, known by a random id (the cookie) and carrying its
  own random anti-forgery token; it ends at its expiry (the login token's own expiry at the
  latest) or at logout. Bounded: past ``max_sessions`` the least recently used is forgotten
  (so a health probe or a script without cookies never pushes out a session in use).

Invariants: nothing here trusts a value a browser of another site can choose (a cookie
without a matching session is no session; ``Host`` and ``Origin`` are compared against the
console's own addresses, never against each other); ids and tokens come from ``secrets``.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

#: sessions remembered at most (the least recently used is forgotten first)
MAX_SESSIONS = 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def split_host_port(value: str) -> tuple[str, int | None] | None:
    """``(host, port or None)`` of a ``Host`` header value, lower-cased and without IPv6
    brackets; None when it is not one (empty, a user part, a bad port)."""
    value = value.strip()
    if not value or any(c in value for c in "@/\\ \t\r\n"):
        return None
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        host, rest = value[1:end], value[end + 1:]
        if rest and not rest.startswith(":"):
            return None
        port_text = rest[1:] if rest else ""
    else:
        host, sep, port_text = value.rpartition(":") if value.count(":") == 1 else (value, "", "")
        if not sep:
            host = value
    if not host:
        return None
    if not port_text:
        return host.lower(), None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    return host.lower(), int(port_text)


class AddressCheck:
    """``Host`` and ``Origin`` checks (see the module docstring). ``listen_host``: what the
    console was told to listen on; ``public_names``: ``host`` (any port) or ``host:port``."""

    def __init__(self, listen_host: str, public_names: Iterable[str] = ()) -> None:
        self._listen = listen_host.strip("[]").lower()
        self._wildcard = self._listen in ("", "0.0.0.0", "::")
        self._public: list[tuple[str, int | None]] = []
        for name in public_names:
            parsed = split_host_port(name)
            if parsed is None:
                raise ValueError(f"public name {name!r} is not a host or host:port")
            self._public.append(parsed)

    def host_allowed(self, host_header: str | None, local: tuple[str, int], scheme: str) -> bool:
        """Whether ``host_header`` names this console, reached on ``local`` (its socket's
        address and port) over ``scheme``."""
        if not host_header:
            return False
        parsed = split_host_port(host_header)
        if parsed is None:
            return False
        name, port = parsed
        for public, public_port in self._public:
            if name == public and (public_port is None or public_port == (port or _DEFAULT_PORTS.get(scheme))):
                return True
        local_ip, local_port = local[0].lower(), local[1]
        if (port or _DEFAULT_PORTS.get(scheme)) != local_port:
            return False
        own = {local_ip}
        if not self._wildcard:
            own.add(self._listen)
        if is_loopback(local_ip):
            own.add("localhost")
        return name in own

    def origin_allowed(self, origin: str | None, local: tuple[str, int]) -> bool:
        """Whether a request's ``Origin`` is the console itself (``None`` and ``null`` are not)."""
        if not origin or origin.strip().lower() == "null":
            return False
        parts = urlsplit(origin.strip())
        if parts.scheme not in _DEFAULT_PORTS or not parts.netloc or parts.path not in ("", "/"):
            return False
        host = parts.netloc if parts.port is not None else f"{parts.netloc}:{_DEFAULT_PORTS[parts.scheme]}"
        return self.host_allowed(host, local, parts.scheme)


@dataclass(frozen=True)
class Session:
    """A logged-in user (or, on a loopback console without login, the local operator)."""

    session_id: str
    csrf: str
    subject: str
    roles: tuple[str, ...]
    via: str  # "token", "certificate" or "loopback"
    expires_at: float

    @property
    def admin(self) -> bool:
        return "admin" in self.roles

    def csrf_matches(self, value: str) -> bool:
        return hmac.compare_digest(value.encode(), self.csrf.encode())

    def __repr__(self) -> str:
        return f"Session(subject={self.subject!r}, roles={self.roles!r}, via={self.via!r})"


class Sessions:
    """The console's sessions (see the module docstring)."""

    def __init__(self, ttl_s: float, *, max_sessions: int = MAX_SESSIONS) -> None:
        self.ttl_s = ttl_s
        self._max = max_sessions
        self._by_id: OrderedDict[str, Session] = OrderedDict()

    def create(self, subject: str, roles: Iterable[str], *, via: str, not_after: float | None = None,
               now: float | None = None) -> Session:
        now = time.time() if now is None else now
        expires = now + self.ttl_s if not_after is None else min(now + self.ttl_s, not_after)
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), subject, tuple(roles), via, expires)
        self._by_id[session.session_id] = session
        while len(self._by_id) > self._max:
            self._by_id.popitem(last=False)
        return session

    def get(self, session_id: str | None, *, now: float | None = None) -> Session | None:
        if not session_id:
            return None
        session = self._by_id.get(session_id)
        if session is None:
            return None
        if session.expires_at <= (time.time() if now is None else now):
            del self._by_id[session_id]
            return None
        self._by_id.move_to_end(session_id)
        return session

    def end(self, session_id: str) -> None:
        self._by_id.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._by_id)
