"""What a grading shows in a terminal (``make grade``, ``--table``, ``show``): the score
table and each failed check's feedback as plain text."""

from __future__ import annotations

import re
import textwrap

from grader.core.feedback import check_text, page_text
from grader.core.results import GradingResults
from grader.core.score import is_bonus, part_scores, score_of

#: Control characters a terminal acts on (C0 but newline and tab, DEL, C1): a student's
#: output could clear the screen, draw a forged table or write the clipboard (OSC 52).
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    """``text`` with every control character shown as its escape (``\\x1b``), not obeyed."""
    return CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def score_table(results: GradingResults, *, width: int = 110) -> str:
    """One line per check, grouped by part, with part totals and the overall score (the
    bonus apart: :mod:`grader.core.score`)."""
    lines = []
    parts = part_scores(results.tests)
    for part, score in parts.items():
        lines.append(f"{part}  {score.text()}")
        for t in (t for t in results.tests if t.part == part):
            mark = "PASS" if t.status == "passed" else "FAIL"
            points = f"{t.score:>6g} bonus" if is_bonus(t) else f"{t.score:>6g} / {t.max_score:<4g}"
            # A long title wraps under itself: never cut (the points stay on its first line).
            name, *rest = textwrap.wrap(t.name, width - 22) or [""]
            lines.append(f"  {mark}  {name:<{width - 22}} {points}")
            lines += [f"        {more}" for more in rest]
    lines.append(f"TOTAL  {score_of(results.tests).text()}")
    return "\n".join(lines)


def failure_details(results: GradingResults, *, local: bool = False) -> str:
    """The feedback of every failed check as plain text (safe for a terminal); ``local``:
    the reader just ran this grading (``grade``, the self-check), not a stored one."""
    blocks = []
    for t in results.tests:
        if t.status == "failed":
            text = check_text(t, results.extra_data, local=local)
            blocks.append(f"[{t.number}] {t.name.removeprefix(f'{t.number} ')}\n{text}")
    return terminal_safe("\n\n".join(blocks))


def terminal_report(results: GradingResults, *, details: bool, local: bool = False) -> str:
    """What a grading shows in a terminal: the page's notes (files supplied, moved or
    missing, how the benchmarks were judged), the score table (the run's own output where
    it holds no check) and, with ``details``, the failed checks' feedback after a blank
    line."""
    given = results.extra_data.get("notes")
    notes = [str(n) for n in given] if isinstance(given, list) else []
    if results.tests:
        text = score_table(results)
        text = terminal_safe("\n".join([*notes, "", text])) if notes else text
    else:
        text = terminal_safe(page_text(results.output, results.output_format))
    feedback = failure_details(results, local=local) if details else ""
    return f"{text}\n\n{feedback}" if feedback else text
