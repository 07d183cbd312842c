"""Security building blocks (layer L2): certificates, TLS contexts and signed tokens.

Modules, each usable alone; none knows about configuration, the wire protocol or the
bookie (the layers above translate their settings into plain arguments):

* ``pki``: a small certificate authority (``cryptography``): create a CA, issue certificates
  for the roles ``bookie``, ``client`` and ``admin``, write them as PEM files (keys mode 0600),
  read a certificate's principal (CN) and roles back (``principal_of``, ``roles_of``).
* ``tls``: ``ssl.SSLContext`` for a bookie (server) or a client from BookKeeper-named PEM
  settings (``TlsSettings``), a ``ReloadingContext`` that rebuilds the context when the files
  change (certificate rotation without a restart), and ``peer_principal`` for a connection.
* ``tokens``: signed, expiring JWTs (pyjwt; HS256 secret file, or RS256 / ES256 key pair)
  carrying a principal (``sub``), roles, the door they open (``aud``: the bookie port or the
  admin HTTP API) and a bounded lifetime.
* ``auth``: the authentication providers of the bookie port (``tls``: the mutual-TLS
  certificate; ``token``) and ``authorizedRoles``: who a connection is and whether it may be
  served (``BookieAuthenticator``), and what a client sends (``ClientAuth``).
* ``redaction``: which values are secrets (passwords, master keys) and hiding them, for every
  view of the cluster (admin HTTP answers, the console's pages).
* ``admin_http_client``: calling a bookie's admin HTTP API from a tool, and the one rule of
  when an admin token may travel (``token_refusal``).

Roles travel in a certificate the way BookKeeper's ``CertUtils`` reads them: in the subject's
OU, as ``0:<role>[,<role>...]`` (code ``0`` = role names; other ``<code>:<value>`` parts,
separated by ``;``, are ignored). A BookKeeper ``authorizedRoles`` check reads the same field.

Imports: the standard library, ``cryptography``, ``jwt`` and ``vellum.errors`` only (an
import-linter contract holds it). Errors are :class:`vellum.errors.SecurityError` with a
message that says what is wrong and which file or setting to fix.
"""
