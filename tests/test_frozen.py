"""``vellum.frozen.builder``: the positional constructor of a frozen, slotted dataclass makes
exactly what the class's own ``__init__`` makes, and refuses classes it would be wrong for."""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass, field

import pytest

from vellum.format.entry import Entry
from vellum.frozen import builder
from vellum.proto import messages as m


@dataclass(frozen=True, slots=True)
class Point:
    x: int
    y: int = 0
    tag: str = field(default="p", repr=False)


def test_what_it_builds_is_the_class_itself() -> None:
    p = builder(Point)(1, 2, "q")
    assert type(p) is Point and isinstance(p, Point)
    assert p == Point(1, 2, "q") and hash(p) == hash(Point(1, 2, "q")) and repr(p) == repr(Point(1, 2, "q"))
    assert pickle.loads(pickle.dumps(p)) == p
    assert dataclasses.replace(p, y=5) == Point(1, 5, "q")


def test_what_it_builds_stays_frozen() -> None:
    p = builder(Point)(1, 2, "q")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 3  # type: ignore[misc]


def test_every_field_is_set_in_field_order_and_none_is_defaulted() -> None:
    new = builder(Point)
    p = new(7, 8, "z")
    assert (p.x, p.y, p.tag) == (7, 8, "z")
    with pytest.raises(TypeError):
        new(7, 8)  # the builder takes no defaults: a caller passes every field


@pytest.mark.parametrize("cls, values", [
    (Entry, (1, 2, 3, 4, b"payload")),
    (m.ReadRequest, (1, 2, 8, b"k" * 20)),
    (m.ReadResponse, (0, 1, 2, b"entry")),
    (m.ReadLacRequest, (9, 1)),
    (m.ReadLacResponse, (9, 0, 1, b"lac", b"last")),
    (m.StridedReadRequest, (9, 1, 0, 2, 10, 0)),
    (m.StridedReadResponse, (9, 0, 1, 0, (b"a", b"b"))),
])
def test_the_hot_records_built_are_their_class_built_by_its_own_init(cls: type, values: tuple[object, ...]) -> None:
    built = builder(cls)(*values)
    own = cls(*values)
    assert type(built) is cls and built == own and repr(built) == repr(own)
    assert [getattr(built, f.name) for f in dataclasses.fields(cls)] == list(values)


def test_the_messages_module_builders_build_their_messages() -> None:
    assert m.new_read_request(1, 2, 0, None) == m.ReadRequest(1, 2)
    assert m.new_read_response(0, 1, 2, b"e") == m.ReadResponse(0, 1, 2, b"e")
    assert m.new_read_lac_response(3, 0, 4, b"", b"") == m.ReadLacResponse(3, 0, 4)
    assert m.new_strided_read_request(1, 2, 3, 4, 5, 6) == m.StridedReadRequest(1, 2, 3, 4, 5, 6)
    assert m.new_strided_read_response(1, 0, 2, 3, ()) == m.StridedReadResponse(1, 0, 2, 3)


@dataclass(frozen=True)
class NoSlots:
    x: int


@dataclass(slots=True)
class NotFrozen:
    x: int


@dataclass(frozen=True, slots=True)
class NotInit:
    x: int
    y: int = field(default=0, init=False)


class Plain:
    __slots__ = ("x",)


@pytest.mark.parametrize("cls", [NoSlots, NotFrozen, NotInit, Plain])
def test_classes_the_trick_would_be_wrong_for_are_refused(cls: type) -> None:
    with pytest.raises(TypeError, match=cls.__name__):
        builder(cls)
