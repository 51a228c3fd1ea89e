"""Text a submission makes the grader read: what its functions return and how its
exceptions are described, forged from inside the worker.

The worker cuts what it sends, but it runs beside the student's code, which can replace
its encoder and its exception description. Whatever arrives, the parent quotes a bounded
piece of it and reads it in time linear in its length: a value built of the phrases the
feedback parses ("returned ...", ", which is wrong (") held the grader 107 CPU s for
24 KB before, and 600 KB would have held it past the grading's deadline; a reply whose
header is over the protocol's limit is refused before it is parsed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.conftest import SOLUTION, run_grade

FORGER = '''

def _forge() -> None:
    """Replace the worker's encoder and exception description, as a hostile upload may."""
    import sys

    adapter, main = sys.modules["adapter_part1"], sys.modules["__main__"]
    encode = adapter.encode_value

    def forged_value(value, depth=0):
        called = sys._getframe(1).f_locals.get("name")  # the function the grader called
        if called == "param_count":  # under the reply header's limit: quoted, cut
            return {"kind": "str", "value": "a returned b, which is wrong (" * 20_000 + ")"}
        if called == "weight_bytes":  # over it: refused unread
            return {"kind": "str", "value": "w" * 2_000_000}
        return encode(value, depth)

    def forged_description(exc, submission=None):
        return {"type": "ValueError" + "E" * 10_000, "message": "m" * 500_000,
                "where": "w" * 50_000, "traceback": "  File x, line 1\\n" * 20_000}

    adapter.encode_value = forged_value
    main.describe_exception = forged_description


_forge()


def max_batch_size(spec, gpu_mem_bytes, context_len, tp=1):
    raise ValueError("checks 1.4 and 1.5 read the forged description")
'''


def test_forged_values_and_exception_descriptions_are_quoted_cut_and_read_once(
    tmp_path: Path,
) -> None:
    submission = tmp_path / "submission"
    submission.mkdir()
    shutil.copy(SOLUTION / "question1.py", submission / "question1.py")
    with (submission / "question1.py").open("a") as f:
        f.write(FORGER)
    graded = run_grade(submission, tmp_path / "out", parts=["part1"])
    checks = {t["number"]: t for t in graded.data["tests"]}
    value = checks["1.1"]
    assert (
        value["status"] == "failed"
        and "must return an int, got a str ('a returned b" in value["output"]
    )
    assert len(value["output"]) < 3000  # two values of 600 KB, each quoted in 200 characters
    refused = checks["1.2"]
    assert refused["status"] == "failed" and "message header of" in refused["output"]
    described = checks["1.4"]
    assert described["status"] == "failed" and "raised ValueError" in described["output"]
    assert "m" * 2001 not in described["output"] and "E" * 201 not in described["output"]
    assert len(described["output"]) < 8000
    assert (tmp_path / "out" / "results.json").stat().st_size < 400_000
    assert json.loads((tmp_path / "out" / "results.json").read_text())["score"] > 0
