"""Calling a bookie's admin HTTP API from a tool (``vellum shell gc``, ``gc-status``,
``entrylogs-usage``, ``vellum spark gc-report``), secured or not.

A secured bookie (``httpServerTlsEnable``, ``tokenSecretKeyFile``/``tokenPublicKeyFile``) answers
only on https, with its certificate from the cluster's CA, and wants ``Authorization: Bearer``
with an admin token for changes (and for reads with ``httpServerTokenRequiredForReads``). A tool
gets both from files: ``AdminHttpAccess.from_files(token_file, ca_file)``. Refusals become
``AdminHttpCallError`` with what to do: 401 (no or bad token), 403 (no admin role), a
certificate the CA file does not vouch for, a plaintext URL to an https bookie.
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


@dataclass(frozen=True)
class AdminHttpAccess:
    """Credentials for admin HTTP calls: a bearer token and the CA of https bookies (both optional)."""

    token: str = ""
    ca_file: str = ""
    timeout_s: float = 30.0
    #: built once from ``ca_file`` (``from_files``); None: the system's CAs
    ssl_context: ssl.SSLContext | None = field(default=None, compare=False, repr=False)

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
        context = None
        if ca_file:
            try:
                context = ssl.create_default_context(cafile=ca_file)
            except (OSError, ssl.SSLError) as e:
                raise AdminHttpCallError(f"cannot load CA certificates from {ca_file}: {e}; give a PEM file "
                                         "with the certificate of the CA that signed the bookies' https "
                                         "certificates") from None
        return cls(token=token, ca_file=ca_file or "", timeout_s=timeout_s, ssl_context=context)

    def call(self, base_url: str, path: str, method: str = "GET", body: Any = None) -> Any:
        """``method base_url+path`` with ``body`` as JSON; the answer parsed as JSON (else text)."""
        data = json.dumps(body).encode() if body is not None else (b"" if method != "GET" else None)
        req = urllib.request.Request(base_url.rstrip("/") + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if body is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        what = f"{method} {base_url.rstrip('/')}{path}"
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=self.ssl_context) as resp:
                raw = resp.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as e:
            with e:
                detail = _error_text(e.read(4096))
            raise AdminHttpCallError(f"{what}: HTTP {e.code}: {detail}{_hint(e.code, self.token)}") from None
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
