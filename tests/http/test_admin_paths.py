"""BookKeeper's REST paths on real bookie processes: the JSON each answers, who may call the
ones that change something or hand out entries, and what an operator sees when a bookie is
down, read-only, or called with plain http on its https port.

Clusters: an open one (no credentials) for the shapes; a secured one (admin tokens, https with
an encrypted key and its password in the config) for the security rules; a third where a
bookie is killed, for ``cluster_info``.
"""

from __future__ import annotations

import json
import re
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vellum.client.blocking import BookKeeper
from vellum.security import tokens
from vellum.security.pki import CertificateFiles, create_ca, issue_certificate, write_ca, write_certificate
from vellum.security.tokens import ADMIN_AUDIENCE, TokenSigner
from vellum.testing.local_cluster import LocalCluster

PAYLOADS = [f"entry-{i}".encode() for i in range(5)] + [b"caf\xc3\xa9"]


def call(url: str, method: str = "GET", token: str | None = None, body: Any = None,
         context: ssl.SSLContext | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else (b"" if method != "GET" else None)
    req = urllib.request.Request(url, data=data, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=60, context=context) as resp:
            raw, status = resp.read(), resp.status
    except urllib.error.HTTPError as e:
        with e:
            raw, status = e.read(), e.code
    try:
        return status, json.loads(raw or b"null")
    except ValueError:
        return status, raw.decode(errors="replace")


def write_ledger(cluster: LocalCluster, payloads: list[bytes], password: bytes = b"secret pw") -> int:
    with BookKeeper(cluster.metadata_uri) as bk:
        lh = bk.create_ledger(ensemble_size=2, write_quorum_size=2, ack_quorum_size=2, password=password)
        for p in payloads:
            lh.append(p)
        lh.close()
        return int(lh.ledger_id)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("open"), bookies=2) as c:
        yield c


def get(cluster: LocalCluster, path: str, method: str = "GET") -> tuple[int, Any]:
    return call(cluster.http_url(0) + path, method)


# ------------------------------------------------------------------------ shapes (open)


def test_ledger_list_read_and_delete(cluster: LocalCluster) -> None:
    lid = write_ledger(cluster, PAYLOADS)
    status, listed = get(cluster, "/api/v1/ledger/list")
    assert status == 200 and listed[str(lid)] is None
    status, with_md = get(cluster, "/api/v1/ledger/list?print_metadata=true")
    md = with_md[str(lid)]
    assert md["password"] == "(redacted)" and "secret pw" not in json.dumps(with_md)
    assert md["state"] == "CLOSED" and md["lastEntryId"] == len(PAYLOADS) - 1, md
    assert str(lid) in get(cluster, "/api/v1/ledger/list?print_metadata=true&page=1")[1]
    assert get(cluster, "/api/v1/ledger/list?print_metadata=true&page=2") == (200, {})  # 100 a page

    status, entries = get(cluster, f"/api/v1/ledger/read?ledger_id={lid}")
    assert status == 200
    assert entries == {**{str(i): f"entry-{i}" for i in range(5)}, "5": "caf\ufffd\ufffd"}  # as US-ASCII
    assert get(cluster, f"/api/v1/ledger/read?ledger_id={lid}&start_entry_id=1&end_entry_id=2") == \
        (200, {"1": "entry-1", "2": "entry-2"})
    assert get(cluster, f"/api/v1/ledger/read?ledger_id={lid}&end_entry_id=99")[1].keys() == entries.keys()
    status, paged = get(cluster, f"/api/v1/ledger/read?ledger_id={lid}&page=1")
    assert paged == {"Entries for page: ": "1", **entries}
    status, body = get(cluster, f"/api/v1/ledger/read?ledger_id={lid}&start_entry_id=3&end_entry_id=1")
    assert status == 400 and "start_entry_id=3 is after end_entry_id=1" in body["error"]
    assert get(cluster, "/api/v1/ledger/read")[0] == 400
    assert get(cluster, "/api/v1/ledger/read?ledger_id=987654321")[0] == 404

    assert get(cluster, f"/api/v1/ledger/delete?ledger_id={lid}", "DELETE") == (200, f"Deleted ledger: {lid}")
    assert get(cluster, f"/api/v1/ledger/metadata?ledger_id={lid}")[0] == 404
    assert str(lid) not in get(cluster, "/api/v1/ledger/list")[1]
    status, body = get(cluster, f"/api/v1/ledger/delete?ledger_id={lid}", "DELETE")
    assert status == 404 and f"ledger {lid} does not exist" in body["error"]
    assert get(cluster, f"/api/v1/ledger/delete?ledger_id={lid}")[0] == 405  # DELETE only


