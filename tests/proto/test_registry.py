"""The message registry (``proto.messages.REQUEST_TYPES`` / ``RESPONSE_TYPES``) is the one list
of message types: the codec, the package and the test strategies all follow it."""

from __future__ import annotations

import dataclasses
import inspect
import typing

import pytest
from proto_strategies import STRATEGIES

import vellum.proto
from vellum.proto import codec
from vellum.proto import messages as m


def test_registry_is_the_request_and_response_unions() -> None:
    assert typing.get_args(m.Request) == m.REQUEST_TYPES
    assert typing.get_args(m.Response) == m.RESPONSE_TYPES
    assert m.MESSAGE_TYPES == m.REQUEST_TYPES + m.RESPONSE_TYPES
    assert not set(m.REQUEST_TYPES) & set(m.RESPONSE_TYPES)


def test_every_message_type_names_a_known_opcode_unique_in_its_direction() -> None:
    for types in (m.REQUEST_TYPES, m.RESPONSE_TYPES):
        opcodes = [t.OPCODE for t in types]
        assert len(set(opcodes)) == len(opcodes)
        assert all(op in m.OPCODE_NAMES for op in opcodes)
    assert m.ErrorResponse.OPCODE == m.OP_ERROR and m.ErrorResponse in m.RESPONSE_TYPES
    assert m.LedgerClosedNote in m.REQUEST_TYPES  # fire and forget: no response type
    assert {t.OPCODE for t in m.MESSAGE_TYPES if t.OPCODE < 64} == m.V2_OPCODES


def test_opcode_is_not_a_field() -> None:
    # A class constant: equality, repr and the constructor see only the wire fields.
    assert "OPCODE" not in {f.name for f in dataclasses.fields(m.AddResponse)}
    assert m.AddResponse(0, 1, 2) == m.AddResponse(0, 1, 2)


def test_codec_tables_follow_the_registry() -> None:
    assert set(codec._ENCODERS) == set(m.MESSAGE_TYPES)
    assert set(codec._DECODERS) == set(m.MESSAGE_TYPES)
    assert set(codec._REQUEST_DECODERS) == {t.OPCODE for t in m.REQUEST_TYPES}
    assert set(codec._RESPONSE_DECODERS) == {t.OPCODE for t in m.RESPONSE_TYPES}


def test_each_side_decodes_exactly_its_direction() -> None:
    for t in m.REQUEST_TYPES:
        assert codec._REQUEST_DECODERS[t.OPCODE] is codec._DECODERS[t]
    for t in m.RESPONSE_TYPES:
        assert codec._RESPONSE_DECODERS[t.OPCODE] is codec._DECODERS[t]


def test_strategies_cover_the_registry() -> None:
    assert set(STRATEGIES) == set(m.MESSAGE_TYPES)


def test_the_package_lists_no_message_type() -> None:
    # Message classes are imported from vellum.proto.messages, where the registry is.
    exported = {getattr(vellum.proto, name) for name in vellum.proto.__all__}
    assert not exported & set(m.MESSAGE_TYPES)
    assert vellum.proto.REQUEST_TYPES is m.REQUEST_TYPES


def test_every_request_has_an_answer_refusing_it_in_the_form_its_client_matches() -> None:
    """``refusal_for``: v2 ops answer with their own response type (matched by op, ledger,
    entry), Vellum ops with an ``ErrorResponse`` carrying their request id and opcode, a bad
    frame with its own error response, a LEDGER_CLOSED note with nothing."""
    key = bytes(20)
    entry = (3).to_bytes(8, "big") + (4).to_bytes(8, "big") + bytes(24)
    assert m.refusal_for(m.AddRequest(key, entry), 106) == m.AddResponse(106, 3, 4)
    assert m.refusal_for(m.ReadRequest(3, 4), 106) == m.ReadResponse(106, 3, 4)
    assert m.refusal_for(m.BatchReadRequest(3, 4, 9, 10, 0), 106) == m.BatchReadResponse(106, 3, 4, 9)
    assert m.refusal_for(m.LedgerClosedNote(9, 3), 102) is None
    assert m.refusal_for(m.TrimRequest(9, 3, 5, key), 102) == m.ErrorResponse(102, 9, m.OP_TRIM, 3)
    bad = m.BadFrame("unknown opcode", version=m.PROTOCOL_VERSION, opcode=99, request_id=7)
    assert m.refusal_for(bad, 102) == bad.error_response()


def test_every_message_is_built_from_its_fields_by_position_or_name() -> None:
    # The read messages' __init__s are written out (slot setters, messages.py's docstring):
    # each must take the fields in order, with their defaults, store each where it belongs and
    # leave the message frozen, as the dataclass's generated one does for the others.
    for t in m.MESSAGE_TYPES:
        fields = dataclasses.fields(t)
        params = list(inspect.signature(t).parameters.values())
        assert [p.name for p in params] == [f.name for f in fields], t.__name__
        for p, f in zip(params, fields):
            default = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
            assert p.default == default, (t.__name__, f.name)
        values = {f.name: object() for f in fields}  # each field a value of its own
        by_name, by_position = t(**values), t(*values.values())
        assert by_name == by_position, t.__name__
        assert all(getattr(by_name, name) is value for name, value in values.items()), t.__name__
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(by_name, fields[0].name, 0)


@pytest.mark.parametrize("msg", [
    m.ReadRequest(1, 2), m.ReadRequest(1, 2, m.FLAG_DO_FENCING, bytes(20)), m.ReadResponse(0, 1, 2, bytes(40)),
    m.ReadResponse(2, 1, 2), m.StridedReadRequest(9, 1, 2, 3, 4, 5), m.StridedReadResponse(9, 0, 1, 2, [bytes(40)]),
    m.StridedReadResponse(9, 2, 1, 2), m.ReadLacResponse(9, 0, 1, b"", bytes(40)),
], ids=repr)
def test_a_decoded_read_message_is_its_message_in_every_way(msg: m.Message) -> None:
    # The read frames' decoders make their message through a class of its layout that is not
    # frozen, then give it its class (frame_parts.py's docstring): it must be the message.
    side = "server" if type(msg) in m.REQUEST_TYPES else "client"
    [got] = codec.FrameDecoder(1 << 20, side=side).feed(codec.encode(msg))  # type: ignore[arg-type]
    fields = [f.name for f in dataclasses.fields(got)]  # type: ignore[arg-type]
    made = type(msg)(**{name: getattr(got, name) for name in fields})  # by its own constructor
    assert type(got) is type(msg) and got == msg and got == made and repr(got) == repr(made)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(got, fields[0], 0)
