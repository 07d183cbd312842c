"""The bookies as the console sees them: who is registered, where their admin HTTP API is, and
what it answers.

Responsibility:
- ``BookieDirectory`` remembers every bookie the console has seen registered (or that the
  metadata store names as a missing replica), with its last admin HTTP address, so a bookie
  that dies shows as *down* instead of vanishing; bounded by the number of bookies;
- ``AdminHttp`` calls a bookie's admin HTTP API (BookKeeper's paths) with a short timeout; every
  failure (refused, timeout, an HTTP error, an answer that is not JSON, a redirect) becomes an
  ``AdminHttpError`` whose text is shown on the page. Its admin token travels only as
  ``security.admin_http_client.token_refusal`` allows (https, certificate verified against
  ``--http-ca-file``): changes carry it or are refused with the reason; reads go without it
  unless that bookie answered 401 to a tokenless read (remembered per address). The addresses
  come from registrations anyone with write access to the metadata store can forge;
- ``probe`` builds a ``BookieView``: state (writable, read-only, down, decommissioning), disk
  usage per ledger dir, GC details. A registered bookie whose admin HTTP does not answer is
  checked on its bookie port: nothing listening there means down (its registration has not
  expired yet), a live port means the bookie runs but its admin API has a problem.
Addresses come from the registration data (``httpAddress``, ``service.service_info``), the
same way ``vellum spark gc-report`` finds them.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from vellum.meta.api import MetadataStore
from vellum.security.admin_http_client import redacted_token, token_refusal

#: seconds one admin HTTP call may take before the bookie is reported as not answering
HTTP_TIMEOUT_S = 2.0
#: how long closing waits for the TLS connections it closed to finish their shutdown
_TLS_CLOSE_GRACE_S = 0.25
#: seconds a TCP connect to a bookie port may take
PORT_TIMEOUT_S = 0.5
#: bytes of an answer the console reads at most (a bookie answering garbage must not fill memory)
MAX_ANSWER_BYTES = 32 * 1024 * 1024


class AdminHttpError(Exception):
    """A bookie's admin HTTP call failed; ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def http_address_of(data: bytes | None) -> str | None:
    """The ``httpAddress`` of a registration's data, or None (absent, not JSON, not a URL)."""
    if not data:
        return None
    try:
        url = json.loads(data.decode()).get("httpAddress")
    except (ValueError, UnicodeDecodeError, AttributeError):
        return None
    if isinstance(url, str) and url.startswith(("http://", "https://")):
        return url.rstrip("/")
    return None


@dataclass
class Registration:
    writable: frozenset[str]
    read_only: frozenset[str]
    http: dict[str, str | None]


def read_registrations(store: MetadataStore) -> Registration:
    """Blocking: the registered bookies and their admin HTTP addresses."""
    reg = store.registration
    rw = frozenset(str(b) for b in reg.list_bookies())
    ro = frozenset(str(b) for b in reg.list_bookies(read_only=True))
    http = {b: http_address_of(reg.get_bookie_data(b)) for b in sorted(rw | ro)}  # type: ignore[arg-type]
    return Registration(rw, ro - rw, http)


@dataclass
class KnownBookie:
    bookie_id: str
    http_url: str | None
    first_seen: float
    last_registered: float | None


class BookieDirectory:
    """Every bookie seen so far (see the module docstring)."""

    def __init__(self) -> None:
        self._known: dict[str, KnownBookie] = {}

    def update(self, registration: Registration, others: Collection[str] = (),
               now: float | None = None) -> list[KnownBookie]:
        now = time.time() if now is None else now
        for b in registration.writable | registration.read_only:
            k = self._known.get(b)
            url = registration.http.get(b)
            if k is None:
                self._known[b] = KnownBookie(b, url, now, now)
            else:
                k.last_registered = now
                if url:
                    k.http_url = url
        for b in others:
            if b not in self._known:
                self._known[b] = KnownBookie(b, None, now, None)
        return [self._known[b] for b in sorted(self._known)]

    def known(self) -> list[KnownBookie]:
        """Every bookie seen so far, by id (no update)."""
        return [self._known[b] for b in sorted(self._known)]

    def forget(self, bookie_id: str) -> None:
        """The bookie left the cluster (decommissioned): it is shown no more."""
        self._known.pop(bookie_id, None)


