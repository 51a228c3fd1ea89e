"""How long ``python -m grader similarity`` takes on a class-sized export.

    python benchmarks/similarity_scale.py [--submissions 200]

Builds an export as ``tests/ta/test_similarity.py`` does (an original, a verbatim and a
disguised copy, the untouched skeleton, the rest independent submissions: standard-library
modules, repeated past the pool's length) and times the whole command: staging, copydetect's
pairwise comparison of every file with the file of the same name in every other submission,
and its highlighted HTML report. Prints the time and the top of the ranking.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grader.ta import similarity  # noqa: E402
from tests.ta.similarity_factory import build_similarity_export  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submissions", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        export = Path(tmp) / "export"
        roles = build_similarity_export(export, independent=args.submissions - 4)
        started = time.monotonic()
        pairs = similarity.main(export_dir=export, out_dir=Path(tmp) / "out")
        elapsed = time.monotonic() - started
    print(f"{args.submissions} submissions, {len(pairs)} pairs ranked in {elapsed:.1f} s")
    for p in pairs[:4]:
        print(f"  {p.score:.3f}  {p.first} ({roles[p.first]}) ~ {p.second} ({roles[p.second]})")


if __name__ == "__main__":
    main()
