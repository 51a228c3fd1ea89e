"""The parent's side of the pipe to a worker: starting it, sending requests, turning its
failures into messages for students, and timing requests from the trusted side."""