_READS = frozenset({"GET", "HEAD"})


class AdminHttp:
    """Admin HTTP calls to bookies (see the module docstring). Open on a running loop."""

    def __init__(self, *, token: str | None = None, ca_file: str = "",
                 timeout_s: float = HTTP_TIMEOUT_S) -> None:
        self._token = token
        self._ca_file = ca_file
        # only the cluster's CA: the system's CAs vouch for any web site, not for a bookie
        self._ssl = ssl.create_default_context(cafile=ca_file) if ca_file else None
        self._timeout = timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._token_reads: set[str] = set()

    def __repr__(self) -> str:
        return f"AdminHttp(token={redacted_token(self._token)}, ca_file={self._ca_file!r})"

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout),
                connector=aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else True, limit=64),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
            # aiohttp closes a TLS connection's transport without waiting for its shutdown to
            # finish: the TCP socket under it closes only when the bookie's close_notify has come.
            # A caller that closes its loop next (``asyncio.run``) would otherwise leave those
            # sockets open; a moment lets them finish, as aiohttp's own guidance for TLS says.
            await asyncio.sleep(_TLS_CLOSE_GRACE_S)

    @property
    def has_token(self) -> bool:
        return bool(self._token)

    def token_refusal(self, base: str) -> str | None:
        """Why the admin token must not go to ``base`` (None: it may)."""
        return token_refusal(base, ca_file=self._ca_file, context=self._ssl)

    async def call(self, base: str, path: str, method: str = "GET", body: Any = None,
                   *, parse_json: bool = True, timeout_s: float | None = None) -> Any:
        base = base.rstrip("/")
        read = method.upper() in _READS
        refusal = self.token_refusal(base) if self._token else None
        if self._token and not read and refusal is not None:
            raise AdminHttpError(f"{method} {path} not sent: {refusal}")
        with_token = bool(self._token) and refusal is None and (not read or base in self._token_reads)
        try:
            return await self._send(base, path, method, body, with_token, parse_json, timeout_s)
        except AdminHttpError as e:
            if e.status != 401 or not read or with_token or not self._token:
                raise
            if refusal is not None:
                raise AdminHttpError(f"{e}; the console's admin token was not sent: {refusal}", 401) from None
        self._token_reads.add(base)
        return await self._send(base, path, method, body, True, parse_json, timeout_s)

    async def _send(self, base: str, path: str, method: str, body: Any, with_token: bool, parse_json: bool,
                    timeout_s: float | None) -> Any:
        headers = {"Accept": "application/json"}
        if with_token:
            headers["Authorization"] = f"Bearer {self._token}"
        url = base + path
        kwargs: dict[str, Any] = {"headers": headers, "allow_redirects": False}
        if body is not None:
            kwargs["json"] = body
        if timeout_s is not None:
            kwargs["timeout"] = aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self._client().request(method, url, **kwargs) as resp:
                raw = await resp.content.read(MAX_ANSWER_BYTES + 1)
                text = raw[:MAX_ANSWER_BYTES].decode("utf-8", "replace")
                if resp.status >= 300:
                    raise AdminHttpError(f"{method} {path}: HTTP {resp.status}: {_error_text(text)}", resp.status)
        except AdminHttpError:
            raise
        except TimeoutError:
            raise AdminHttpError(f"{method} {path}: no answer within {timeout_s or self._timeout:g}s") from None
        except aiohttp.ClientConnectorCertificateError as e:
            fix = ("give --http-ca-file with the cluster's CA certificate" if not self._ca_file
                   else f"its certificate is not signed by a CA in {self._ca_file}, or names another host")
            raise AdminHttpError(f"{method} {path}: the certificate of {base} was not accepted "
                                 f"({e.certificate_error}): {fix}") from None
        except aiohttp.ClientConnectorError as e:
            raise AdminHttpError(f"{method} {path}: cannot connect to {base}: {e.os_error or e}") from None
        except (aiohttp.ClientError, OSError, ValueError) as e:
            raise AdminHttpError(f"{method} {path}: {type(e).__name__}: {e}") from None
        if len(raw) > MAX_ANSWER_BYTES:
            raise AdminHttpError(f"{method} {path}: answer larger than {MAX_ANSWER_BYTES} bytes")
        if not parse_json:
            return text
        try:
            return json.loads(text)
        except ValueError:
            raise AdminHttpError(f"{method} {path}: the answer is not JSON ({text[:80]!r})") from None


