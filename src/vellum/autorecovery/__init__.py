"""AutoRecovery: the auditor that finds under-replicated ledgers and the replication workers
that heal them (BookKeeper's ``replication`` package, docs/autorecovery.md).

- ``fragments``: which entries of a ledger a bookie holds (pure);
- ``copier``: checking a fragment on a bookie and copying it to another (async, the client);
- ``worker``: one replication worker (lock a ledger, replace its bad fragments, CAS the metadata);
- ``auditor``: the elected auditor (lost bookies, periodic checks, marking);
- ``daemon``: auditor candidacy + worker in a thread of their own, in a bookie or alone.

Layer: above the client (it reads and writes entries through it) and the metadata store;
below the admin use-cases, the service and the CLI.
"""
