"""Deterministic simulation of the protocol running Vellum's own client, codec and request path.

One process, one thread, virtual time: ``loop.SimLoop`` is an asyncio event loop whose clock
jumps to the next timer; ``network.SimNetwork`` carries the frames between the real client's
connections and the real server request path (``server.bookie_server.BookieConnection``: session,
processors, reply writer); ``bookie.SimBookie`` is an in-memory bookie below the processors
(journal group commit on virtual time, unsynced records lost at a crash); ``metadata`` is an
in-memory metadata driver; ``workload`` runs the clients (writer, tailing reader, recovery,
delete); ``checker`` judges each run's history; ``runner`` ties one seed together. Every
source of nondeterminism is drawn from the seed (see docs/verification.md).
"""
