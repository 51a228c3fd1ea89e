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
MAX_HEADER_BYTES = 16 * 2**20


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


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    chunks = []
    remaining = n
    while remaining:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise ReadTimeout
            ready, _, _ = select.select([fd], [], [], wait)
            if not ready:
                raise ReadTimeout
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the channel")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_message(
    fd: int, *, deadline: float | None = None, max_bytes: int = 256 * 2**20
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read one message; raise ProtocolError on anything malformed or too large."""
    (head_len,) = _LEN.unpack(_read_exact(fd, _LEN.size, deadline))
    if head_len > min(MAX_HEADER_BYTES, max_bytes):
        raise ProtocolError(f"message header of {head_len} bytes is too large")
    try:
        header = json.loads(_read_exact(fd, head_len, deadline))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"message header is not JSON: {exc}") from None
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
            arrays[spec["name"]] = np.load(io.BytesIO(blob), allow_pickle=False)
        except Exception as exc:  # a bad .npy blob is the sender's fault, never ours
            raise ProtocolError(f"array {spec['name']!r} is not a valid .npy: {exc}") from None
    return header, arrays


def write_message(
    fd: int, header: dict[str, Any], arrays: dict[str, np.ndarray] | None = None
) -> None:
    """Write one whole message to ``fd``."""
    data = memoryview(encode_message(header, arrays))
    while data:
        written = os.write(fd, data)
        data = data[written:]
