"""copydetect's side-by-side report (``similarity.html``), every student string escaped once.

copydetect 0.5 renders its report with a Jinja template that does not escape: its lists
of compared files print each path raw, so a student's file named
``<img src=x onerror=alert(document.domain)>.py`` would run its script in the browser of
the TA who opens the report. Here the same template is rendered with autoescaping on, so
that every file and folder name is escaped exactly once (the template's own ``|e`` on a
name yields markup that autoescaping leaves alone). The highlighted code is the one
string already escaped: copydetect escapes the student's code and then wraps the matching
regions in its two ``<span>`` tags. It is marked safe only when those tags are all the
markup it holds; anything else is escaped again, visibly, rather than run.
"""

from __future__ import annotations

import base64
import importlib.resources
import io
import json
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from copydetect import CopyDetector
    from markupsafe import Markup

#: The tags copydetect wraps around the matching regions of the (escaped) code.
HIGHLIGHTS = ("<span class='highlight-red'>", "<span class='highlight-green'>", "</span>")


def highlighted(code: str) -> Markup:
    """copydetect's highlighted code as markup: as it is when the highlight tags are its
    only markup (copydetect escaped the rest), else escaped as a whole."""
    from markupsafe import Markup, escape

    bare = code
    for tag in HIGHLIGHTS:
        bare = bare.replace(tag, "")
    return Markup(code) if "<" not in bare and ">" not in bare else escape(code)


def figure_png(values: np.ndarray, kind: str) -> str:
    """The similarity matrix (``kind`` "matrix") or the histogram of the scores ("hist")
    as copydetect draws them, a base64 PNG."""
    import matplotlib.pyplot as plt

    if kind == "matrix":
        plt.imshow(values)
        plt.colorbar()
    else:
        plt.hist(values, bins=20)
    plt.tight_layout()
    buffer = io.BytesIO()
    plt.savefig(buffer)
    plt.close()
    return base64.b64encode(buffer.getvalue()).decode()


def report_html(detector: CopyDetector) -> str:
    """The page copydetect's ``generate_html_report`` writes, with the same template and
    figures, rendered with autoescaping (every variable the template uses is given; a
    template of a later copydetect that wants another fails rather than shows a blank)."""
    import copydetect
    import copydetect.data
    from jinja2 import Environment, StrictUndefined

    scores = detector.similarity_matrix[:, :, 0]
    matrix = np.where(scores == -1, np.nan, scores)
    code_list = [
        [*code[:4], highlighted(code[4]), highlighted(code[5]), *code[6:]]
        for code in detector.get_copied_code_list()
    ]
    source = importlib.resources.files(copydetect.data).joinpath("report.html")
    template = Environment(autoescape=True, undefined=StrictUndefined).from_string(
        source.read_text(encoding="utf-8")
    )
    variables: dict[str, Any] = {
        "config_params": json.dumps(detector.conf.to_json(), indent=4),
        "css_files": detector.conf.css_files,
        "version": copydetect.__version__,
        "test_count": len(detector.test_files),
        "test_files": [str(f) for f in detector.test_files],
        "compare_count": len(detector.ref_files),
        "compare_files": [str(f) for f in detector.ref_files],
        "flagged_file_count": int(np.sum(np.any(scores > detector.conf.display_t, axis=1))),
        "code_list": code_list,
        "sim_mtx_base64": figure_png(matrix, "matrix"),
        "sim_hist_base64": figure_png(scores[scores != -1], "hist"),
    }
    return template.render(**variables)
