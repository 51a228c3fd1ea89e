"""``similarity.html``: the ranked pairs first, then each pair's shared files side by side.

A TA opens this page to decide which pairs to read, so its first screen is the ranking:
each pair by its students' names (from the export's metadata) and folders, its score and
every file the two share, each linking to that file's two copies further down with the
matching regions highlighted (copydetect's highlighting). The page is one offline file:
no script, no style sheet fetched from the network.

Every file name, folder name, student name and line of code is escaped exactly once. The
highlighted code is the one string already escaped: copydetect escapes the student's code
and then wraps the matching regions in its two ``<span>`` tags. It is kept as markup only
when those tags are all the markup it holds; anything else is escaped again, visibly,
rather than run.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class SharedFile(Protocol):
    """What the page shows of a file two submissions share
    (:class:`grader.ta.similarity.SharedFile`)."""

    @property
    def name(self) -> str: ...
    @property
    def score(self) -> float: ...
    @property
    def first_share(self) -> float: ...
    @property
    def second_share(self) -> float: ...


class Pair(Protocol):
    """What the page shows of a pair (:class:`grader.ta.similarity.Pair`)."""

    @property
    def first(self) -> str: ...
    @property
    def second(self) -> str: ...
    @property
    def score(self) -> float: ...
    @property
    def files(self) -> Sequence[SharedFile]: ...


#: The tags copydetect wraps around the matching regions of the (escaped) code.
HIGHLIGHTS = ("<span class='highlight-red'>", "<span class='highlight-green'>", "</span>")

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; padding: 0 1.5em;
       max-width: 1400px; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 3px 8px; }
th { background: #eee; text-align: left; } td.num { text-align: right; }
.code { display: flex; gap: 1em; } .code > div { flex: 1; min-width: 0; }
pre { background: #fafafa; border: 1px solid #ddd; padding: 6px; overflow-x: auto;
      font-size: 12px; max-height: 40em; }
.highlight-red { background: #f2b6b6; } .highlight-green { background: #b6f2b6; }
"""

INTRO = (
    "Pairs of submissions ranked by their most similar file: the share of a file's "
    "fingerprints (copydetect's winnowing, names normalised) found in the other's copy, "
    "both directions averaged, with the skeleton's code as boilerplate. A rank is a lead, "
    "never a verdict: the handout's formulas, the course's hints and short functions make "
    "honest work alike, and students allowed to collaborate rank high. Read the shared "
    "regions below before talking to anyone."
)


@dataclass(frozen=True)
class Code:
    """One shared file's two copies as copydetect highlighted them (escaped HTML)."""

    first: str
    second: str


def highlighted(code: str) -> str:
    """copydetect's highlighted code as HTML: as it is when the highlight tags are its
    only markup (copydetect escaped the rest), else escaped as a whole."""
    bare = code
    for tag in HIGHLIGHTS:
        bare = bare.replace(tag, "")
    return code if "<" not in bare and ">" not in bare else html.escape(code)


def _who(folder: str, names: dict[str, str]) -> str:
    """A submission's cell: its students (escaped) over its folder."""
    people = html.escape(names.get(folder) or "(no name)")
    return f"{people}<br><small>{html.escape(folder)}</small>"


def pairs_table(pairs: list[Pair], names: dict[str, str]) -> str:
    """The ranking: rank, both submissions, score, and every shared file linked below."""
    rows = []
    for rank, p in enumerate(pairs, 1):
        files = ", ".join(
            f'<a href="#pair-{rank}-{k}">{html.escape(f.name)}</a> {f.score:.2f}'
            for k, f in enumerate(p.files, 1)
        )
        rows.append(
            f'<tr><td class="num"><a href="#pair-{rank}">{rank}</a></td>'
            f"<td>{_who(p.first, names)}</td><td>{_who(p.second, names)}</td>"
            f'<td class="num"><b>{p.score:.2f}</b></td><td>{files}</td></tr>'
        )
    head = "<tr><th>#</th><th>first</th><th>second</th><th>score</th><th>shared files</th></tr>"
    return f'<table id="pairs">{head}{"".join(rows)}</table>'


def pair_section(
    rank: int, pair: Pair, code: dict[tuple[str, str, str], Code], names: dict[str, str]
) -> str:
    """One pair: each shared file's two copies side by side (the most similar open)."""
    first, second = (html.escape(_plain(x, names)) for x in (pair.first, pair.second))
    parts = [f'<h3 id="pair-{rank}">{rank}. {first} and {second}: {pair.score:.2f}</h3>']
    for k, f in enumerate(pair.files, 1):
        shares = f"{f.first_share:.0%} of the first's copy, {f.second_share:.0%} of the second's"
        found = code.get((pair.first, pair.second, f.name))
        body = (
            f'<div class="code"><div><pre>{highlighted(found.first)}</pre></div>'
            f"<div><pre>{highlighted(found.second)}</pre></div></div>"
            if found
            else "<p>Too little in common to highlight.</p>"
        )
        opened = " open" if k == 1 and found else ""
        parts.append(
            f'<details id="pair-{rank}-{k}"{opened}><summary><code>{html.escape(f.name)}'
            f"</code> {f.score:.2f} ({shares})</summary>{body}</details>"
        )
    return "<section>" + "".join(parts) + "</section>"


def _plain(folder: str, names: dict[str, str]) -> str:
    return f"{names[folder]} ({folder})" if names.get(folder) else folder


def report_html(
    pairs: list[Pair],
    code: dict[tuple[str, str, str], Code],
    names: dict[str, str],
    *,
    submissions: int,
    total: int | None = None,
    without_code: Sequence[str] = (),
) -> str:
    """The whole page: the ranking of ``pairs`` (the top ``len(pairs)`` of ``total`` pairs
    that share a file), the submissions left out of every pair (``without_code``: no file
    of theirs differs from the skeleton), then each pair's files with the highlighted
    ``code`` copydetect found (by first, second, file)."""
    total = len(pairs) if total is None else total
    sections = "".join(pair_section(r, p, code, names) for r, p in enumerate(pairs, 1))
    shown = f"all {total}" if total == len(pairs) else f"the {len(pairs)} highest of {total}"
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>Code similarity</title><style>{STYLE}</style></head><body>"
        f"<h1>Code similarity: {submissions} submissions</h1><p>{html.escape(INTRO)}</p>"
        f"<h2>Ranked pairs ({shown} pairs that share a file; every pair is in "
        "similarity.csv)</h2>"
        f"{pairs_table(pairs, names) if pairs else '<p>No two submissions share a file.</p>'}"
        f"{not_compared(without_code, names)}"
        f"<h2>Shared files, side by side</h2>{sections}</body></html>"
    )


def not_compared(folders: Sequence[str], names: dict[str, str]) -> str:
    """The line that names the submissions in no pair: nothing of theirs differs from the
    skeleton, so they share nothing with anyone (a blank or an unchanged upload)."""
    if not folders:
        return ""
    who = "; ".join(html.escape(_plain(f, names)) for f in folders)
    return (
        f'<p id="not-compared">In no pair ({len(folders)}): {who}. Every file they '
        "uploaded is the skeleton's, byte for byte, so there is nothing of theirs to "
        "compare.</p>"
    )
