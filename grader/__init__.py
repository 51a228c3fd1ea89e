"""Autograder and TA tooling for the KV-cache course kit (``python -m grader``)."""

#: What ``kvgrader --help`` opens with: what the tool does for a TA.
DESCRIPTION = """\
Grade the KV-cache assignment as Gradescope does, and the TA's tools around it: grade
one folder and print its score table, reprint a stored result, regenerate the test
cases from the solution, build the Gradescope and student zips, run the autograder zip
as Gradescope would, regrade a class export, merge CPU and GPU scores, and rank
similar submissions."""

EPILOG = """\
examples:
  .venv/bin/kvgrader grade path/to/folder --table --details
  .venv/bin/kvgrader show regrade/results/submission_1/results.json
  .venv/bin/kvgrader batch EXPORT_DIR --out regrade --jobs 2

Each command's options: .venv/bin/kvgrader COMMAND --help. The make targets: make help."""


def version() -> str:
    """The kit's installed version ("unknown" when it runs from a tree never installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("kv-cache-course-kit")
    except PackageNotFoundError:
        return "unknown"
