"""A check's feedback as structure, and its rendering for each place it is read.

:mod:`grader.core.feedback` lays a check's items (:mod:`grader.core.feedback_items`) out
as blocks (a paragraph of lines, a list, a table, what the code printed, one thing to
try), each line a list of spans (``[style, text]``, style ``text``, ``strong``, ``em`` or
``code``). The blocks are plain JSON, kept in a results file beside the Markdown
(``extra_data.feedback``), so that every reader renders the same feedback for its medium
and escapes the student's text exactly once there:

* :func:`to_markdown`: Gradescope's page (``output_format: "md"``);
* :func:`to_text`: a terminal (``grade --details``, ``show``, the self-check), plain;
* :func:`to_html`: the self-check's and the class's HTML reports.

``local`` says whether the reader just ran the grading on their own machine (the
self-check, ``grade``): then the one thing to try never tells them to run what they ran.
"""

from __future__ import annotations

import html
import re
from typing import Any

#: A span: ``[style, text]``; a line: its spans; a block: a JSON object (see the module).
Span = list[str]
Line = list[Span]
Block = dict[str, Any]

#: What may stand before a line's first mark and still let it start a block, on some
#: renderer: any whitespace but a line break (spaces, tabs, the no-break space and the
#: other Unicode spaces) and the zero-width characters.
LEAD = "(?:[^\\S\\n]|[\u200b-\u200d\u2060\ufeff])*"
#: Where a line of text starts a Markdown block of its own (after :data:`LEAD`): a heading
#: (``#``), a setext underline (``===``, ``---``), a rule (``---``), a list item (``- ``,
#: ``+ ``), a ``~~~`` fence. The star, the backtick, ``|`` and ``>`` (as ``&gt;``) are
#: escaped wherever they are, and the underscore wherever it may open emphasis; ``-7.25``
#: stays as it is.
BLOCK_MARK = re.compile(rf"^({LEAD})(#|=|~(?=~)|-(?=[-\s]|$)|\+(?=\s|$))", re.M)
#: An ordered list item ("1. ", "2) "): its dot or parenthesis is escaped, never a number.
ORDERED_MARK = re.compile(rf"^({LEAD}\d{{1,9}})([.)])(?=\s|$)", re.M)
#: A run of underscores that may open emphasis: one not inside a word (after a letter or
#: a digit, CommonMark never takes them for emphasis: ``n_kv_heads`` stays as it is).
UNDERSCORES = re.compile(r"(?<!\w)_+")
#: A backslash escape of CommonMark (any ASCII punctuation), undone by :func:`unescape`.
ESCAPED = re.compile(r"\\([!-/:-@\[-`{-~])")
#: Wider than this, a terminal shows a table's rows one per line, "column value; ...".
TEXT_TABLE_WIDTH = 100


def counted(n: int, noun: str) -> str:
    """ "1 prompt", "4 prompts": a count with its noun, singular for one."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def escape(text: str) -> str:
    """``text`` safe in a Markdown paragraph or table cell: HTML and the characters that
    start links, images, code or tables are escaped, and so is whatever would make one of
    its lines a heading, a list item, a rule or a fence (text from a submission may hold
    line breaks, and each line is a line of the page); words with underscores stay as they
    are (CommonMark does not emphasise inside a word). A backslash before punctuation
    renders as the punctuation alone, so the student reads their text unchanged."""
    text = html.escape(re.sub(r"\r\n?", "\n", text), quote=False)
    text = re.sub(r"([\\`*\[\]|!])", r"\\\1", text)
    text = UNDERSCORES.sub(lambda m: "\\_" * len(m.group()), text)
    text = BLOCK_MARK.sub(r"\1\\\2", text)
    return ORDERED_MARK.sub(r"\1\\\2", text)


def unescape(text: str) -> str:
    """The text :func:`escape` was given, from what it returned (a page summary read back
    from a results file)."""
    return html.unescape(ESCAPED.sub(r"\1", text))


def fenced(text: str, info: str = "text") -> str:
    """``text`` in a code fence longer than any run of backticks inside it."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text.rstrip()}\n{fence}"


# ------------------------------------------------------------------ building blocks


def span(text: str, style: str = "text") -> Span:
    return [style, text]


def paragraph(*lines: Line) -> Block:
    """Lines shown one under the other (Markdown's hard breaks)."""
    return {"kind": "paragraph", "lines": [list(line) for line in lines]}


def plain(*texts: str) -> Block:
    """A paragraph of plain lines."""
    return paragraph(*([span(t)] for t in texts))


def bullets(items: list[Line]) -> Block:
    return {"kind": "list", "items": items}


def table(header: list[str], rows: list[list[Line]]) -> Block:
    """A table: ``rows`` of cells, each cell a line of spans."""
    return {"kind": "table", "header": header, "rows": rows}


def code(text: str) -> Block:
    """What the submission printed, shown as it is."""
    return {"kind": "code", "text": text}


def advice(what: str, part: str) -> Block:
    """The one thing to try (``what``: ``cause``, ``case``, ``check``, ``hidden`` or
    ``upload``), worded for where it is read."""
    return {"kind": "try", "what": what, "part": part}


