"""A lab handed in as a notebook: what the grader keeps of it, what it leaves unrun, and
how a notebook it cannot read is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grader.core.paths import ASSIGNMENT
from grader.core.registry import PARTS
from grader.sandbox import notebook as notebook_module
from grader.sandbox.layout import lay_out_part
from grader.sandbox.notebook import NotebookError, script_from_notebook
from tests.conftest import notebook_text


def notebook(*cells: str) -> str:
    """A notebook of these code cells after a Markdown cell, as a student's begins."""
    return notebook_text(*cells, markdown="# My lab")


LAB = notebook(
    "!pip install transformers\n%matplotlib inline\nimport torch\nimport functools",
    "from __future__ import annotations",
    'DEVICE = "cuda" if torch.cuda.is_available() else "cpu"\nUNUSED = torch.zeros(10**9)',
    "def load_model(device=DEVICE):\n    model = torch.nn.Linear(2, 2)\n"
    "    return model.to(device)",
    "model = load_model()\nprint(model)",
    "@functools.lru_cache\ndef size(model):\n    return sum(p.numel() for p in model.parameters())",
    "%%time\nfor L in (32, 64):\n    print(L)",
    "raise SystemExit('the experiments ran')",
)


def test_the_script_keeps_definitions_and_what_they_read_and_runs_no_experiment() -> None:
    converted = script_from_notebook(LAB, "kv_lab.ipynb")
    namespace: dict = {}
    exec(compile(converted.script, "kv_lab.py", "exec"), namespace)  # no SystemExit
    assert namespace["DEVICE"] == "cpu" and namespace["load_model"]().in_features == 2
    assert namespace["size"](namespace["load_model"]()) == 6  # its decorator kept
    assert "model" not in namespace and "UNUSED" not in namespace  # a function's own model
    assert converted.script.index("from __future__") < converted.script.index("import torch")
    assert "# --- code cell 4" in converted.script  # the cell a definition came from
    # kept: 2 imports, the future import, DEVICE, 2 functions; not run: UNUSED, model =,
    # print, raise; IPython: 2 lines and the cell magic's 3.
    assert (converted.kept, converted.not_run, converted.magics) == (6, 4, 5)
    assert converted.broken_cells == []
    assert converted.summary() == (
        "kept 6 imports, definitions and the values they read; "
        "not run: 4 other top-level statements; left out: 5 IPython lines"
    )


