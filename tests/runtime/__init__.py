"""The parent's side of the pipe: timing."""
