"""Development tools of the kit that are not part of the grader (lint rules)."""
