"""What a regrade produced, and the files that show it: ``scores.csv``, ``summary.json``,
``summary.md``, ``score_histogram.png`` and ``submitters.json``.

Kept apart from :mod:`grader.ta.regrade.batch` (which grades) so that both the batch regrader
and :mod:`grader.ta.regrade.merge` build their rows and summaries the same way.
"""

from __future__ import annotations

import csv
import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from grader.core.figures import pyplot
from grader.core.registry import PARTS
from grader.core.score import Score, file_score
from grader.core.score import part_scores as check_part_scores
from grader.ta.regrade.census import Cause, census_markdown, census_records, natural_key

#: ``died``: a cluster task that never finished (time limit, node failure, out of memory);
#: it is submitted again by the next run.
STATUSES = ("graded", "skipped", "timeout", "error", "interrupted", "died")


@dataclass(frozen=True)
class Submitter:
    name: str = ""
    sid: str = ""
    email: str = ""


@dataclass
class Row:
    """One submission's line of ``scores.csv``."""

    submission_id: str  # the export's folder name
    submitters: list[Submitter]
    status: str  # one of STATUSES
    parts: dict[str, float | None]  # None: the results hold no check of that part
    total: float  # the regular points plus the bonus (what Gradescope records)
    max_score: float
    bonus: float = 0.0  # extra credit within ``total`` (checks whose maximum is 0)
    earlier: str = ""  # a kept row ("skipped" in this run): the status its grading had

    @property
    def recorded(self) -> str:
        """The status the class's record shows: how the submission's grading ended, in this
        run or (a kept row) in the earlier one that graded it."""
        return self.earlier or self.status

    @property
    def score(self) -> Score:
        """The row's points as every view shows them (:mod:`grader.core.score`)."""
        return Score(self.total - self.bonus, self.bonus, self.max_score)


@dataclass(frozen=True)
class CheckRate:
    number: str
    name: str
    passed: int
    total: int  # results files that contain this check


@dataclass
class BatchSummary:
    """What a batch produced: rows sorted by submission id, and the aggregate numbers."""

    out_dir: Path
    rows: list[Row]
    counts: dict[str, int]  # submissions per status
    stats: dict[str, float]  # mean / median / min / max of the totals
    rates: list[CheckRate]
    elapsed_s: float
    died: dict[str, str] = field(default_factory=dict)  # submission -> why its task died
    causes: list[Cause] = field(default_factory=list)  # the mistake census (most made first)
    # The timed checks decided late or never (census.timing_doubts), to time again.
    doubts: list[dict[str, Any]] = field(default_factory=list)


def part_scores(data: dict[str, Any]) -> dict[str, float | None]:
    """The regular points of the checks of each part (None where a part has none); the
    extra credit is the row's ``bonus``, as every view sets it apart."""
    found = check_part_scores(data.get("tests", []))
    return {p: found[p].regular if p in found else None for p in PARTS}


def make_row(sub_id: str, people: list[Submitter], data: dict[str, Any], status: str) -> Row:
    """One submission's row, its numbers by the one rule of :mod:`grader.core.score`."""
    score = file_score(data)
    return Row(sub_id, people, status, part_scores(data), score.total, score.max_score, score.bonus)


def spread(values: list[float]) -> dict[str, float]:
    """mean / median / min / max of ``values`` (zeros for none), rounded for a file."""
    if not values:
        return dict.fromkeys(("mean", "median", "min", "max"), 0.0)
    found = (statistics.fmean(values), float(statistics.median(values)), min(values), max(values))
    return {k: round(v, 4) for k, v in zip(("mean", "median", "min", "max"), found, strict=True)}


def score_sentence(score: dict[str, float], max_score: float) -> str:
    """The class's regular points (a :func:`spread`), as every class view words them."""
    return (
        f"Score out of {max_score:g}, the bonus apart: mean {score['mean']:.2f}, median "
        f"{score['median']:g}, min {score['min']:g}, max {score['max']:g}."
    )


def total_sentence(total: dict[str, float]) -> str:
    """The class's totals (a :func:`spread`), as every class view words them."""
    return (
        f"Total (score + bonus, what Gradescope records): mean {total['mean']:.2f}, median "
        f"{total['median']:g}, min {total['min']:g}, max {total['max']:g}."
    )


