"""Every wire message's ``__init__`` (proto/messages.py's quick one): the dataclass's signature,
defaults and frozen fields, each argument stored in its own field."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from vellum.proto.messages import MESSAGE_TYPES, ReadRequest


@pytest.mark.parametrize("cls", MESSAGE_TYPES, ids=lambda c: c.__name__)
def test_a_message_stores_each_argument_in_its_field(cls: type) -> None:
    fields = dataclasses.fields(cls)
    params = list(inspect.signature(cls).parameters.values())
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields):
        assert p.default is (inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default)
    values = [object() for _ in fields]
    positional = cls(*values)
    by_name = cls(**{f.name: v for f, v in zip(fields, values)})
    for f, v in zip(fields, values):
        assert getattr(positional, f.name) is v
        assert getattr(by_name, f.name) is v
    assert positional == by_name
    required = [object() for f in fields if f.default is dataclasses.MISSING]
    defaults_only = cls(*required)
    for f in fields:
        if f.default is not dataclasses.MISSING:
            assert getattr(defaults_only, f.name) is f.default
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(positional, fields[0].name, 1)
    with pytest.raises(TypeError):
        cls(*values, object())  # one argument too many, as a dataclass refuses it


def test_a_message_built_by_its_quick_init_equals_and_hashes_as_before() -> None:
    assert ReadRequest(1, 2) == ReadRequest(1, 2, 0, None)
    assert hash(ReadRequest(1, 2)) == hash(ReadRequest(ledger_id=1, entry_id=2))
    assert dataclasses.replace(ReadRequest(1, 2), flags=4) == ReadRequest(1, 2, 4)
    assert ReadRequest.__init__.__qualname__ == "ReadRequest.__init__"
