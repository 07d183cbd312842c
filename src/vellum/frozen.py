"""``builder``: a fast positional constructor for a frozen, slotted dataclass.

Responsibility: make the records built once per entry or per message on the hot paths (a read's
messages on both sides, a verified ``Entry``, a read's ``LedgerEntry``) at about half the cost
of their own ``__init__``, with nothing else changed.

Why: a frozen dataclass's generated ``__init__`` cannot store into its own slots (its
``__setattr__`` refuses), so it stores each field by name through ``object.__setattr__``: a
lookup and a call per field. ``builder(cls)`` returns a class with ``cls``'s slots (the same
layout) and no frozen ``__setattr__``, whose ``__init__`` takes every field positionally, in
field order, stores each as a plain slot store, and then gives the object its class, ``cls``
(``__class__`` assignment, which CPython allows between classes of one layout). What comes out
is a ``cls`` like any other: its type, equality, hash and repr are ``cls``'s, and it is frozen.

Invariants (``tests/test_frozen.py``): ``builder(cls)(*values) == cls(*values)`` with the same
field values, for every field; only frozen dataclasses with ``slots=True`` are accepted (for
any other class the trick would be wrong or pointless), and every field must be an ``init``
field; the builder takes no defaults: a caller passes every field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def builder(cls: type[T]) -> Callable[..., T]:
    """A constructor of ``cls`` taking every field positionally (see the module docstring)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in vars(cls):
        raise TypeError(f"builder({cls.__name__}): only a frozen dataclass with slots=True")
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if any(not f.init for f in fields):
        raise TypeError(f"builder({cls.__name__}): every field must be an init field")
    names = [f.name for f in fields]  # identifiers (a class's attribute names): safe in source
    # the __init__ written out, as dataclasses writes its own (source made from field names only)
    body = "".join(f"    self.{n} = {n}\n" for n in names)
    source = f"def __init__(self, {', '.join(names)}):\n{body}    self.__class__ = cls\n"
    namespace: dict[str, Any] = {"cls": cls}
    exec(source, namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"builder({cls.__name__}).__init__"
    twin = type(f"_Built{cls.__name__}", (), {"__slots__": tuple(cls.__slots__), "__init__": init,  # type: ignore[attr-defined]
                                             "__module__": cls.__module__})
    return twin  # type: ignore[return-value]  # its instances become ``cls``