def try_line(block: Block, *, local: bool) -> Line:
    """The spans of an :func:`advice` block ([] where, run locally, it has nothing to add)."""
    what, part = block.get("what"), str(block.get("part") or "")
    command = f"python selfcheck.py --parts {part}" if part else "python selfcheck.py"
    if what == "upload":
        rest = ("add the files named above to the folder, then run it again." if local
                else "upload the files named above and resubmit.")  # fmt: skip
        return [span("Try:", "strong"), span(f" {rest}")]
    if what == "hidden":  # only the grader has the prompts whose answers it compared
        if local:
            return []
        head = [span("Try:", "strong"), span(" make the other checks of this part pass ("),
                span(command, "code")]  # fmt: skip
        tail = (") first: the self-check times this check on prompts of its own but cannot "
                "compare their answers with the reference's, so it does not show this "
                "failure.")  # fmt: skip
        return [*head, span(tail)]
    if local:
        words = {"cause": " fix the likely cause above, then run it again.",
                 "case": " start with the first case in the table."}  # fmt: skip
        return [span("Try:", "strong"), span(words[what])] if what in words else []
    if what == "cause":
        tail = [span(" fix the likely cause above, then run "), span(command, "code")]
        return [span("Try:", "strong"), *tail, span(" again.")]
    if what == "case":
        head = [span("Try:", "strong"), span(" start with the first case in the table; ")]
        return [*head, span(command, "code"), span(" runs it locally.")]
    tail = span(" runs this check on your machine, with this message.")
    return [span("Try:", "strong"), span(" "), span(command, "code"), tail]


# ------------------------------------------------------------------ rendering


def _md_span(s: Span) -> str:
    style, text = s
    if style == "code":
        ticks = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
        pad = " " if text.startswith("`") or text.endswith("`") else ""
        return f"{ticks}{pad}{text}{pad}{ticks}"
    mark = {"strong": "**", "em": "*"}.get(style, "")
    return f"{mark}{escape(text)}{mark}"


def _md_line(line: Line) -> str:
    return "".join(_md_span(s) for s in line)


def to_markdown(blocks: list[Block]) -> str:
    """Gradescope's Markdown: every text escaped once, printed output fenced."""
    out = []
    for b in blocks:
        kind = b["kind"]
        if kind == "paragraph":
            out.append("  \n".join(_md_line(line) for line in b["lines"]))
        elif kind == "list":
            out.append("\n".join(f"- {_md_line(item)}" for item in b["items"]))
        elif kind == "table":
            rows = [[_md_line(cell).replace("\n", " ") for cell in row] for row in b["rows"]]
            lines = ["| " + " | ".join(b["header"]) + " |", "|" + "---|" * len(b["header"])]
            out.append("\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)]))
        elif kind == "code":
            out.append(fenced(b["text"]))
        elif kind == "try":
            out.append(_md_line(try_line(b, local=False)))
    return "\n\n".join(x for x in out if x)


def _text_line(line: Line) -> str:
    return "".join(text for _, text in line)


def _text_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Aligned columns, or one line per row where they would not fit."""
    widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=True)]
    one_line = not any("\n" in c for r in rows for c in r)
    if one_line and sum(widths) + 2 * len(widths) <= TEXT_TABLE_WIDTH:
        return ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                for r in (header, *rows)]  # fmt: skip
    return [
        f"  {r[0]}: " + "; ".join(f"{h} {c}" for h, c in zip(header[1:], r[1:], strict=True) if c)
        for r in rows
    ]


def to_text(blocks: list[Block], *, local: bool = False) -> str:
    """Plain text for a terminal: no Markdown marks, no escapes (the caller makes control
    characters visible), printed output indented, tables aligned."""
    out: list[str] = []
    for b in blocks:
        kind = b["kind"]
        if kind == "paragraph":
            out += [_text_line(line) for line in b["lines"]]
        elif kind == "list":
            out += [f"  - {_text_line(item)}" for item in b["items"]]
        elif kind == "table":
            rows = [[_text_line(cell) for cell in row] for row in b["rows"]]
            out += _text_table(list(b["header"]), rows)
        elif kind == "code":
            out += [f"    {x}" for x in b["text"].rstrip().splitlines()]
        elif kind == "try" and (line := try_line(b, local=local)):
            out.append(_text_line(line))
    return "\n".join(out)


def _html_line(line: Line) -> str:
    tags = {"strong": "strong", "em": "em", "code": "code"}
    parts = []
    for style, text in line:
        body = html.escape(text, quote=False)
        parts.append(f"<{tags[style]}>{body}</{tags[style]}>" if style in tags else body)
    return "".join(parts)


def to_html(blocks: list[Block], *, local: bool = False) -> str:
    """HTML for a report page: every text escaped once."""
    out = []
    for b in blocks:
        kind = b["kind"]
        if kind == "paragraph":
            out.append("<p>" + "<br>".join(_html_line(line) for line in b["lines"]) + "</p>")
        elif kind == "list":
            out.append("<ul>" + "".join(f"<li>{_html_line(i)}</li>" for i in b["items"]) + "</ul>")
        elif kind == "table":
            head = "".join(f"<th>{html.escape(h)}</th>" for h in b["header"])
            body = "".join(
                "<tr>" + "".join(f"<td>{_html_line(c)}</td>" for c in row) + "</tr>"
                for row in b["rows"]
            )
            out.append(f"<table><tr>{head}</tr>{body}</table>")
        elif kind == "code":
            out.append(f"<pre>{html.escape(b['text'].rstrip(), quote=False)}</pre>")
        elif kind == "try" and (line := try_line(b, local=local)):
            out.append(f"<p>{_html_line(line)}</p>")
    return "".join(out)
