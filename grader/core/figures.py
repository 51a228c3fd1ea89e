"""Pictures for the reports: matplotlib without a display, figures embedded as PNG data URIs
(a page that carries its pictures opens offline, from anywhere)."""

from __future__ import annotations

import base64
import io
from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the headless Agg backend (imported on first use: a grading
    that draws nothing never pays for it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_uri(fig: Any, dpi: int = 90) -> str:
    """``fig`` as an embedded PNG (``data:image/png;base64,...``); the figure is closed."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    pyplot().close(fig)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
