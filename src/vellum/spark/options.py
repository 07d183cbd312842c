"""Options of the ``vellum`` Spark data source: parsing and validation into frozen, picklable values.

Responsibility: turn Spark's option map (string values, case-insensitive keys) into
:class:`ReadOptions` / :class:`WriteOptions`, rejecting anything wrong with a message that names
the option, so that users get the error at ``load()`` / ``save()`` time (planning), not as an
executor traceback.

Invariants:
- the results hold only plain values (str, int, bool, tuples): they are pickled to planner,
  executor and committer processes, which share no other state;
- exactly one selector is given: ``ledgers`` (ids), ``name``, ``names`` or ``namePattern``;
- offsets are JSON objects with string keys (a ledger id or a name) and int values, the next
  entry id to read; ``-2`` means earliest and ``-1`` latest (Kafka's convention);
- unknown options are errors (with a "did you mean"), except ``bookkeeper.*`` pass-throughs.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from vellum.errors import IncorrectParameterError

EARLIEST = -2
LATEST = -1

#: Column names of the read schema (stable, documented in docs/spark.md).
#: Kafka's source column names where they mean the same (key, value, timestamp, timestampType,
#: headers); ``payload`` is the compatibility alias of ``value``.
COL_KEY = "key"
COL_VALUE = "value"
COL_NAME = "name"
COL_LEDGER = "ledgerId"
COL_ENTRY = "entryId"
COL_BATCH_INDEX = "batchIndex"
COL_TIMESTAMP = "timestamp"
COL_TIMESTAMP_TYPE = "timestampType"
COL_PAYLOAD = "payload"
COL_HEADERS = "headers"
COL_METADATA = "customMetadata"


class OptionError(IncorrectParameterError):
    """A bad option of the vellum data source (the message starts with ``[VELLUM_OPTION]``)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"[VELLUM_OPTION] {message}")


_READ_KEYS = {
    "metadataserviceuri": "metadataServiceUri",
    "ledgers": "ledgers",
    "name": "name",
    "names": "names",
    "namepattern": "namePattern",
    "startingoffsets": "startingOffsets",
    "endingoffsets": "endingOffsets",
    "startingtimestamp": "startingTimestamp",
    "endingtimestamp": "endingTimestamp",
    "startingoffsetsbytimestamp": "startingOffsetsByTimestamp",
    "endingoffsetsbytimestamp": "endingOffsetsByTimestamp",
    "startingoffsetsbytimestampstrategy": "startingOffsetsByTimestampStrategy",
    "maxentriesperpartition": "maxEntriesPerPartition",
    "maxbytesperpartition": "maxBytesPerPartition",
    "minpartitions": "minPartitions",
    "includepayload": "includePayload",
    "includemetadata": "includeMetadata",
    "includeheaders": "includeHeaders",
    "payloadcolumn": "payloadColumn",
    "maxentriespertrigger": "maxEntriesPerTrigger",
    "maxbytespertrigger": "maxBytesPerTrigger",
    "minentriespertrigger": "minEntriesPerTrigger",
    "maxtriggerdelay": "maxTriggerDelay",
    "failondataloss": "failOnDataLoss",
    "datalosslocation": "dataLossLocation",
    "lacpollintervalms": "lacPollIntervalMs",
    "arrowbatchentries": "arrowBatchEntries",
    "password": "password",
    "path": "path",  # Spark passes load(path) as an option: accepted as `name`
    "cursorname": "cursorName",
    "cursorretain": "cursorRetain",
}

_WRITE_KEYS = {
    "metadataserviceuri": "metadataServiceUri",
    "name": "name",
    "path": "path",
    "ensemblesize": "ensembleSize",
    "writequorumsize": "writeQuorumSize",
    "ackquorumsize": "ackQuorumSize",
    "digesttype": "digestType",
    "password": "password",
    "maxinflight": "maxInFlight",
    "entrymaxrows": "entryMaxRows",
    "entrymaxbytes": "entryMaxBytes",
    "segmentmergefactor": "segmentMergeFactor",
    "segmentmergemaxbytes": "segmentMergeMaxBytes",
    "segmentretiredelay": "segmentRetireDelay",
}


