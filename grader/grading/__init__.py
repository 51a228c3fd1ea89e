"""The Gradescope path: grading one submission (``runner``) and the Gradescope tree around
it (``autograder``). Everything a grading imports is at this layer or below, so the
autograder zip is this package's import closure (``grader.ta.dist``)."""
