"""Calling a bookie's admin HTTP API from a tool (``vellum shell gc``, ``gc-status``,
``entrylogs-usage``, ``vellum spark gc-report``), secured or not; and the one rule of when an
admin token may travel to a bookie (``token_refusal``), which the operator console follows too.

A secured bookie (``httpServerTlsEnable``, ``tokenSecretKeyFile``/``tokenPublicKeyFile``) answers
only on https, with its certificate from the cluster's CA, and wants ``Authorization: Bearer``
with an admin token for changes (and for reads with ``httpServerTokenRequiredForReads``). A tool
gets both from files: ``AdminHttpAccess.from_files(token_file, ca_file)``. Refusals become
``AdminHttpCallError`` with what to do: 401 (no or bad token), 403 (no admin role), a
certificate the CA file does not vouch for, a plaintext URL to an https bookie.

Where the token goes (docs/security.md, "Console and admin token"): an admin HTTP address may
come from a bookie's registration, which anyone who can write to the metadata store can forge.
So the token is sent only over https, to a bookie whose certificate was verified against the CA
file given (``--http-ca-file``; the system's CAs vouch for any web site, not for a bookie), and
only when the call needs it: a change always, a read only after the bookie answered 401 without
one (remembered per address). Every other case refuses the call with the reason instead of
sending the token.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vellum.errors import VellumError

#: a bigger answer is refused (the entry log listing of a large bookie is a few MB)
MAX_ANSWER_BYTES = 64 << 20
_MAX_TOKEN_BYTES = 16 << 10


class AdminHttpCallError(VellumError):
    """An admin HTTP call failed; the message says why and what to do."""


_READS = frozenset({"GET", "HEAD"})


def token_refusal(base_url: str, *, ca_file: str, context: ssl.SSLContext | None) -> str | None:
    """Why the admin token must not be sent to ``base_url``, or None when it may: only over
    https with a context that verifies the peer against ``ca_file`` (the cluster's CA)."""
    scheme = base_url.split("://", 1)[0].lower()
    if scheme != "https":
        return (f"{base_url} is plain http: the admin token is sent only over https, to a bookie whose "
                "certificate is verified (set httpServerTlsEnable=true on the bookie and give --http-ca-file)")
    if not ca_file or context is None:
        return (f"the admin token is sent to {base_url} only once its certificate is checked against the "
                "cluster's CA: give --http-ca-file with the CA certificate that signed the bookies' https "
                "certificates")
    if context.verify_mode != ssl.CERT_REQUIRED or not context.check_hostname:
        return (f"the TLS settings for {base_url} do not verify the bookie's certificate and name: the admin "
                "token is not sent (give --http-ca-file)")
    return None


def redacted_token(token: str | None) -> str:
    """What a ``repr`` shows for a token: whether there is one, never its text."""
    return "'(redacted)'" if token else repr(token)


@dataclass(frozen=True)
class AdminHttpAccess:
    """Credentials for admin HTTP calls: a bearer token and the CA of https bookies (both
    optional); the token travels only as ``token_refusal`` allows (see the module docstring)."""

    token: str = ""
    ca_file: str = ""
    timeout_s: float = 30.0
    #: built once from ``ca_file``; None: the system's CAs (then no token is ever sent)
    ssl_context: ssl.SSLContext | None = field(default=None, compare=False, repr=False)
    #: base URLs whose reads answered 401 without a token (their reads carry it from then on)
    _token_reads: set[str] = field(default_factory=set, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.ca_file and self.ssl_context is None:
            object.__setattr__(self, "ssl_context", _ca_context(self.ca_file))

    def __repr__(self) -> str:
        return (f"AdminHttpAccess(token={redacted_token(self.token)}, ca_file={self.ca_file!r}, "
                f"timeout_s={self.timeout_s!r})")

    @classmethod
    def from_files(cls, token_file: str | None, ca_file: str | None, *, timeout_s: float = 30.0) -> AdminHttpAccess:
        token = ""
        if token_file:
            path = Path(token_file)
            try:
                raw = path.read_bytes()[: _MAX_TOKEN_BYTES + 1]
            except OSError as e:
                raise AdminHttpCallError(f"cannot read the token file {path}: {e.strerror}") from None
            if len(raw) > _MAX_TOKEN_BYTES:
                raise AdminHttpCallError(f"{path} is larger than a token can be ({_MAX_TOKEN_BYTES} bytes): "
                                         "is it the right file?")
            token = raw.decode("utf-8", "replace").strip()
            if not token:
                raise AdminHttpCallError(f"the token file {path} is empty: issue one with "
                                         "`vellum security issue-token --subject ops --role admin`")
        return cls(token=token, ca_file=ca_file or "", timeout_s=timeout_s,
                   ssl_context=_ca_context(ca_file) if ca_file else None)

    def token_refusal(self, base_url: str) -> str | None:
        """Why this access's token must not go to ``base_url`` (None: it may)."""
        return token_refusal(base_url, ca_file=self.ca_file, context=self.ssl_context)

    def call(self, base_url: str, path: str, method: str = "GET", body: Any = None) -> Any:
        """``method base_url+path`` with ``body`` as JSON; the answer parsed as JSON (else text).
        A change carries the token (refused, with the reason, where it may not go); a read goes
        without it unless the bookie answered 401 to a tokenless read before."""
        base = base_url.rstrip("/")
        read = method.upper() in _READS
        refusal = self.token_refusal(base) if self.token else None
        if self.token and not read and refusal is not None:
            raise AdminHttpCallError(f"{method} {base}{path} not sent: {refusal}")
        with_token = bool(self.token) and refusal is None and (not read or base in self._token_reads)
        try:
            return self._send(base, path, method, body, with_token)
        except _Unauthorized as e:
            if not read or with_token or not self.token:
                raise e.error from None
            if refusal is not None:
                raise AdminHttpCallError(f"{e.error}; the token was not sent: {refusal}") from None
            self._token_reads.add(base)
            return self._send(base, path, method, body, True)

    def _send(self, base_url: str, path: str, method: str, body: Any, with_token: bool) -> Any:
        data = json.dumps(body).encode() if body is not None else (b"" if method != "GET" else None)
        req = urllib.request.Request(base_url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if body is not None:
            req.add_header("Content-Type", "application/json")
        if with_token:
            req.add_header("Authorization", f"Bearer {self.token}")
        what = f"{method} {base_url}{path}"
        try:
            opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=self.ssl_context),
                                                 _NoRedirect())
            with opener.open(req, timeout=self.timeout_s) as resp:
                raw = resp.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as e:
            with e:
                detail = _error_text(e.read(4096))
            hint = _hint(e.code, self.token if with_token else "")
            error = AdminHttpCallError(f"{what}: HTTP {e.code}: {detail}{hint}")
            if e.code == 401:
                raise _Unauthorized(error) from None
            raise error from None
        except urllib.error.URLError as e:
            raise AdminHttpCallError(f"{what}: {_reason_text(e.reason, base_url, self.ca_file)}") from None
        except (OSError, ValueError) as e:  # connection reset, a plaintext bookie closing on TLS, ...
            hint = (" (is the bookie's admin API https? then give an https:// URL)"
                    if base_url.startswith("http://") else "")
            raise AdminHttpCallError(f"{what}: {type(e).__name__}: {e}{hint}") from None
        if len(raw) > MAX_ANSWER_BYTES:
            raise AdminHttpCallError(f"{what}: answer larger than {MAX_ANSWER_BYTES} bytes")
        text = raw.decode("utf-8", "replace")
        try:
            return json.loads(text)
        except ValueError:
            return text


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are answers, not followed: following one would carry the token elsewhere."""

    def redirect_request(self, *_args: Any, **_kwargs: Any) -> None:
        return None


class _Unauthorized(Exception):
    """A 401 answer (``call`` may retry a read with the token)."""

    def __init__(self, error: AdminHttpCallError) -> None:
        super().__init__(str(error))
        self.error = error


def _ca_context(ca_file: str) -> ssl.SSLContext:
    """A client context that trusts only the CAs in ``ca_file`` and checks the host name."""
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as e:
        raise AdminHttpCallError(f"cannot load CA certificates from {ca_file}: {e}; give a PEM file "
                                 "with the certificate of the CA that signed the bookies' https "
                                 "certificates") from None


def _error_text(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace").strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        return text[:300]
    if isinstance(parsed, dict) and "error" in parsed:
        return str(parsed["error"])
    return text[:300]


def _hint(status: int, token: str) -> str:
    if status == 401:
        return ("; give a token with the admin role (--admin-token-file)" if not token
                else "; the token was refused: is it issued by this cluster's key and still valid?")
    if status == 403:
        return "; the token lacks the admin role: issue one with `vellum security issue-token --subject ops --role admin`"
    return ""


def _reason_text(reason: object, base_url: str, ca_file: str) -> str:
    if isinstance(reason, ssl.SSLCertVerificationError):
        fix = ("give --http-ca-file with the cluster's CA certificate" if not ca_file
               else f"the certificate is not signed by a CA in {ca_file}, or names another host")
        return f"the bookie's certificate was not accepted ({reason.verify_message}): {fix}"
    if isinstance(reason, ssl.SSLError):
        hint = " (the bookie's admin API is plain http? then give an http:// URL)" if base_url.startswith(
            "https://") else ""
        return f"TLS failed: {reason}{hint}"
    if isinstance(reason, ConnectionRefusedError):
        return f"connection refused at {base_url}: is the bookie running and httpServerEnabled=true?"
    return f"cannot reach {base_url}: {reason}"