#: options Spark itself adds to a source's or sink's map (not the user's to misspell)
_SPARK_KEYS = frozenset({"checkpointlocation", "queryname", "path", "paths"})


def _check_keys(options: Mapping[str, str], known: Mapping[str, str], what: str) -> None:
    for key in options:
        low = key.lower()
        if low in known or low.startswith("bookkeeper.") or low in _SPARK_KEYS:
            continue
        close = difflib.get_close_matches(low, list(known), n=1)
        hint = f"; did you mean {known[close[0]]!r}?" if close else ""
        raise OptionError(f"unknown {what} option {key!r}{hint} (known: {', '.join(sorted(known.values()))})")


def _get(options: Mapping[str, str], key: str) -> str | None:
    low = key.lower()
    for k, v in options.items():
        if k.lower() == low:
            return None if v is None else str(v)
    return None


def _int(options: Mapping[str, str], key: str, default: int | None, *, minimum: int = 1) -> int | None:
    raw = _get(options, key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {key} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise OptionError(f"option {key} must be >= {minimum}, got {value}")
    return value


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    raw = _get(options, key)
    if raw is None or raw == "":
        return default
    low = raw.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise OptionError(f"option {key} must be true or false, got {raw!r}")


def _uri(options: Mapping[str, str]) -> str:
    uri = _get(options, "metadataServiceUri")
    if not uri:
        raise OptionError("option metadataServiceUri is required (e.g. sqlite:///path/metadata.db or zk://host:2181/ledgers)")
    return uri


def _bk_passthrough(options: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k[len("bookkeeper."):], str(v)) for k, v in options.items()
                        if k.lower().startswith("bookkeeper.")))


