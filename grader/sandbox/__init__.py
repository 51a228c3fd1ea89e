"""Where and as whom untrusted code runs: the sandbox folder, the worker accounts, the
private view of the files, process control and the copy of the submission."""
