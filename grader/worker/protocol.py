"""Wire format between the trusted grader and the untrusted worker.

A message is a length-prefixed JSON header followed by zero or more raw ``.npy``
blobs whose sizes the header lists. Nothing is ever unpickled: JSON gives plain
dicts, lists, strings and numbers, and arrays are read with
``np.load(allow_pickle=False)``. This file is shared by both sides, so it
imports only the standard library and numpy.
"""

from __future__ import annotations

import io
import json
import os
import select
import struct
import time
from typing import Any

import numpy as np

_LEN = struct.Struct(">Q")
#: A message's JSON header. The largest a grading of the reference or the blank skeleton
#: sends either way is 14 KB (arrays travel beside it, as .npy). JSON grows when parsed:
#: 16 MiB of empty objects took the parent 369 MiB, 1 MiB takes it 23 MiB.
MAX_HEADER_BYTES = 2**20
# A request comes from the trusted parent; a GPU workload's seeded weights travel in one
# (Part 2's cuda benchmark model: 1.6 GB). Replies keep the client's own, smaller limit.
MAX_REQUEST_BYTES = 8 * 2**30
MAX_DIMS = 8
#: The only array types a message may carry: plain numbers, never objects, strings,
#: records or zero-size items (whose element count no byte count bounds).
ALLOWED_DTYPES = frozenset(
    np.dtype(t).newbyteorder(order)
    for t in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
              "uint64", "float16", "float32", "float64")
    for order in ("<", ">", "=")
)  # fmt: skip


class ProtocolError(Exception):
    """The other side sent something that is not a well-formed message."""


class ReadTimeout(Exception):
    """No complete message arrived before the deadline."""


def encode_message(header: dict[str, Any], arrays: dict[str, np.ndarray] | None = None) -> bytes:
    """Serialise a header and named arrays into one message."""
    blobs = []
    specs = []
    for name, array in (arrays or {}).items():
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
        blob = buf.getvalue()
        blobs.append(blob)
        specs.append({"name": name, "nbytes": len(blob)})
    head = json.dumps({**header, "__arrays__": specs}, allow_nan=True).encode()
    return _LEN.pack(len(head)) + head + b"".join(blobs)


def _read_exact(fd: int, n: int, deadline: float | None) -> bytearray:
    """Exactly ``n`` bytes, read into one buffer (no copies: arrays are views of it)."""
    buf = bytearray(n)
    view = memoryview(buf)
    done = 0
    while done < n:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise ReadTimeout
            ready, _, _ = select.select([fd], [], [], wait)
            if not ready:
                raise ReadTimeout
        try:
            got = os.readv(fd, [view[done : min(n, done + (1 << 20))]])
        except BlockingIOError:
            continue
        if not got:
            raise EOFError("the other side closed the channel")
        done += got
    return buf


def read_message(
    fd: int, *, deadline: float | None = None, max_bytes: int = 256 * 2**20
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read one message; raise ProtocolError on anything malformed or too large."""
    (head_len,) = _LEN.unpack(_read_exact(fd, _LEN.size, deadline))
    if head_len > min(MAX_HEADER_BYTES, max_bytes):
        raise ProtocolError(f"message header of {head_len} bytes is too large")
    try:
        header = json.loads(_read_exact(fd, head_len, deadline))
    except (ValueError, RecursionError) as exc:  # bad UTF-8 or JSON, 1e6-deep, huge ints
        raise ProtocolError(f"message header is not JSON: {str(exc)[:200]}") from None
    if not isinstance(header, dict):
        raise ProtocolError("message header is not a JSON object")
    specs = header.pop("__arrays__", [])
    if not isinstance(specs, list):
        raise ProtocolError("malformed array list")
    total = head_len
    arrays: dict[str, np.ndarray] = {}
    for spec in specs:
        if not (
            isinstance(spec, dict)
            and isinstance(spec.get("name"), str)
            and isinstance(spec.get("nbytes"), int)
            and spec["nbytes"] >= 0
        ):
            raise ProtocolError("malformed array entry")
        total += spec["nbytes"]
        if total > max_bytes:
            raise ProtocolError(f"message larger than the {max_bytes} byte limit")
        blob = _read_exact(fd, spec["nbytes"], deadline)
        try:
            arrays[spec["name"]] = load_array(blob)
        except Exception as exc:  # a bad .npy blob is the sender's fault, never ours
            raise ProtocolError(f"array {spec['name']!r} is not a valid .npy: {exc}") from None
    return header, arrays


def load_array(blob: bytes) -> np.ndarray:
    """A ``.npy`` blob as an array, after its header proves it holds exactly the bytes
    of a plain numeric array: nothing is allocated beyond the blob's own size."""
    f = io.BytesIO(blob)
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    elif version in ((2, 0), (3, 0)):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise ValueError(f"unsupported .npy version {version}")
    if dtype not in ALLOWED_DTYPES:
        raise ValueError(f"dtype {dtype} is not a plain numeric type")
    if len(shape) > MAX_DIMS or any(d < 0 for d in shape):
        raise ValueError(f"shape {shape} is not allowed")
    count = 1
    for d in shape:
        count *= d
    if f.tell() + count * dtype.itemsize != len(blob):
        raise ValueError(f"shape {shape} of {dtype} does not match the {len(blob)} bytes sent")
    array = np.frombuffer(blob, dtype=dtype, count=count, offset=f.tell())
    return array.reshape(shape, order="F" if fortran else "C")


class WriteTimeout(Exception):
    """The other side stopped reading before the whole message was written."""


def write_message(
    fd: int,
    header: dict[str, Any],
    arrays: dict[str, np.ndarray] | None = None,
    *,
    deadline: float | None = None,
) -> None:
    """Write one whole message to ``fd``; with a deadline, never block past it (``fd``
    must then be non-blocking) and raise :class:`WriteTimeout`."""
    data = memoryview(encode_message(header, arrays))
    while data:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([], [fd], [], wait)[1]:
                raise WriteTimeout
        try:
            written = os.write(fd, data)
        except BlockingIOError:
            continue
        data = data[written:]