def test_a_statement_after_a_semicolon_on_a_kept_line_is_not_run_and_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``import os; open(...)``: the import is kept, the call that shares its line is not
    written into the script, and the page names it with its cell and line."""
    monkeypatch.chdir(tmp_path)
    converted = script_from_notebook(
        notebook("import os; open('ran', 'w').close()", "def sep():\n    return os.sep"),
        "kv_lab.ipynb",
    )
    namespace: dict = {}
    exec(compile(converted.script, "kv_lab.py", "exec"), namespace)
    assert namespace["sep"]() == "/" and not (tmp_path / "ran").exists()
    assert "open(" not in converted.script
    assert converted.shared_line == ["\"open('ran', 'w').close()\" (code cell 1, line 1)"]
    assert converted.summary() == (
        "kept 2 imports, definitions and the values they read; not run: 1 other top-level "
        "statement, among them 1 on a line with a kept statement (only whole statements are "
        "kept): \"open('ran', 'w').close()\" (code cell 1, line 1)"
    )


def test_kept_statements_are_written_as_their_exact_source_spans() -> None:
    """Columns count UTF-8 bytes (an ``é`` before a ``;``), a statement runs over lines and
    ends before a ``;``, a decorator may be written ``@ name`` or continued with a backslash; a
    ``;`` inside a function's body is the function's, and kept with it."""
    converted = script_from_notebook(
        notebook(
            'import functools\ns = "é"; t = (1,\n     2); print(s)',
            "@ functools.lru_cache\ndef f():\n    return s, t, u; x = 1\n"
            "u = (s,\n     t); print(u)\n@\\\nfunctools.cache\ndef g():\n    return 0",
        ),
        "kv_lab.ipynb",
    )
    body = converted.script.split("\n", 2)[2]
    assert body == (
        '\n# --- code cell 1\nimport functools\ns = "é"\nt = (1,\n     2)\n'
        "\n# --- code cell 2\n@ functools.lru_cache\ndef f():\n    return s, t, u; x = 1\n"
        "u = (s,\n     t)\n@\\\nfunctools.cache\ndef g():\n    return 0\n"
    )
    namespace: dict = {}
    exec(compile(converted.script, "kv_lab.py", "exec"), namespace)
    assert namespace["f"]() == ("é", (1, 2), ("é", (1, 2))) and namespace["g"]() == 0
    assert converted.shared_line == [
        "'print(s)' (code cell 1, line 3)",  # on the last line of t = (1, 2)
        "'print(u)' (code cell 2, line 5)",
    ]


def test_one_line_of_ten_thousand_imports_is_a_script_of_its_own_size() -> None:
    """Each statement is written once, as itself: written as the whole line it is on, 100 KB
    of ``import os;`` made a script of 10,000 such lines, 1 GB."""
    line = "import os;" * 10_000
    converted = script_from_notebook(notebook(line, "def f():\n    return os.sep"), "n")
    assert (converted.kept, converted.not_run, converted.shared_line) == (10_001, 0, [])
    assert converted.script.count("import os\n") == 10_000
    assert len(converted.script) < 2 * len(line)


def test_line_ends_of_any_kind_are_the_syntax_trees_lines() -> None:
    """A lone carriage return ends a line for Python: the spans are cut on the same lines."""
    converted = script_from_notebook(notebook("import os\rx = 1; y = 2\rdef f():\r  return x"), "n")
    assert converted.script.endswith("\nimport os\nx = 1\ndef f():\n  return x\n")
    assert converted.shared_line == ["'y = 2' (code cell 1, line 2)"]


def test_a_cell_that_is_not_python_is_named_and_the_rest_kept() -> None:
    deep = "x = " + "(" * 100_000 + ")" * 100_000
    converted = script_from_notebook(
        notebook("def f(:\n    pass", deep, "def g():\n    return 1"), "n"
    )
    assert converted.broken_cells == [1, 2]
    assert "def g():" in converted.script
    assert "left out as not valid Python: code cell(s) 1, 2" in converted.summary()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("not json", "not valid JSON"),
        ('{"worksheets": []}', "it has no cells"),
        ("[1, 2]", "it has no cells"),
    ],
)
def test_what_is_not_a_notebook_is_an_error_that_says_why(text: str, said: str) -> None:
    with pytest.raises(NotebookError, match=said):
        script_from_notebook(text, "kv_lab.ipynb")


def test_a_chain_of_assignments_costs_one_reading_of_each_statement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every link of a chain that a function reads at its far end is kept, and each
    statement's names are read once: a fixpoint that rescans the notebook for each link
    would read them once per link, and a hostile notebook of such chains would hold the
    grader for minutes."""
    n = 300
    chain = "\n".join(["x0 = 1", *(f"x{i} = x{i - 1} + 1" for i in range(1, n))])
    unused = "\n".join(f"y{i} = x{i}" for i in range(n))
    calls = {"assigned": 0, "loaded": 0}
    for name, key in (("_assigned_names", "assigned"), ("_loaded_names", "loaded")):
        real = getattr(notebook_module, name)

        def counted(node: object, real=real, key: str = key) -> object:
            calls[key] += 1
            return real(node)

        monkeypatch.setattr(notebook_module, name, counted)
    converted = script_from_notebook(
        notebook(chain, unused, f"def last():\n    return x{n - 1}"), "kv_lab.ipynb"
    )
    assert (converted.kept, converted.not_run) == (n + 1, n)
    namespace: dict = {}
    exec(compile(converted.script, "kv_lab.py", "exec"), namespace)
    assert namespace["last"]() == n and "y0" not in namespace
    assert calls["assigned"] == 2 * n  # once for each assignment
    assert calls["loaded"] == n + 1  # once for each statement kept