def test_a_read_is_one_page_at_most(cluster: LocalCluster) -> None:
    lid = write_ledger(cluster, [b"x"] * 1001)
    status, body = get(cluster, f"/api/v1/ledger/read?ledger_id={lid}")
    assert status == 400 and "more than 1000 entries" in body["error"] and "page=1" in body["error"]
    status, page2 = get(cluster, f"/api/v1/ledger/read?ledger_id={lid}&page=2")
    assert status == 200 and page2 == {"Entries for page: ": "2", "1000": "x"}


def test_list_bookie_info(cluster: LocalCluster) -> None:
    status, info = get(cluster, "/api/v1/bookie/list_bookie_info")
    assert status == 200 and set(info) == {*cluster.bookie_ids, "ClusterInfo: "}, info
    shape = r"\{Free: (\d+)(?:\(\d+(?:\.\d{1,3})?[KMGT]B\))?, Total: (\d+)(?:\(\d+(?:\.\d{1,3})?[KMGT]B\))?\}"
    frees, totals = [], []
    for b in cluster.bookie_ids:
        m = re.fullmatch(": " + shape + ",", info[b])
        assert m, info[b]
        frees.append(int(m.group(1)))
        totals.append(int(m.group(2)))
        assert 0 < frees[-1] <= totals[-1]
    m = re.fullmatch(shape, info["ClusterInfo: "])
    assert m and int(m.group(2)) == sum(totals), info


def test_server_config_and_the_paths_a_running_bookie_answers_with_how_to(cluster: LocalCluster) -> None:
    status, conf = get(cluster, "/api/v1/config/server_config")
    assert status == 200 and conf["httpServerPort"] == int(cluster.http_url(0).rsplit(":", 1)[1])
    assert conf["journalMaxGroupWaitMSec"] == 1 and isinstance(conf["ledgerDirectories"], list)
    assert conf["httpServerKeyStorePassword"] == "(redacted)"
    status, body = call(cluster.http_url(0) + "/api/v1/config/server_config", "PUT", body={"flushInterval": 5})
    assert status == 501 and "flushInterval" in body["error"] and "restart" in body["error"]
    status, body = get(cluster, "/api/v1/bookie/expand_storage", "PUT")
    assert status == 501 and "allowStorageExpansion=true" in body["error"]
    status, state = get(cluster, "/api/v1/bookie/entry_location_compact")
    assert status == 200 and list(state.values()) == [False] and next(iter(state)).endswith("current/locations")
    assert get(cluster, "/api/v1/bookie/entry_location_compact", "PUT")[0] == 501


def test_sanity_passes_on_a_healthy_bookie_and_fails_clearly_on_a_read_only_one(cluster: LocalCluster) -> None:
    before = set(get(cluster, "/api/v1/ledger/list")[1])
    assert get(cluster, "/api/v1/bookie/sanity") == (200, {"passed": True, "readOnly": False})
    assert set(get(cluster, "/api/v1/ledger/list")[1]) == before, "the sanity ledger is deleted"
    assert "sanity check of bookie" in cluster.log_text(0)
    status, _ = call(cluster.http_url(1) + "/api/v1/bookie/state/readonly", "PUT", body={"readOnly": True})
    assert status == 200
    try:
        status, body = call(cluster.http_url(1) + "/api/v1/bookie/sanity")
        assert status == 200 and body["passed"] is False and body["readOnly"] is True, body
        assert f"bookie {cluster.bookie_ids[1]} is read-only" in body["error"]
    finally:
        call(cluster.http_url(1) + "/api/v1/bookie/state/readonly", "PUT", body={"readOnly": False})