def pass_rates(results: list[dict[str, Any]]) -> list[CheckRate]:
    """Per numbered check: how many of the results files that contain it passed it.
    Unnumbered entries (a fallback's "Autograder error") are not checks and are left out."""
    table: dict[str, list[Any]] = {}
    for data in results:
        for test in (t for t in data.get("tests", []) if t.get("number")):
            name = str(test.get("name", "")).removeprefix(f"{test['number']} ")
            entry = table.setdefault(test["number"], [name, 0, 0])
            entry[1] += test.get("status") == "passed"
            entry[2] += 1
    return [CheckRate(n, *table[n]) for n in sorted(table, key=natural_key)]


def histogram(totals: list[float], *, max_score: float, bins: int = 10) -> list[tuple]:
    """``(low, high, count)`` for ``bins`` equal bins from 0 to the top score (the last bin
    includes its upper edge), so runs with the same maximum are comparable."""
    top = max([max_score, *totals, 0.0]) or 1.0
    counts = [0] * bins
    for total in totals:
        counts[min(max(int(total * bins / top), 0), bins - 1)] += 1
    return [(i * top / bins, (i + 1) * top / bins, c) for i, c in enumerate(counts)]


def read_submitters(out_dir: Path) -> dict[str, list[Submitter]]:
    """``submitters.json`` of a batch output: each submission folder's submitters."""
    path = Path(out_dir) / "submitters.json"
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {k: [Submitter(**p) for p in v] for k, v in data.items()}


SUMMARY_MD = """# Regrade summary

{submissions} submissions: {counts_text}.

{score_text} {bonus_text}

{total_text}

![score histogram](score_histogram.png)

| check | name | passed | % |
| --- | --- | --- | --- |
"""

DIED_MD = """
## Cluster tasks that died

Run the same command again: these submissions are submitted again, the others are kept.

"""


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(text: str) -> str:
    """A text cell a spreadsheet shows as text: one starting like a formula (a student
    named ``=HYPERLINK(...)``) gets a leading apostrophe (OWASP's CSV-injection advice)."""
    return "'" + text if text.startswith(FORMULA_START) else text


def doubts_markdown(doubts: list[dict[str, Any]]) -> str:
    """summary.md's list of the timed checks decided late or never ("" when none was): a TA
    times these again on a quiet machine (``batch --regrade`` of those submissions)."""
    if not doubts:
        return ""
    lines = [
        "\n## Timed checks to time again\n",
        "Decided only in the extra rounds, or never (then judged by who made the noise):\n",
        "| submission | check | verdict | undecided | decided late |",
        "| --- | --- | --- | --- | --- |",
    ]
    for d in doubts:
        cells = [d["submission"], d["check"], "passed" if d["passed"] else "failed",
                 "; ".join(d["undecided"]), "; ".join(d["decided_late"])]  # fmt: skip
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def counts_sentence(rows: list[Row], elapsed_s: float) -> str:
    """How the class's gradings ended, and what this run added: a run over an export graded
    before keeps the earlier results and says so, rather than count them as skipped."""

    def counted(statuses: list[str]) -> str:
        found = {s: statuses.count(s) for s in STATUSES if statuses.count(s)}
        return ", ".join(f"{n} {s}" for s, n in found.items()) or "none"

    now = [r.status for r in rows if r.status != "skipped"]
    kept = [r.recorded for r in rows if r.status == "skipped"]
    if not kept:
        return f"{counted(now)} ({elapsed_s:.0f} s)"
    return (
        f"{len(kept)} kept from an earlier run ({counted(kept)}); this run: "
        f"{counted(now) if now else 'nothing more to grade'} ({elapsed_s:.0f} s)"
    )


def earlier_statuses(out_dir: Path) -> dict[str, str]:
    """Each submission's status in the ``scores.csv`` an earlier run wrote into ``out_dir``
    (empty where there is none): a kept row keeps it."""
    path = Path(out_dir) / "scores.csv"
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, csv.Error, UnicodeDecodeError):
        return {}
    return {
        str(r.get("submission_id")): str(r.get("status"))
        for r in rows
        if r.get("status") in STATUSES and r.get("status") != "skipped"
    }