_DURATION = re.compile(r"^\s*(\d+)\s*(us|ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_DURATION_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(raw: str, option: str) -> int:
    """A duration like Spark's time strings (Kafka's ``maxTriggerDelay``): ``15m``, ``30s``,
    ``500ms``, ``1h``, ``1d``; a bare number is milliseconds."""
    m = _DURATION.match(raw)
    if m is None:
        raise OptionError(f"option {option} must be a duration such as 15m, 30s, 500ms or 1h (a bare number is "
                          f"milliseconds), got {raw!r}")
    return int(int(m.group(1)) * _DURATION_MS[(m.group(2) or "ms").lower()])


def parse_offsets(raw: str | None, option: str, *, default: str, allow_latest: bool = True) -> str | dict[str, int]:
    """``earliest`` / ``latest`` or a JSON object ``{"<ledger id or name>": nextEntryId}``."""
    text = (raw or default).strip()
    if text.lower() in ("earliest", "latest"):
        if text.lower() == "latest" and not allow_latest:
            raise OptionError(f"option {option} cannot be 'latest' here")
        return text.lower()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise OptionError(f"option {option} must be earliest, latest or a JSON object, got {text!r}: {e}") from None
    if not isinstance(value, dict):
        raise OptionError(f"option {option} JSON must be an object {{\"<ledger or name>\": nextEntryId}}, got {text!r}")
    out: dict[str, int] = {}
    for k, v in value.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < EARLIEST:
            raise OptionError(f"option {option}: offset of {k!r} must be an entry id >= 0, -2 (earliest) or "
                              f"-1 (latest), got {v!r}")
        out[str(k)] = v
    return out


@dataclass(frozen=True)
class ReadOptions:
    """Validated read options (batch and streaming)."""

    metadata_uri: str
    ledger_ids: tuple[int, ...] | None
    names: tuple[str, ...] | None
    name_pattern: str | None
    starting: str | tuple[tuple[str, int], ...]
    ending: str | tuple[tuple[str, int], ...]
    max_entries_per_partition: int
    max_bytes_per_partition: int
    min_partitions: int | None
    include_payload: bool
    include_metadata: bool
    max_entries_per_trigger: int | None
    max_bytes_per_trigger: int | None
    #: a micro-batch waits until this many new entries are available across all keys (Kafka's
    #: minOffsetsPerTrigger) ...
    min_entries_per_trigger: int | None
    #: ... unless this long has passed since the last batch (Kafka's maxTriggerDelay, default 15 min)
    max_trigger_delay_ms: int
    fail_on_data_loss: bool
    #: directory where readers append lost ranges as JSON lines (failOnDataLoss=false), or None
    data_loss_location: str | None
    lac_poll_interval_ms: int
    arrow_batch_entries: int
    password: bytes = field(repr=False)  # never in a log line or error message
    client_properties: tuple[tuple[str, str], ...]
    #: add Kafka's ``headers`` column (array<struct<key: string, value: binary>>)
    include_headers: bool = False
    #: keep the ``payload`` column (the same bytes as ``value``) for jobs written before ``value``
    payload_column: bool = True
    #: streams of names: after each committed micro-batch, its end is stored as this position
    #: cursor in every name read (docs/spark.md "Lag and cursors"); None: no cursor
    cursor_name: str | None = None
    #: the cursor is stored with ``retain``: a shrink of the name refuses to pass it
    cursor_retain: bool = False
    #: offsets by time (docs/spark.md "Offsets by time"): ms since the epoch per key, or for
    #: every key (``"*"``); they take precedence over startingOffsets / endingOffsets
    starting_times: TimeSpec | None = None
    ending_times: TimeSpec | None = None
    #: no entry appended at or after a starting time: ``error`` (Kafka's default) or ``latest``
    timestamp_strategy: str = "error"

    @property
    def named(self) -> bool:
        return self.ledger_ids is None

    def starting_map(self) -> str | dict[str, int]:
        return self.starting if isinstance(self.starting, str) else dict(self.starting)

    def ending_map(self) -> str | dict[str, int]:
        return self.ending if isinstance(self.ending, str) else dict(self.ending)


#: values of startingOffsetsByTimestampStrategy (Kafka's names)
TIMESTAMP_STRATEGIES = ("error", "latest")


@dataclass(frozen=True)
class TimeSpec:
    """Times (ms since the Unix epoch) to turn into offsets: one for every key (``every``, from
    startingTimestamp / endingTimestamp) or one per key (``per_key``, from the JSON of
    startingOffsetsByTimestamp / endingOffsetsByTimestamp). ``option`` names where it came from."""

    option: str
    every: int | None = None
    per_key: tuple[tuple[str, int], ...] = ()

    def time_of(self, key: str) -> int | None:
        """The time asked for ``key``, or None: the key takes the offsets option."""
        if self.every is not None:
            return self.every
        return dict(self.per_key).get(key)


def _time_ms(raw: object, option: str, where: str = "") -> int:
    """A non-negative integer of milliseconds since the Unix epoch (Kafka's timestamps)."""
    value: int | None = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, str) and re.fullmatch(r"\s*-?\d+\s*", raw):
        value = int(raw)
    if value is None or value < 0:
        raise OptionError(f"option {option}{where} must be a time in milliseconds since 1970-01-01 UTC (an integer "
                          f">= 0, e.g. 1767225600000), got {raw!r}")
    return value


def parse_time_options(options: Mapping[str, str], *, streaming: bool) -> tuple[TimeSpec | None, TimeSpec | None, str]:
    """startingTimestamp / startingOffsetsByTimestamp, endingTimestamp / endingOffsetsByTimestamp
    and startingOffsetsByTimestampStrategy; Kafka's precedence: the one-time-for-all option wins
    over the per-key JSON, and both over startingOffsets / endingOffsets."""
    specs: list[TimeSpec | None] = []
    for every_key, json_key in (("startingTimestamp", "startingOffsetsByTimestamp"),
                                ("endingTimestamp", "endingOffsetsByTimestamp")):
        every_raw, json_raw = _get(options, every_key), _get(options, json_key)
        if streaming and every_key == "endingTimestamp":
            given = [k for k, v in ((every_key, every_raw), (json_key, json_raw)) if v]
            if given:
                raise OptionError(f"option {given[0]} is for batch reads only (a stream has no end)")
        if every_raw:
            specs.append(TimeSpec(every_key, every=_time_ms(every_raw.strip(), every_key)))
            continue
        if not json_raw:
            specs.append(None)
            continue
        try:
            value = json.loads(json_raw)
        except json.JSONDecodeError as e:
            raise OptionError(f"option {json_key} must be a JSON object {{\"<name or ledger id>\": <ms since the "
                              f"epoch>}}, got {json_raw!r}: {e}") from None
        if not isinstance(value, dict) or not value:
            raise OptionError(f"option {json_key} must be a non-empty JSON object {{\"<name or ledger id>\": <ms "
                              f"since the epoch>}}, got {json_raw!r}")
        per = {str(k): _time_ms(v, json_key, f" (key {k!r})") for k, v in value.items()}
        specs.append(TimeSpec(json_key, per_key=tuple(sorted(per.items()))))
    raw_strategy = _get(options, "startingOffsetsByTimestampStrategy")
    strategy = (raw_strategy or "error").strip().lower()
    if strategy not in TIMESTAMP_STRATEGIES:
        raise OptionError(f"option startingOffsetsByTimestampStrategy must be error (fail when a name or ledger "
                          f"has no entry at or after the time) or latest (start at its end), got {raw_strategy!r}")
    return specs[0], specs[1], strategy