def test_a_notebook_with_more_code_than_a_lab_is_refused_before_it_is_parsed() -> None:
    """Outputs (stored plots) do not count; the code cells' source does, before any syntax
    tree is built: the grader's memory stays bounded whatever a notebook holds."""
    plot = {"output_type": "display_data", "data": {"image/png": "A" * (4 * 2**20)}}
    with_plots = json.loads(LAB)
    with_plots["cells"][-2]["outputs"] = [plot]
    assert script_from_notebook(json.dumps(with_plots), "kv_lab.ipynb").kept == 6
    line = "x = [" + "1, " * 60 + "]\n"
    big = notebook(line * (notebook_module.MAX_CODE_BYTES // len(line) + 1))
    with pytest.raises(NotebookError, match=r"hold 1\.0 MiB of Python, more than the 1 MiB"):
        script_from_notebook(big, "kv_lab.ipynb")


@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"], ids=["utf-8", "with-a-bom"])
def test_a_lab_notebook_is_graded_as_the_script_it_defines(tmp_path: Path, bom: bytes) -> None:
    (tmp_path / "labs").mkdir()
    (tmp_path / "labs" / "kv_lab.ipynb").write_bytes(bom + LAB.replace("\\n", "\\r\\n").encode())
    layout = lay_out_part(tmp_path, PARTS["part4"], ASSIGNMENT)
    assert layout.base == tmp_path / "labs" and not layout.missing
    script = (tmp_path / "labs" / "kv_lab.py").read_text()
    assert script == script_from_notebook(LAB, "kv_lab.ipynb").script
    assert layout.converted == [
        "labs/kv_lab.ipynb (as kv_lab.py: kept 6 imports, definitions and the values they "
        "read; not run: 4 other top-level statements; left out: 5 IPython lines)"
    ]


def test_a_script_beside_the_notebook_is_the_one_graded(tmp_path: Path) -> None:
    (tmp_path / "kv_lab.ipynb").write_text(LAB)
    (tmp_path / "kv_lab.py").write_text("# mine\n")
    layout = lay_out_part(tmp_path, PARTS["part4"], ASSIGNMENT)
    assert layout.converted == [] and (tmp_path / "kv_lab.py").read_text() == "# mine\n"


def test_only_the_lab_takes_a_notebook(tmp_path: Path) -> None:
    (tmp_path / "question1.ipynb").write_text(notebook("def f():\n    return 1"))
    layout = lay_out_part(tmp_path, PARTS["part1"], ASSIGNMENT)
    assert layout.missing == ["question1.py"] and not (tmp_path / "question1.py").exists()
    assert "Upload question1.py" in layout.missing_message(PARTS["part1"])


def test_an_unreadable_notebook_is_named_with_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "kv_lab.ipynb").write_text("{ cut short")
    part = PARTS["part4"]
    layout = lay_out_part(tmp_path, part, ASSIGNMENT)
    assert layout.base is None and layout.missing == ["kv_lab.py"]
    message = layout.missing_message(part)
    assert message.startswith("kv_lab.ipynb could not be read as a notebook: it is not a")
    assert "part4 was not graded. Upload kv_lab.py, or the notebook saved again" in message


def test_a_notebook_file_past_the_size_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file's size decides before its text is read: an upload of gigabytes never
    enters the grader's memory."""
    path = tmp_path / "kv_lab.ipynb"
    with path.open("wb") as f:  # sparse: the size without the bytes
        f.truncate(notebook_module.MAX_NOTEBOOK_BYTES + 1)
    read = []
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: read.append(self) or "")
    layout = lay_out_part(tmp_path, PARTS["part4"], ASSIGNMENT)
    assert layout.base is None and read == []
    assert layout.missing_message(PARTS["part4"]).startswith(
        "kv_lab.ipynb could not be read as a notebook: it is larger than 20 MiB"
    )


def test_a_folder_named_like_the_script_beside_a_notebook_is_named(tmp_path: Path) -> None:
    (tmp_path / "kv_lab.ipynb").write_text(LAB)
    (tmp_path / "kv_lab.py").mkdir()
    layout = lay_out_part(tmp_path, PARTS["part4"], ASSIGNMENT)
    assert layout.base is None
    assert layout.missing_message(PARTS["part4"]).startswith(
        "kv_lab.ipynb could not be graded as kv_lab.py: Is a directory, so part4 was not graded"
    )