def write_outputs(summary: BatchSummary) -> None:
    """``scores.csv``, ``submitters.json``, ``summary.json``, ``summary.md`` (both with the
    mistake census, as ``report.html`` has it) and ``score_histogram.png``."""
    out, rows = summary.out_dir, summary.rows
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "scores.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            ["submission_id", "names", "emails", "sids", *PARTS, "score", "bonus", "total",
             "max_score", "status"]
        )  # fmt: skip
        for r in rows:
            people = [
                safe_cell("; ".join(getattr(p, k) for p in r.submitters))
                for k in ("name", "email", "sid")
            ]
            scores = ["" if r.parts[p] is None else f"{r.parts[p]:g}" for p in PARTS]
            score = r.score
            totals = [f"{score.regular:g}", f"{score.bonus:g}", f"{score.total:g}",
                      f"{score.max_score:g}", r.recorded]  # fmt: skip
            writer.writerow([safe_cell(r.submission_id), *people, *scores, *totals])
    people = {r.submission_id: [asdict(p) for p in r.submitters] for r in rows}
    (out / "submitters.json").write_text(json.dumps(people, indent=2) + "\n")
    top = max((r.max_score for r in rows), default=0.0)
    bins = histogram([r.total for r in rows], max_score=top)
    doc = {
        "submissions": len(rows),
        "counts": summary.counts,
        "score": spread([r.score.regular for r in rows]),
        "bonus": {
            "submissions": sum(r.bonus > 0 for r in rows),
            **spread([r.bonus for r in rows if r.bonus > 0]),
        },
        "total": {k: round(v, 4) for k, v in summary.stats.items()},
        "max_score": top,
        "elapsed_s": round(summary.elapsed_s, 2),
        "histogram": [{"low": lo, "high": hi, "count": c} for lo, hi, c in bins],
        "pass_rates": [
            {**asdict(c), "percent": round(100 * c.passed / c.total, 1)} for c in summary.rates
        ],
        "census": census_records(summary.causes, len(rows)),
        "timing_doubts": summary.doubts,
        "died": summary.died,
    }
    (out / "summary.json").write_text(json.dumps(doc, indent=2) + "\n")
    counts_text = counts_sentence(rows, summary.elapsed_s)
    row = "| {number} | {name} | {passed}/{total} | {percent:.0f} |\n"
    table = "".join(
        row.format(**{**r, "name": r["name"].replace("|", "/")}) for r in doc["pass_rates"]
    )
    died = "".join(f"### {k}\n\n```\n{v}\n```\n\n" for k, v in summary.died.items())
    (out / "summary.md").write_text(
        SUMMARY_MD.format(
            counts_text=counts_text,
            score_text=score_sentence(doc["score"], top),
            bonus_text=bonus_sentence(doc["bonus"]),
            total_text=total_sentence(doc["total"]),
            **doc,
        )
        + table
        + census_markdown(summary.causes, len(rows))
        + doubts_markdown(summary.doubts)
        + (DIED_MD + died if died else "")
    )
    save_histogram(bins, out / "score_histogram.png", max_score=top)


def bonus_sentence(bonus: dict[str, float]) -> str:
    """How many submissions earned extra credit, and how much on average."""
    if not bonus["submissions"]:
        return "No submission earned extra credit."
    n = int(bonus["submissions"])
    who = "1 submission" if n == 1 else f"{n} submissions"
    return f"{who} earned extra credit ({bonus['mean']:g} bonus points on average)."


def save_histogram(bins: list[tuple], path: Path, max_score: float = 0.0) -> None:
    """The score histogram as a PNG (matplotlib, headless): whole submissions on the count
    axis, full marks drawn in, and bonus points past it shaded as such."""
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(
        [b[0] for b in bins], [b[2] for b in bins], width=bins[0][1], align="edge", edgecolor="k"
    )
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if max_score:
        ax.axvline(max_score, color="tab:red", linestyle="--", label=f"full marks ({max_score:g})")
        if bins[-1][1] > max_score:
            ax.axvspan(max_score, bins[-1][1], color="tab:green", alpha=0.15, label="bonus")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)  # beside the bars
    ax.set(xlabel="total score", ylabel="submissions", title="Regraded scores")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