def _frozen(offsets: str | dict[str, int]) -> str | tuple[tuple[str, int], ...]:
    return offsets if isinstance(offsets, str) else tuple(sorted(offsets.items()))


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    _check_keys(options, _READ_KEYS, "read")
    uri = _uri(options)
    ledgers_raw = _get(options, "ledgers")
    name = _get(options, "name") or _get(options, "path")
    names_raw = _get(options, "names")
    pattern = _get(options, "namePattern")
    given = [k for k, v in (("ledgers", ledgers_raw), ("name", name), ("names", names_raw),
                            ("namePattern", pattern)) if v]
    if len(given) != 1:
        raise OptionError("give exactly one of the options ledgers (comma-separated ids), name, names "
                          f"(comma-separated) or namePattern (a regular expression); got {given or 'none'}")
    ledger_ids: tuple[int, ...] | None = None
    names: tuple[str, ...] | None = None
    if ledgers_raw:
        try:
            ids = [int(x) for x in ledgers_raw.split(",") if x.strip()]
        except ValueError:
            raise OptionError(f"option ledgers must be comma-separated ledger ids, got {ledgers_raw!r}") from None
        if not ids or any(i < 0 for i in ids):
            raise OptionError(f"option ledgers must name at least one ledger id >= 0, got {ledgers_raw!r}")
        ledger_ids = tuple(dict.fromkeys(ids))
    elif name:
        names = (name,)
    elif names_raw:
        names = tuple(dict.fromkeys(n.strip() for n in names_raw.split(",") if n.strip()))
        if not names:
            raise OptionError("option names must list at least one name")
    else:
        assert pattern is not None
        try:
            re.compile(pattern)
        except re.error as e:
            raise OptionError(f"option namePattern is not a valid regular expression: {e}") from None
    starting = parse_offsets(_get(options, "startingOffsets"), "startingOffsets",
                             default="latest" if streaming else "earliest")
    ending_raw = _get(options, "endingOffsets")
    if streaming and ending_raw:
        raise OptionError("option endingOffsets is for batch reads only (a stream has no end)")
    ending = parse_offsets(ending_raw, "endingOffsets", default="latest")
    if ending == "earliest":
        raise OptionError("option endingOffsets cannot be 'earliest'")
    if isinstance(ending, dict) and any(v == EARLIEST for v in ending.values()):
        raise OptionError("option endingOffsets cannot use -2 (earliest)")
    if not streaming:
        for key in ("maxEntriesPerTrigger", "maxBytesPerTrigger", "minEntriesPerTrigger", "maxTriggerDelay",
                    "lacPollIntervalMs"):
            if _get(options, key):
                raise OptionError(f"option {key} is for streaming reads only")
    keys = ledger_ids is not None
    for opt, offsets in (("startingOffsets", starting), ("endingOffsets", ending)):
        if isinstance(offsets, dict) and keys:
            bad = [k for k in offsets if not k.isdigit()]
            if bad:
                raise OptionError(f"option {opt}: keys must be ledger ids in ledger mode, got {bad}")
    max_entries_per_trigger = _int(options, "maxEntriesPerTrigger", None)
    min_entries_per_trigger = _int(options, "minEntriesPerTrigger", None)
    delay_raw = _get(options, "maxTriggerDelay")
    if delay_raw and min_entries_per_trigger is None:
        raise OptionError("option maxTriggerDelay bounds the wait of minEntriesPerTrigger: give minEntriesPerTrigger "
                          "too, or drop maxTriggerDelay")
    if min_entries_per_trigger is not None and max_entries_per_trigger is not None \
            and min_entries_per_trigger > max_entries_per_trigger:
        raise OptionError(f"option minEntriesPerTrigger ({min_entries_per_trigger}) is above maxEntriesPerTrigger "
                          f"({max_entries_per_trigger}): a micro-batch could never start")
    loss_location = _get(options, "dataLossLocation") or None
    if loss_location is not None:
        if loss_location.startswith("file:"):
            loss_location = loss_location[len("file:"):]
            loss_location = "/" + loss_location.lstrip("/")
        if not os.path.isabs(loss_location):
            raise OptionError(f"option dataLossLocation must be an absolute directory path that every executor "
                              f"can write (a shared filesystem on a cluster), got {loss_location!r}")
    password = (_get(options, "password") or "").encode()
    cursor_name = _get(options, "cursorName") or None
    cursor_retain = _bool(options, "cursorRetain", False)
    if cursor_name is not None and (not streaming or ledger_ids is not None):
        raise OptionError("option cursorName is for streaming reads of named ledgers (name, names or namePattern): "
                          "a cursor is stored in a name's record")
    if cursor_retain and cursor_name is None:
        raise OptionError("option cursorRetain applies to the cursor of option cursorName: give cursorName too")
    starting_times, ending_times, strategy = parse_time_options(options, streaming=streaming)
    if ledger_ids is not None:
        for spec in (starting_times, ending_times):
            bad = [k for k, _t in spec.per_key if not k.isdigit()] if spec is not None else []
            if bad:
                assert spec is not None
                raise OptionError(f"option {spec.option}: keys must be ledger ids in ledger mode, got {bad}")
    return ReadOptions(
        metadata_uri=uri,
        ledger_ids=ledger_ids,
        names=names,
        name_pattern=pattern or None,
        starting=_frozen(starting),
        ending=_frozen(ending),
        max_entries_per_partition=_int(options, "maxEntriesPerPartition", 100_000) or 100_000,
        max_bytes_per_partition=_int(options, "maxBytesPerPartition", 128 << 20) or 128 << 20,
        min_partitions=_int(options, "minPartitions", None),
        include_payload=_bool(options, "includePayload", True),
        include_metadata=_bool(options, "includeMetadata", False),
        max_entries_per_trigger=max_entries_per_trigger,
        max_bytes_per_trigger=_int(options, "maxBytesPerTrigger", None),
        min_entries_per_trigger=min_entries_per_trigger,
        max_trigger_delay_ms=parse_duration_ms(delay_raw, "maxTriggerDelay") if delay_raw else 15 * 60_000,
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        data_loss_location=loss_location,
        lac_poll_interval_ms=_int(options, "lacPollIntervalMs", 500, minimum=0) or 0,
        arrow_batch_entries=_int(options, "arrowBatchEntries", 4096) or 4096,
        password=password,
        client_properties=_bk_passthrough(options),
        include_headers=_bool(options, "includeHeaders", False),
        payload_column=_bool(options, "payloadColumn", True),
        cursor_name=cursor_name,
        cursor_retain=cursor_retain,
        starting_times=starting_times,
        ending_times=ending_times,
        timestamp_strategy=strategy,
    )


