"""The untrusted side of the grader.

These files are copied into each sandbox and run as a script
(``python worker/main.py``) by an unprivileged process that imports the
student's code. The trusted parent only imports :mod:`grader.worker.protocol`.
"""
