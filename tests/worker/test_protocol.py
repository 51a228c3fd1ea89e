"""The wire format refuses anything but plain data."""

from __future__ import annotations

import io
import os
import struct

import numpy as np
import pytest

from grader.worker.protocol import (
    ProtocolError,
    ReadTimeout,
    encode_message,
    read_message,
    write_message,
)


def roundtrip(data: bytes, **kwargs):
    r, w = os.pipe()
    try:
        os.write(w, data)
        os.close(w)
        w = -1
        return read_message(r, **kwargs)
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def test_header_and_arrays_roundtrip() -> None:
    arrays = {"logits": np.arange(12, dtype=np.float32).reshape(3, 4)}
    header, got = roundtrip(encode_message({"ok": True, "n": 3}, arrays))
    assert header == {"ok": True, "n": 3}
    np.testing.assert_array_equal(got["logits"], arrays["logits"])
    assert got["logits"].dtype == np.float32


def test_pickled_object_array_is_refused() -> None:
    buf = io.BytesIO()
    np.save(buf, np.array([object()], dtype=object), allow_pickle=True)
    blob = buf.getvalue()
    head = b'{"__arrays__": [{"name": "x", "nbytes": %d}]}' % len(blob)
    with pytest.raises(ProtocolError, match=r"not a valid \.npy"):
        roundtrip(struct.pack(">Q", len(head)) + head + blob)


def test_oversized_message_is_refused_before_reading_it() -> None:
    head = b'{"__arrays__": [{"name": "x", "nbytes": 999999999}]}'
    with pytest.raises(ProtocolError, match="limit"):
        roundtrip(struct.pack(">Q", len(head)) + head, max_bytes=1000)


def test_garbage_header_is_refused() -> None:
    with pytest.raises(ProtocolError):
        roundtrip(struct.pack(">Q", 5) + b"\xff\xfe{{{")
    with pytest.raises(ProtocolError):
        roundtrip(struct.pack(">Q", 2**40))


def test_closed_channel_is_eof() -> None:
    with pytest.raises(EOFError):
        roundtrip(b"")


def test_read_times_out() -> None:
    r, w = os.pipe()
    try:
        with pytest.raises(ReadTimeout):
            read_message(r, deadline=0)
    finally:
        os.close(r)
        os.close(w)


def test_write_message_matches_encode() -> None:
    r, w = os.pipe()
    write_message(w, {"a": 1})
    os.close(w)
    assert read_message(r) == ({"a": 1}, {})
    os.close(r)
