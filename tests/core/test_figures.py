"""The reports' pictures: headless, embedded as PNGs, each figure closed once drawn."""

from __future__ import annotations

import base64
import io

from PIL import Image

from grader.core.figures import png_uri, pyplot


def test_a_figure_becomes_an_embedded_png_and_is_closed() -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([1, 2], [3, 4])
    uri = png_uri(fig, dpi=50)
    head, _, data = uri.partition(",")
    assert head == "data:image/png;base64"
    image = Image.open(io.BytesIO(base64.b64decode(data)))
    assert image.format == "PNG" and image.size == (200, 150)
    assert fig.number not in plt.get_fignums()
