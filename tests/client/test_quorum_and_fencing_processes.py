"""Two promises of the write path held on real bookie processes (``LocalCluster``), where a
slow bookie is a stopped process, not a stopped server:

- an add completes only once ``AQ`` bookies of its write set answered: with E=3, WQ=3, AQ=2 and
  two bookies frozen (SIGSTOP: their journal fsync cannot finish, so they cannot answer), the
  one answering bookie is not enough; the add completes, and the LAC moves, when they resume;
- recovery reads fence: a recovering client whose fencing LAC read to one bookie is lost
  (fencing completes on the other two at ensemble coverage) still fences that bookie with its
  recovery reads, so the old writer's next ADD there is refused as fenced.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vellum.aio import BookKeeper
from vellum.config import ClientConfig
from vellum.errors import EFENCED, EOK, BookieHandleNotAvailableError
from vellum.format.entry import DigestManager, DigestType, master_key
from vellum.proto import messages as m
from vellum.testing.local_cluster import LocalCluster
from vellum.testing.wire import RawConnection

PASSWORD = b"pw"


def _config(**changes: Any) -> ClientConfig:
    return dataclasses.replace(ClientConfig(), **changes)


async def _wait_for(pred: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, f"{what} not seen within {timeout_s}s"
        await asyncio.sleep(0.02)


def test_add_waits_for_the_ack_quorum_while_two_bookies_hold_their_fsync(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", bookies=3) as cluster:
        index_of = {b: i for i, b in enumerate(cluster.bookie_ids)}

        async def main() -> None:
            # A long add timeout: the frozen bookies must look slow, not failed.
            async with BookKeeper(cluster.metadata_uri, config=_config(add_entry_timeout_s=60.0)) as bk:
                lh = await bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2,
                                            password=PASSWORD)
                for i in range(5):
                    await lh.append(b"before-%d" % i)
                assert lh.last_add_confirmed == 4
                ensemble = [str(b) for b in lh.metadata.last_ensemble]
                running, frozen = ensemble[0], ensemble[1:]

                # Watch the bookies' answers to the writer's ADDs (the client's own callback path).
                bc = bk.context.bookie_client
                answers: list[tuple[str, int, BaseException | None]] = []
                real_add_cb = bc.add_quorum_cb

                def add_cb(ensemble: Any, indexes: Any, key: bytes, entry: Any, recovery: bool, callback: Any,
                           token: Any, timeout_s: float) -> None:
                    entry_id = int.from_bytes(bytes(entry[8:16]), "big")

                    def seen(token: Any, idx: int, bookie_id: str, exc: BaseException | None) -> None:
                        answers.append((bookie_id, entry_id, exc))
                        callback(token, idx, bookie_id, exc)

                    real_add_cb(ensemble, indexes, key, entry, recovery, seen, token, timeout_s)

                bc.add_quorum_cb = add_cb  # type: ignore[method-assign]
                for b in frozen:
                    cluster.pause(index_of[b])
                try:
                    fut = lh.append_async(b"held")
                    await _wait_for(lambda: (running, 5, None) in answers, "the running bookie's answer")
                    await asyncio.sleep(0.5)  # room for a wrong early completion to show
                    assert not fut.done(), "the add completed with one answer, below the ack quorum of 2"
                    assert lh.last_add_confirmed == 4, "the LAC moved past an entry without its ack quorum"
                    assert [a for a in answers if a[1] == 5] == [(running, 5, None)]
                finally:
                    for b in frozen:
                        cluster.resume(index_of[b])
                assert await asyncio.wait_for(fut, 30) == 5
                assert lh.last_add_confirmed == 5
                await _wait_for(lambda: {a[0] for a in answers if a[1] == 5 and a[2] is None} == set(ensemble),
                                "every bookie's answer once resumed")
                assert [e.payload for e in await lh.read(4, 5)] == [b"before-4", b"held"]
                await lh.close()

        asyncio.run(asyncio.wait_for(main(), 120))


def test_recovery_reads_fence_a_bookie_the_fencing_step_missed(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", bookies=3) as cluster:

        async def main() -> None:
            async with BookKeeper(cluster.metadata_uri) as writer_bk, BookKeeper(cluster.metadata_uri) as rec_bk:
                lh = await writer_bk.create_ledger(ensemble_size=3, write_quorum_size=3, ack_quorum_size=2,
                                                   password=PASSWORD)
                for i in range(10):
                    await lh.append(b"e%d" % i)
                ledger_id = lh.ledger_id
                target = str(lh.metadata.last_ensemble[2])

                # The recovering client's fencing LAC read to ``target`` is lost; every other
                # read to it is sent and its outcome kept (so the test can wait for it).
                bc = rec_bk.context.bookie_client
                real_read = bc.read
                dropped_fences: list[int] = []
                reads_to_target: list[tuple[int, bool, asyncio.Future[Any]]] = []

                async def read(bookie_id: str, lid: int, entry_id: int, *, fence_master_key: bytes | None = None,
                               timeout_s: float = 5.0) -> Any:
                    if bookie_id == target and lid == ledger_id and entry_id == -1 and fence_master_key:
                        dropped_fences.append(entry_id)
                        raise BookieHandleNotAvailableError(f"{bookie_id}: fence dropped by the test")
                    t = asyncio.ensure_future(real_read(bookie_id, lid, entry_id, fence_master_key=fence_master_key,
                                                        timeout_s=timeout_s))
                    if bookie_id == target and lid == ledger_id:
                        reads_to_target.append((entry_id, fence_master_key is not None, t))
                    return await asyncio.shield(t)

                bc.read = read  # type: ignore[method-assign,assignment]
                rh = await rec_bk.open_ledger(ledger_id, password=PASSWORD, recovery=True)
                assert rh.metadata.is_closed and rh.metadata.last_entry_id == 9
                assert dropped_fences == [-1], "the fencing read to the target was not the one dropped"
                assert reads_to_target, "recovery sent no read to the bookie the fence missed"
                # Every recovery read the target was sent has been answered (a bookie answers a
                # fencing read only once its fence is durable).
                await asyncio.gather(*(t for _e, _f, t in reads_to_target), return_exceptions=True)

            # The old writer's next ADD on the bookie only the recovery reads could have fenced.
            entry = DigestManager(ledger_id, DigestType.CRC32C, PASSWORD).compute(10, 9, 2, b"xx")
            with RawConnection(target) as conn:
                conn.send(m.AddRequest(master_key(PASSWORD), entry))
                answer = conn.recv()
            assert isinstance(answer, m.AddResponse)
            assert answer.status != EOK, "the old writer's ADD was accepted after recovery: never fenced there"
            assert answer.status == EFENCED, answer

        asyncio.run(asyncio.wait_for(main(), 120))

