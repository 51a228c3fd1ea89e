"""The processes the CPU clock reads without a cgroup: the family below the grader and the
fork server where the grader is its workers' subreaper, else the whole machine."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from grader.runtime import process_table
from grader.runtime.process_table import children_of, family_table, machine_table

pytestmark = pytest.mark.skipif(
    not process_table.KEEPS_CHILDREN, reason="the kernel keeps no children lists"
)

#: A child that forks a grandchild, which forks a child that exits at once and is never
#: waited for (a zombie), then both wait.
TREE = (
    "import os, time\n"
    "if os.fork() == 0:\n"
    "    if os.fork() == 0:\n"
    "        os._exit(0)\n"
    "    print(os.getpid(), flush=True)\n"
    "    time.sleep(60)\n"
    "    os._exit(0)\n"
    "time.sleep(60)\n"
)


def started_tree() -> tuple[subprocess.Popen, int]:
    """:data:`TREE` running, and its grandchild's pid once that has forked its own."""
    proc = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    grandchild = int(proc.stdout.readline())
    return proc, grandchild


def test_the_family_holds_the_tree_below_its_roots_as_the_machine_table_does() -> None:
    proc, grandchild = started_tree()
    try:
        for _ in range(200):  # until the zombie has exited
            family = family_table([os.getpid()], gids=True)
            zombies = [p for p, row in family.items() if row[0] == grandchild and row[2]]
            if zombies:
                break
        machine = machine_table(gids=True)
    finally:
        proc.kill()
        proc.wait()
    assert family[proc.pid][0] == os.getpid()
    assert family[grandchild][0] == proc.pid
    assert len(zombies) == 1
    for pid in (proc.pid, grandchild, zombies[0]):
        assert family[pid] == machine[pid]
    assert os.getpid() not in family  # the roots are not their own family
    assert 1 in machine and 1 not in family  # nor is the rest of the machine


def test_children_of_a_process_that_is_gone_are_none() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert children_of(proc.pid) == []
    assert proc.pid not in family_table([os.getpid()], gids=False)


def test_without_the_family_the_whole_machine_is_read() -> None:
    table = process_table.process_table([os.getpid()], gids=False, family=False)
    assert 1 in table and os.getpid() in table


#: In a child: become the orphans' reaper (or not), start a worker whose daemon
#: (double-forked, its own session) burns 0.4 s of CPU, and print the CPU seconds the
#: snapshot charges to the worker and which table was read. ``{gid}``: the run gid.
DAEMON_SNAPSHOT = """
import os, subprocess, sys
from grader.runtime import process_table, usage
from grader.sandbox.processes import become_subreaper, kill_matching
read = []
for name in ("family_table", "machine_table"):
    real = getattr(process_table, name)
    def spy(*args, _real=real, _name=name, **kwargs):
        read.append(_name)
        return _real(*args, **kwargs)
    setattr(process_table, name, spy)
if {subreaper}:
    assert become_subreaper()
worker = '''
import os, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        t = time.process_time()
        while time.process_time() - t < 0.4: pass
        os.write(w, b'x'); time.sleep(30)
    os._exit(0)
os.wait(); os.read(r, 1)
print('done', flush=True)
time.sleep(30)
'''
gid = {gid}
proc = subprocess.Popen([sys.executable, '-c', worker], stdout=-1, text=True,
                        preexec_fn=lambda: (os.setgroups([]), os.setgid(gid)))
before = usage.cpu_snapshot(proc.pid, run_gid=gid)
assert proc.stdout.readline().strip() == 'done'
used = usage.cpu_used(before, usage.cpu_snapshot(proc.pid, run_gid=gid))
proc.kill(); proc.wait()
kill_matching(lambda p: p.info['gids'].real == gid, ['gids'])
print(used, sorted(set(read)))
"""


@pytest.mark.needs_root(reason="needs root to give the worker a group of its own")
@pytest.mark.parametrize(("subreaper", "table"), [(True, "family_table"), (False, "machine_table")])
def test_a_daemon_of_the_run_gid_is_charged_whichever_table_is_read(
    subreaper: bool, table: str
) -> None:
    from grader.sandbox.sandbox import fresh_gid

    code = DAEMON_SNAPSHOT.format(subreaper=subreaper, gid=fresh_gid())
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    used, read = out.stdout.strip().split(" ", 1)
    assert float(used) >= 0.35
    assert read == repr([table])
