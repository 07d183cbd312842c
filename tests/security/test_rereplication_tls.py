"""Re-replication on a secured cluster: four bookies with mutual TLS, authentication by
certificate and ``authorizedRoles=client,bookie``, AutoRecovery in the bookies. A bookie is
lost with its disks; the replication workers copy its fragments to the others over TLS with the
bookies' own certificates (role ``bookie``), and every entry reads back from its new write set.
Authentication is on, so each bookie checks the master key of a ledger it has not seen against
the ledger's metadata (``ledgerMasterKeyCheck=auto``): the re-replicated fragments land on
bookies that never held the ledger, with the key the ledger's password gives.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

from security_testkit import make_pki

from vellum.autorecovery.fragments import bookies_of
from vellum.client.bookkeeper import BookKeeper
from vellum.config import TLS_CONTEXT_FACTORY, ClientConfig
from vellum.meta import open_metadata_store
from vellum.security import tokens
from vellum.testing.local_cluster import LocalCluster


def test_lost_fragments_are_copied_over_tls_with_the_bookie_certificate(tmp_path: Path) -> None:
    p = make_pki(tmp_path / "pki")
    conf = {
        "tlsProviderFactoryClass": TLS_CONTEXT_FACTORY, "tlsKeyStore": str(p.bookie.key),
        "tlsCertificatePath": str(p.bookie.cert), "tlsTrustStore": str(p.ca.cert),
        "tlsClientAuthentication": "true", "bookieAuthProviderFactoryClass": "tls",
        "authorizedRoles": "client,bookie",
        # the admin HTTP API needs a way to authenticate admins (tokens) when the bookie port needs one
        "tokenSecretKeyFile": str(tokens.write_secret_file(tmp_path / "token-secret")),
        "autoRecoveryDaemonEnabled": "true", "lostBookieRecoveryDelay": "0", "auditorPeriodicBookieCheckInterval": "1",
        "openLedgerRereplicationGracePeriod": "1000", "rwRereplicateBackoffMs": "500",
    }
    client = ClientConfig(tls_provider_factory_class=TLS_CONTEXT_FACTORY, tls_trust_store=str(p.ca.cert),
                          tls_certificate_path=str(p.client.cert), tls_key_store=str(p.client.key))
    with LocalCluster(tmp_path / "c", bookies=4, bookie_conf=conf) as cluster:
        uri = cluster.metadata_uri

        async def write() -> list[int]:
            async with BookKeeper(uri, config=client) as bk:
                ids = []
                for _ in range(12):
                    lh = await bk.create_ledger(ensemble_size=3, write_quorum_size=2, ack_quorum_size=2)
                    await asyncio.gather(*(lh.append_async(b"%d:%d" % (lh.ledger_id, e)) for e in range(20)))
                    await lh.close()
                    ids.append(lh.ledger_id)
                return ids

        ids = asyncio.run(write())
        victim_index = 1
        victim = cluster.bookie_ids[victim_index]

        def on_victim() -> set[int]:
            with open_metadata_store(uri) as store:
                return {lid for lid in ids if victim in bookies_of(store.ledgers.read_ledger(lid).value)}

        assert on_victim()
        cluster.kill(victim_index)
        shutil.rmtree(cluster.ledger_dir(victim_index))
        shutil.rmtree(cluster.journal_dir(victim_index))
        deadline = time.monotonic() + 150
        while on_victim():
            if time.monotonic() > deadline:
                logs = "\n".join(cluster.log_text(i)[-2000:] for i in range(4) if i != victim_index)
                raise AssertionError(f"ledgers still on {victim}: {sorted(on_victim())}\n{logs}")
            time.sleep(0.5)

        async def read_back() -> None:
            async with BookKeeper(uri, config=client) as bk:
                for lid in ids:
                    rh = await bk.open_ledger(lid)
                    assert [e.payload for e in await rh.read(0, 19)] == [b"%d:%d" % (lid, e) for e in range(20)]

        asyncio.run(read_back())
        logs = "".join(cluster.log_text(i) for i in range(4) if i != victim_index)
        assert "authenticated: principal 'bookie-1' (tls, roles ['bookie'])" in logs
