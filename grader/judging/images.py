"""Checking that a file the submission wrote is a real, non-blank PNG image."""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

MAX_IMAGE_BYTES = 20 * 2**20
#: Largest plot decoded (a 4000x4000 RGBA image is 64 MB in memory): a small PNG can
#: claim a huge canvas, and decoding it would take the grader's memory.
MAX_IMAGE_PIXELS = 16_000_000
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def problem_with_png(path: Path, min_side: int = 100) -> str:
    """Why ``path`` is not an acceptable plot, or "" if it is.

    Opened without following links and without blocking (a FIFO would otherwise
    hang the grader in ``open``): the folder belongs to the submission.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return "no file was written at the path the grader passed in."
    except OSError as exc:
        return f"the file could not be opened ({exc.strerror})."
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            return "the path is not a regular file."
        if info.st_size > MAX_IMAGE_BYTES:
            return f"the file is larger than {MAX_IMAGE_BYTES // 2**20} MiB."
        data = f.read(MAX_IMAGE_BYTES + 1)
    if not data.startswith(PNG_MAGIC):
        return "the file is not a PNG image (save it with a .png name or format='png')."
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size  # from the header: nothing decoded yet
            if width * height > MAX_IMAGE_PIXELS:
                return f"the image is {width}x{height} pixels, more than the grader decodes."
            image.load()
            extrema = image.convert("L").getextrema()
    except Exception as exc:
        return f"the PNG image cannot be decoded ({exc})."
    if min(width, height) < min_side:
        return f"the image is only {width}x{height} pixels."
    if extrema[0] == extrema[1]:
        return "the image is blank (a single colour)."
    return ""
