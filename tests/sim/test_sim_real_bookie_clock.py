"""The ``clock`` fault's wall-clock steps reach the real bookie (docs/verification.md, "Disk and
clock faults"): its ``BookieRuntime.wall`` is the store's stepped clock, so GC's compaction
times (and a new journal's name) follow a step as they would on a host whose clock NTP stepped."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

from vellum.sim.real_bookie import RealSimBookie, remove_scratch
from vellum.sim.runner import SimOptions, World

T = TypeVar("T")


class _StepForward(random.Random):
    """The nemesis' draws for a wall-clock step (not a suspension) an hour forward."""

    def random(self) -> float:
        return 0.0

    def choice(self, seq: Sequence[T]) -> T:
        return seq[-1]

    def uniform(self, a: float, b: float) -> float:
        return b


def test_a_wall_clock_step_reaches_the_real_bookies_gc() -> None:
    world = World(0, SimOptions(bookie="real", faults=frozenset({"clock"})))
    try:
        bookie = world.nodes[0].bookie
        assert isinstance(bookie, RealSimBookie)
        gc = bookie.bookie.gc_threads[0]
        assert gc.run_once().kind != "major"  # started a moment ago: no compaction due
        world._clock_jump(_StepForward())  # the wall clock an hour forward, the loop's clock not
        assert world.wall_offset == 3600.0
        # the bookie's wall clock is the stepped one: the major compaction's interval has passed
        assert gc.run_once().kind == "major"
    finally:
        for node in world.nodes:
            node.dispose()
        world.loop.close()
        if world.scratch is not None:
            remove_scratch(world.scratch)