def _error_text(text: str) -> str:
    try:
        data = json.loads(text)
        if isinstance(data, dict) and "error" in data:
            return str(data["error"])[:300]
    except ValueError:
        pass
    return text.strip()[:300] or "(empty answer)"


async def port_open(bookie_id: str, timeout_s: float = PORT_TIMEOUT_S) -> bool:
    """Whether something accepts TCP connections on the bookie id's host:port."""
    host, _, port = bookie_id.rpartition(":")
    try:
        _r, w = await asyncio.wait_for(asyncio.open_connection(host.strip("[]"), int(port)), timeout_s)
    except (OSError, ValueError, TimeoutError):
        return False
    w.close()
    try:
        await w.wait_closed()
    except OSError:
        pass
    return True


# the states a bookie is shown in
WRITABLE, READ_ONLY, DOWN, DECOMMISSIONING = "writable", "read-only", "down", "decommissioning"


@dataclass
class BookieView:
    bookie_id: str
    http_url: str | None
    state: str
    registered: str | None  # "writable", "read-only" or None
    problems: list[str] = field(default_factory=list)
    disk: dict[str, Any] | None = None
    gc: list[dict[str, Any]] | None = None
    version: str | None = None

    @property
    def up(self) -> bool:
        return self.state in (WRITABLE, READ_ONLY)


async def probe(http: AdminHttp, known: KnownBookie, registration: Registration, *,
                decommissioning: bool = False, with_gc: bool = True) -> BookieView:
    b = known.bookie_id
    registered = WRITABLE if b in registration.writable else READ_ONLY if b in registration.read_only else None
    url = registration.http.get(b) or known.http_url
    view = BookieView(b, url, registered or DOWN, registered)
    if registered is None:
        view.state = DECOMMISSIONING if decommissioning else DOWN
        if known.last_registered is not None:
            view.problems.append("not registered any more")
        return view
    if url is None:
        view.problems.append("publishes no admin HTTP address in its registration")
        return view
    refusal = http.token_refusal(url) if http.has_token else None
    if refusal is not None:
        view.problems.append(f"no actions here: {refusal}")
    calls = [http.call(url, "/api/v1/bookie/state"), http.call(url, "/api/v1/bookie/disk_usage")]
    if with_gc:
        calls.append(http.call(url, "/api/v1/bookie/gc_details"))
    results = await asyncio.gather(*calls, return_exceptions=True)
    state = results[0]
    if isinstance(state, BaseException):
        if not await port_open(b):
            view.state = DOWN
            view.problems.append("nothing listens on its bookie port (the registration has not expired yet)")
        else:
            view.problems.append(f"admin HTTP: {state}")
        return view
    if isinstance(state, dict) and state.get("readOnly") is True:
        view.state = READ_ONLY
    elif not isinstance(state, dict):
        view.problems.append("admin HTTP: /api/v1/bookie/state is not a JSON object")
    disk = results[1]
    if isinstance(disk, AdminHttpError) and disk.status == 404:
        view.problems.append("this bookie's admin HTTP has no /api/v1/bookie/disk_usage (older version)")
    elif isinstance(disk, BaseException):
        view.problems.append(f"admin HTTP: {disk}")
    elif isinstance(disk, dict):
        view.disk = disk
        v = disk.get("version")
        view.version = str(v) if v is not None else None
    if with_gc:
        gc = results[2]
        if isinstance(gc, BaseException):
            view.problems.append(f"admin HTTP: {gc}")
        elif isinstance(gc, list):
            view.gc = [g for g in gc if isinstance(g, dict)]
    return view
