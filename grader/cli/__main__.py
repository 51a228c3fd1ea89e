"""``python -m grader.cli``, as ``python -m grader``: the TA's command line."""

import sys

from grader.cli import main

sys.exit(main())
