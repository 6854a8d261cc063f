"""Read back what W&B recorded in an offline run (``WANDB_MODE=offline``).

wandb (0.31) has no Python reader for its ``.wandb`` files, the run's
transaction log that ``wandb sync`` uploads later; this one reads the
history, the summary and the config out of it, for the W&B sink's tests.

The format, as wandb's own source documents it (the writer is Go code in
wandb-core, ``core/internal/transactionlog`` over ``core/pkg/leveldb``; the
Python writer it replaced, ``wandb/sdk/internal/datastore.py``, wrote the
same bytes and says in its docstring)::

    leveldb log datastore.

    block := record* trailer?
    record :=
      checksum: uint32     // crc32c of type and data[] ; little-endian
      length: uint16       // little-endian
      type: uint8          // One of FULL, FIRST, MIDDLE, LAST
      data: uint8[length]

    header :=
      ident: char[4]
      magic: uint16
      version: uint8

with ``LEVELDBLOG_BLOCK_LEN = 32768``, ``LEVELDBLOG_HEADER_LEN = 7``, the
types FULL = 1, FIRST = 2, MIDDLE = 3, LAST = 4, and the file header
``":W&B"``, ``0xBEE1`` ("zlib.crc32(bytes("Weights & Biases", 'iso8859-1'))
& 0xffff"), version 0. And from ``core/pkg/leveldb/record.go``: "the stream
is divided into 32KiB blocks, and each block contains a number of tightly
packed chunks. Chunks cannot cross block boundaries. The last block may be
shorter than 32 KiB. Any unused bytes in a block must be zero. [...] The
checksum is over the chunk type and the payload."

Two things the docstring's wording hides, both checked against the files
wandb 0.31 writes:

- The checksum is *not* leveldb's masked CRC-32C, despite "crc32c" above:
  ``transactionlog`` opens its reader and writer with ``CRCAlgoIEEE``
  (``CRCStandard``: ``crc32.Checksum(b, crc32.IEEE)``, no mask), and
  datastore.py computed ``zlib.crc32(data, zlib.crc32(type byte))``. So it
  is plain ``zlib.crc32(bytes([type]) + payload)``.
- The 7-byte file header sits inside the first block (the Go writer
  prepends it to block 0's buffer), so block boundaries are at multiples of
  32768 from the start of the file, header included.

Each record's payload is a ``wandb_internal_pb2.Record`` (the classes the
wandb wheel ships, for the installed protobuf major version). A ``history``
record holds one ``run.log`` step: its items carry a key path
(``nested_key``, one element per level of a nested dict; ``key`` in older
files) and the value as JSON, with wandb's non-standard ``NaN``,
``Infinity`` and ``-Infinity``, which :func:`json.loads` accepts. A float
with an integral value is written as a JSON integer (``1.0`` as ``1``,
``-0.0`` as ``-0``), so it decodes to an ``int``; compare by value.

API: :func:`read_records` (every Record, in order), :func:`read_history`,
:func:`read_summary`, :func:`read_config`; each takes the run directory
(``.../wandb/offline-run-<time>-<id>``) or the ``.wandb`` file itself, and
waits (``timeout``) for a finished run's file to be whole: ``run.finish()``
can return before its last block is written. :func:`read_payloads` is the
log layer alone, on bytes.
"""

from __future__ import annotations

import json
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK_LEN = 32768
HEADER_LEN = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
FILE_IDENT = b":W&B"
FILE_MAGIC = 0xBEE1
FILE_VERSIONS = (0,)  # what wandb 0.31 writes


class FormatError(ValueError):
    """The file is not a well-formed .wandb transaction log."""


def wandb_file(run: str | Path) -> Path:
    """The ``run-<id>.wandb`` file of a run directory (or ``run`` itself if
    it is a file)."""
    path = Path(run)
    if path.is_file():
        return path
    found = sorted(path.glob("*.wandb"))
    if len(found) != 1:
        raise FileNotFoundError(f"expected one .wandb file in {path}, found {found}")
    return found[0]