@dataclass(frozen=True)
class WriteOptions:
    """Validated write options (batch and streaming)."""

    metadata_uri: str
    name: str
    ensemble_size: int | None
    write_quorum_size: int | None
    ack_quorum_size: int | None
    digest_type: str | None
    password: bytes = field(repr=False)  # never in a log line or error message
    max_in_flight: int
    client_properties: tuple[tuple[str, str], ...]
    #: rows packed into one entry (1 = plain entries, one row each; see vellum.format.records)
    entry_max_rows: int = 1000
    #: a packed entry is closed before its rows' bytes pass this (a bigger row gets an entry alone)
    entry_max_bytes: int = 131072
    #: the DataFrame's columns (value or payload, and any of key, timestamp, headers, name)
    columns: tuple[str, ...] = ("value",)
    #: the column holding the values: ``value``, or ``payload`` (its compatibility alias)
    value_column: str = "value"
    #: rows go to the named ledger in their ``name`` column (no ``name`` option given)
    name_from_column: bool = False
    #: streams: merge this many same-level closed segments into one (0: never; docs/spark.md
    #: "A sink that runs for a year")
    segment_merge_factor: int = 10
    #: ... when together they hold at most this many payload bytes
    segment_merge_max_bytes: int = 64 * 1024 * 1024
    #: replaced segments' ledgers (and old finished markers) are deleted after this long
    segment_retire_delay_ms: int = 3_600_000

    @property
    def packed(self) -> bool:
        return self.entry_max_rows > 1