def test_cluster_info_counts_a_killed_bookie_as_unavailable(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", bookies=3, bookie_conf={"zkTimeout": "2000"}) as c:
        status, info = call(c.http_url(0) + "/api/v1/bookie/cluster_info")
        assert status == 200 and (info["totalBookiesCount"], info["writableBookiesCount"],
                                  info["unavailableBookiesCount"]) == (3, 3, 0), info
        call(c.http_url(1) + "/api/v1/bookie/state/readonly", "PUT", body={"readOnly": True})
        c.kill(2)
        c.wait_until(lambda: not ({c.bookie_ids[2]} & (c.registered()[0] | c.registered()[1])), timeout_s=60,
                     what="the killed bookie's registration to lapse")
        c.wait_until(lambda: c.bookie_ids[1] in c.registered()[1], what="bookie 1 registered read-only")
        info = call(c.http_url(0) + "/api/v1/bookie/cluster_info")[1]
        assert {k: v for k, v in info.items() if k.endswith("Count")} == {
            "totalBookiesCount": 3, "writableBookiesCount": 1, "readonlyBookiesCount": 1,
            "unavailableBookiesCount": 1}, info
        assert set(info) >= {"auditorElected", "auditorId", "clusterUnderReplicated", "ledgerReplicationEnabled"}


# ------------------------------------------------------------------------- security


class Secured:
    def __init__(self, cluster: LocalCluster, ca: Path, secret: Path, password: str) -> None:
        self.cluster = cluster
        self.context = ssl.create_default_context(cafile=str(ca))
        self.context.check_hostname = False
        signer = TokenSigner.from_secret_file(secret)
        self.admin_token = signer.issue("ops", ["admin"], audience=ADMIN_AUDIENCE)
        self.client_token = signer.issue("app", ["client"], audience=ADMIN_AUDIENCE)
        self.password = password

    def url(self, path: str) -> str:
        return self.cluster.http_url(0).replace("http:", "https:") + path

    def call(self, path: str, method: str = "GET", token: str | None = None) -> tuple[int, Any]:
        return call(self.url(path), method, token, context=self.context)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    base = tmp_path_factory.mktemp("pki")
    ca = create_ca("Test admin CA")
    ca_files = write_ca(ca, base / "ca")
    password = "an https key password"
    https: CertificateFiles = write_certificate(issue_certificate(ca, name="bookie-http", role="bookie"),
                                                base / "http", key_password=password.encode())
    secret = tokens.write_secret_file(tmp_path_factory.mktemp("tokens") / "secret")
    conf = {"tokenSecretKeyFile": str(secret), "httpServerTlsEnable": "true",
            "httpServerKeyStorePath": str(https.key), "httpServerCertificatePath": str(https.cert),
            "httpServerKeyStorePassword": password}
    with LocalCluster(tmp_path_factory.mktemp("secured"), bookies=2, bookie_conf=conf) as c:
        yield Secured(c, ca_files.cert, secret, password)


def test_changes_and_entry_reads_need_the_admin_role(secured: Secured) -> None:
    lid = write_ledger(secured.cluster, [b"private"])
    for path, method in ((f"/api/v1/ledger/delete?ledger_id={lid}", "DELETE"),
                         (f"/api/v1/ledger/read?ledger_id={lid}", "GET"),
                         ("/api/v1/bookie/sanity", "GET"),
                         ("/api/v1/config/server_config", "PUT"),
                         ("/api/v1/bookie/expand_storage", "PUT")):
        status, body = secured.call(path, method)
        assert status == 401 and "with the admin role" in body["error"], (path, body)
        status, body = secured.call(path, method, secured.client_token)
        assert status == 403 and "lacks the admin role" in body["error"], (path, body)
    assert secured.call(f"/api/v1/ledger/read?ledger_id={lid}", token=secured.admin_token) == (200, {"0": "private"})
    assert secured.call("/api/v1/bookie/sanity", token=secured.admin_token) == (200, {"passed": True,
                                                                                       "readOnly": False})
    assert secured.call(f"/api/v1/ledger/delete?ledger_id={lid}", "DELETE", secured.admin_token) == \
        (200, f"Deleted ledger: {lid}")
    # the reads that show no entries stay open, as the others (httpServerTokenRequiredForReads=false)
    assert secured.call("/api/v1/ledger/list")[0] == 200
    assert secured.call("/api/v1/bookie/list_bookie_info")[0] == 200


def test_server_config_never_shows_the_https_key_password(secured: Secured) -> None:
    status, conf = secured.call("/api/v1/config/server_config")
    assert status == 200 and conf["httpServerKeyStorePassword"] == "(redacted)"
    assert conf["httpServerTlsEnable"] is True
    assert secured.password not in json.dumps(conf)


def test_plain_http_to_the_https_port_gets_a_clear_answer(secured: Secured) -> None:
    status, body = call(secured.cluster.http_url(0) + "/api/v1/bookie/state")
    assert status == 400 and "this port speaks https" in body, body
    assert "https://" in body
    assert secured.call("/api/v1/bookie/state")[0] == 200  # https still served
    assert "plain http from 127.0.0.1" in secured.cluster.log_text(0)


def test_readable_sizes_are_bookkeepers() -> None:
    from vellum.admin.bookie_admin import readable_bytes

    assert [readable_bytes(v) for v in (0, 999, 1000, 1500, 1_234_567, 2_000_000_000, 5 * 10**15)] == \
        ["", "", "(1KB)", "(1.5KB)", "(1.234MB)", "(2GB)", "(5000TB)"]