def read_payloads(data: bytes) -> Iterator[bytes]:
    """The records' payloads of a whole .wandb file's bytes, reassembled from
    their chunks, each chunk's checksum verified."""
    if len(data) < HEADER_LEN:
        raise FormatError(f"{len(data)} bytes: shorter than the file header")
    ident, magic, version = struct.unpack_from("<4sHB", data, 0)
    if ident != FILE_IDENT or magic != FILE_MAGIC:
        raise FormatError(f"bad file header {data[:HEADER_LEN]!r}")
    if version not in FILE_VERSIONS:
        raise FormatError(f"file version {version}, this reader knows {FILE_VERSIONS}")
    pos = HEADER_LEN
    pending: list[bytes] | None = None  # the chunks of a record begun by FIRST
    while pos < len(data):
        left_in_block = BLOCK_LEN - pos % BLOCK_LEN
        if left_in_block < HEADER_LEN:  # the block's trailer: zeros (or the end)
            if data[pos : pos + left_in_block].strip(b"\0"):
                raise FormatError(f"non-zero block trailer at offset {pos}")
            pos += left_in_block
            continue
        if pos + HEADER_LEN > len(data):
            raise FormatError(f"truncated chunk header at offset {pos}")
        checksum, length, kind = struct.unpack_from("<IHB", data, pos)
        start, end = pos + HEADER_LEN, pos + HEADER_LEN + length
        if length > left_in_block - HEADER_LEN or end > len(data):
            raise FormatError(f"chunk at offset {pos} overflows its block or the file")
        payload = data[start:end]
        if zlib.crc32(bytes([kind]) + payload) != checksum:
            raise FormatError(f"checksum mismatch in the chunk at offset {pos}")
        if kind == FULL and pending is None:
            yield payload
        elif kind == FIRST and pending is None:
            pending = [payload]
        elif kind == MIDDLE and pending is not None:
            pending.append(payload)
        elif kind == LAST and pending is not None:
            pending.append(payload)
            yield b"".join(pending)
            pending = None
        else:
            raise FormatError(f"chunk type {kind} out of sequence at offset {pos}")
        pos = end
    if pending is not None:
        raise FormatError("the file ends inside a record (no LAST chunk)")


def read_records(run: str | Path, timeout: float = 10.0) -> list[Any]:
    """Every ``wandb_internal_pb2.Record`` of the run's .wandb file, in order.

    ``run.finish()`` can return before wandb-core has written the file's
    last block (the writer buffers a block until it is full or closed: the
    file then ends inside a record), so this waits up to ``timeout`` seconds
    for the file to read whole through its ``exit`` record, the last one a
    finished run writes. ``timeout=0`` reads the file once as it is (a run
    still going, or one that died): a partly written record is then a
    :class:`FormatError`.
    """
    from wandb.proto import wandb_internal_pb2

    path = wandb_file(run)
    deadline = time.monotonic() + timeout
    while True:
        try:
            records = []
            for payload in read_payloads(path.read_bytes()):
                record = wandb_internal_pb2.Record()
                record.ParseFromString(payload)
                records.append(record)
            if timeout <= 0 or any(r.WhichOneof("record_type") == "exit" for r in records):
                return records
            error: Exception = TimeoutError(f"{path}: no exit record after {timeout} s")
        except FormatError as e:
            if timeout <= 0:
                raise
            error = e
        if time.monotonic() >= deadline:
            raise error
        time.sleep(0.01)


def _key_path(item: Any) -> list[str]:
    return list(item.nested_key) if item.nested_key else [item.key]


def _put(target: dict[str, Any], path: list[str], value: Any) -> None:
    for part in path[:-1]:
        target = target.setdefault(part, {})
    target[path[-1]] = value


def _drop(target: dict[str, Any], path: list[str]) -> None:
    for part in path[:-1]:
        target = target.get(part, {})
    target.pop(path[-1], None)


def read_history(run: str | Path, timeout: float = 10.0) -> list[dict[str, Any]]:
    """One dict per ``history`` record (one per step that ``run.log`` made),
    in file order: the logged keys with their JSON-decoded values, nested
    dicts rebuilt from the key paths, plus wandb's own ``_step``,
    ``_timestamp`` and ``_runtime``."""
    rows = []
    for record in read_records(run, timeout):
        if record.WhichOneof("record_type") != "history":
            continue
        row: dict[str, Any] = {}
        for item in record.history.item:
            _put(row, _key_path(item), json.loads(item.value_json))
        rows.append(row)
    return rows


def read_summary(run: str | Path, timeout: float = 10.0) -> dict[str, Any]:
    """The run's summary: every ``summary`` record's updates and removals
    applied in order (wandb writes one after each step and at the end)."""
    summary: dict[str, Any] = {}
    for record in read_records(run, timeout):
        if record.WhichOneof("record_type") != "summary":
            continue
        for item in record.summary.update:
            _put(summary, _key_path(item), json.loads(item.value_json))
        for removed in record.summary.remove:
            _drop(summary, _key_path(removed))
    return summary


def read_config(run: str | Path, timeout: float = 10.0) -> dict[str, Any]:
    """The run's config: the ``run`` record's, then the later ``config``
    records' updates and removals (wandb's own ``_wandb`` entry included)."""
    config: dict[str, Any] = {}
    for record in read_records(run, timeout):
        kind = record.WhichOneof("record_type")
        if kind not in ("run", "config"):
            continue
        update = record.run.config if kind == "run" else record.config
        for item in update.update:
            _put(config, _key_path(item), json.loads(item.value_json))
        for removed in update.remove:
            _drop(config, _key_path(removed))
    return config