#: upper bound of option entryMaxBytes (a packed entry is one frame on the wire)
MAX_PACKED_ENTRY_BYTES = 4 * 1024 * 1024

_DIGESTS = ("CRC32", "CRC32C", "HMAC", "DUMMY")


def parse_write_options(options: Mapping[str, str], *, name_column: bool = False) -> WriteOptions:
    """``name_column``: the DataFrame has a ``name`` column, which routes rows when the option
    ``name`` is not given (Kafka's ``topic`` column and option)."""
    _check_keys(options, _WRITE_KEYS, "write")
    uri = _uri(options)
    name = _get(options, "name") or _get(options, "path")
    if not name and not name_column:
        raise OptionError("option name is required: the named ledger to write into (or save(name)), unless the "
                          "DataFrame has a 'name' column (string) naming each row's named ledger")
    digest = _get(options, "digestType")
    if digest is not None and digest.upper() not in _DIGESTS:
        raise OptionError(f"option digestType must be one of {', '.join(_DIGESTS)}, got {digest!r}")
    e = _int(options, "ensembleSize", None)
    w = _int(options, "writeQuorumSize", None)
    a = _int(options, "ackQuorumSize", None)
    max_bytes = _int(options, "entryMaxBytes", 131072) or 131072
    if max_bytes > MAX_PACKED_ENTRY_BYTES:
        raise OptionError(f"option entryMaxBytes must be at most {MAX_PACKED_ENTRY_BYTES} (entries travel in one "
                          f"frame; nettyMaxFrameSizeBytes is 5 MB by default), got {max_bytes}")
    if e is not None and w is not None and a is not None and not e >= w >= a:
        raise OptionError(f"need ensembleSize >= writeQuorumSize >= ackQuorumSize, got {e} >= {w} >= {a}")
    return WriteOptions(
        metadata_uri=uri,
        name=name or "",
        name_from_column=not name,
        ensemble_size=e,
        write_quorum_size=w,
        ack_quorum_size=a,
        digest_type=digest.upper() if digest else None,
        password=(_get(options, "password") or "").encode(),
        max_in_flight=_int(options, "maxInFlight", 1000) or 1000,
        client_properties=_bk_passthrough(options),
        entry_max_rows=_int(options, "entryMaxRows", 1000, minimum=1) or 1000,
        entry_max_bytes=max_bytes,
        segment_merge_factor=_merge_factor(options),
        segment_merge_max_bytes=_int(options, "segmentMergeMaxBytes", 64 << 20, minimum=1) or 64 << 20,
        segment_retire_delay_ms=(parse_duration_ms(raw_delay, "segmentRetireDelay")
                                 if (raw_delay := _get(options, "segmentRetireDelay")) else 3_600_000),
    )


def _merge_factor(options: Mapping[str, str]) -> int:
    factor = _int(options, "segmentMergeFactor", 10, minimum=0)
    if factor == 1:
        raise OptionError("option segmentMergeFactor must be 0 (no merging) or at least 2 (segments merged at a "
                          "time), got 1")
    return 10 if factor is None else factor
