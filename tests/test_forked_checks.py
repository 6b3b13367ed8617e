"""An unchanged scan's stat checks shared out to forked children (envvault/vault/forked.py): the answers are
the serial ones whatever the children do (fail, get killed), nothing is left running, no fork happens in a
threaded process or on little work, and an in-place edit in a child's task is still seen by ``status``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from envvault.vault import forked
from fixtures import catalogue as C
from tests.evtools import alive, ev_env, ev_json
from fixtures import uv_install

ROOT = Path(__file__).resolve().parent.parent



# Whether this process may fork depends on what ran in it before (a test that hashed with BLAKE3's thread pool
# leaves native threads behind): each check runs in a fresh interpreter, as the command does.
_PRELUDE = """
import atexit, json, os, signal, sys, tempfile, threading, time
from envvault.vault import forked
parent = os.getpid()
forks = []
real_fork = os.fork
os.fork = lambda: forks.append(1) or real_fork()
os.sched_getaffinity = lambda pid: {0, 1, 2, 3}  # four cores, whatever the machine running the tests has

_log = tempfile.mktemp()  # a byte for each answer a child logs (``note``)
_log_fd = os.open(_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
atexit.register(os.unlink, _log)


def note(mark=b"a"):
    os.write(_log_fd, mark)


def noted():
    with open(_log, "rb") as f:
        return f.read()


def hold(n=1):
    # Wait (20 s at most) until the children have logged n answers: this process takes the tasks left when
    # it has forked them all, and on a busy machine it could take every one before a child runs.
    deadline = time.monotonic() + 20
    while os.path.getsize(_log) < n and time.monotonic() < deadline:
        time.sleep(0.002)


def childs(i):
    # True when a child answers (it logs it); False here, once a child has answered
    if os.getpid() == parent:
        hold()
        return False
    note()
    return True


def cli_here(args):
    # ``envvault ARGS --json`` in this process: (exit code, the JSON it printed)
    import contextlib, io
    from envvault.cli import main
    out, code = io.StringIO(), 0
    try:
        with contextlib.redirect_stdout(out):
            main(list(args) + ["--json"])
    except SystemExit as done:
        code = done.code
    return code, json.loads(out.getvalue() or "null")


def into_here(sid, new):
    # ``envvault restore SID --into NEW --json`` in this process: (exit code, the JSON it printed)
    return cli_here(["restore", sid, "--into", str(new)])


def no_children_left():
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return True
    return False
"""


def _fresh(code: str) -> dict:
    """Run ``_PRELUDE`` + ``code`` in a new interpreter; the JSON object it prints last."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", _PRELUDE + textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_children_answer_the_tasks_they_take():
    got = _fresh("""
        answers = forked.check_all(childs, list(range(40)), [1000] * 40)  # 40,000: forks
        print(json.dumps({"answers": answers, "forks": len(forks), "left": not no_children_left()}))
    """)
    assert got["forks"] >= 1 and not got["left"]
    assert True in got["answers"]  # a child's


def test_done_tells_each_answer_once_whoever_answers_and_large_answers_never_stall():
    """``done``: every item's position, once, as it is answered here or in a child (a progress bar); answers
    larger than a pipe holds (1.1 MB from each child) are read as they come, not one child after another."""
    got = _fresh("""
        seen = []

        def answer(i):
            return (str(os.getpid()) + ",").encode() * (100_000 if i % 2 else 1)

        answers = forked.map_all(answer, list(range(40)), [1000] * 40, processes=4, done=seen.append)
        whose = [a.split(b",")[0].decode() for a in answers]
        print(json.dumps({"seen": seen, "processes": len(set(whose)), "whole": all(
            a == (w + ",").encode() * (100_000 if i % 2 else 1) for i, (a, w) in enumerate(zip(answers, whose))),
            "forks": len(forks), "left": not no_children_left()}))
    """)
    assert got["forks"] == 3 and not got["left"] and got["whole"]
    assert sorted(got["seen"]) == list(range(40)) and got["processes"] >= 2


def test_a_done_that_raises_still_ends_every_child():
    """``done`` raising (a progress bar's error) propagates, and every child is ended and reaped first: none
    goes on working for a caller that has given up (a second read found the children left running)."""
    got = _fresh("""
        calls = []

        def told(i):
            calls.append(i)
            if len(calls) >= 2:  # from the second on, as a broken bar would, while the children answer on
                time.sleep(0.1)
                raise KeyError("bar")

        def answer(i):
            time.sleep(0.02)
            note()
            return b"x"

        try:
            forked.map_all(answer, list(range(60)), [1000] * 60, processes=4, done=told)
            error = None
        except KeyError as e:
            error = str(e)
        time.sleep(0.3)
        settled = len(noted())
        time.sleep(0.5)
        print(json.dumps({"error": error, "forks": len(forks), "left": not no_children_left(),
                          "grew": len(noted()) - settled}))
    """)
    assert got["error"] == "'bar'" and got["forks"] == 3
    assert not got["left"] and got["grew"] == 0


def test_an_item_a_child_fails_on_stops_the_others_and_is_raised_here_first():
    """A child whose function raises takes every task left, so no process starts another, and names the item:
    this process computes it first and raises its error, instead of redoing every other item first (a second
    read found 16,620 files written before a lying object's error; with threads, 14)."""
    got = _fresh("""
        def answer(i):
            if i == 7:  # the heaviest: the first task taken
                raise ValueError("lying object" if os.getpid() != parent else "lying object, here")
            note()
            time.sleep(0.05)
            return b"x"

        try:
            forked.map_all(answer, list(range(300)), [1000] * 7 + [2000] + [1000] * 292, processes=4,
                           here=False)  # children only: item 7 fails in one of them
            error = None
        except ValueError as e:
            error = str(e)
        print(json.dumps({"error": error, "calls": noted().count(b"a"), "left": not no_children_left()}))
    """)
    assert got["error"].startswith("lying object") and not got["left"]
    # of 299 others (before: every one, then the failed child's again): each process ends the item it holds
    # and takes no other; 100 would need the failing child held back for 1.7 s
    assert got["calls"] < 100, got


def test_children_keep_an_ignored_signal_ignored():
    """A signal the process ignores (``nohup``: SIGHUP) stays ignored in its children: a hang-up must not end
    them while the process goes on without them."""
    got = _fresh("""
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

        def answer(i):
            return b"\\x01" if (signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
                               and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL) else b"\\x00"

        answers = forked.map_all(answer, list(range(40)), [1000] * 40, processes=4)
        print(json.dumps({"ok": answers == [b"\\x01"] * 40, "forks": len(forks), "left": not no_children_left()}))
    """)
    assert got["ok"] and got["forks"] == 3 and not got["left"]


def test_children_carry_on_past_a_hang_up_as_the_command_does():
    """The command carries on past a hang-up (``terminate.hung_up``): so do its children, each sent SIGHUP as a
    shell sends its job's process group, keeping that handler while SIGTERM still ends a child. Before, SIGHUP's
    default ended each child at its first task, and the parent answered every one."""
    got = _fresh("""
        from envvault import terminate
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a shell's job has it, whatever the tests run under
        terminate.install()

        waited = []

        def answer(i):
            if os.getpid() == parent:
                if not waited:
                    hold()  # until a child has answered (20 s at most)
                    waited.append(1)
                return b"\\x02"
            os.kill(os.getpid(), signal.SIGHUP)
            note()
            return b"\\x01" if (signal.getsignal(signal.SIGHUP) is terminate.hung_up
                               and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL) else b"\\x00"

        answers = forked.map_all(answer, list(range(40)), [1000] * 40, processes=4)
        print(json.dumps({"answers": [a[0] for a in answers], "forks": len(forks), "left": not no_children_left()}))
    """)
    assert 1 in got["answers"] and set(got["answers"]) <= {1, 2}, got
    assert got["forks"] == 3 and not got["left"]


@pytest.mark.parametrize("bound", [False, True])
def test_children_stop_when_their_parent_is_killed(tmp_path, bound):
    """The parent killed (SIGKILL: no handler runs) while its children work: each child stops before its next
    task (``bound``: the kernel kills it at once) instead of writing on into a tree nobody finishes (a second read saw a half-built venv grow from 904 to
    6,304 entries after the restore had died)."""
    log = tmp_path / "log"
    code = _PRELUDE + textwrap.dedent(f"""
        out = os.open({str(log)!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

        def answer(i):
            os.write(out, f"{{os.getpid()}}\\n".encode())
            time.sleep(0.05)
            return b"x"

        forked.map_all(answer, list(range(400)), [1000] * 400, processes=4, bound={bound})
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        deadline = time.monotonic() + 60
        while (not log.exists() or len(set(log.read_text().split())) < 4) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        proc.kill()
        at_kill = len(log.read_text().split()) if log.exists() else 0
        proc.wait()
    children = {int(p) for p in log.read_text().split()} - {proc.pid}
    assert len(children) == 3, children
    deadline = time.monotonic() + 10
    while any(alive(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not [p for p in children if alive(p)]
    after = len(log.read_text().split()) - at_kill
    assert after <= 2 * len(children), after  # each child ended the task it held, at most, and took no other


def test_a_slow_task_does_not_hold_back_the_others():
    """The items are taken one task at a time: while one process is held in its task (item 0, the heaviest,
    taken first), the others answer every other item. With slices fixed up front its process would answer a
    quarter of them after it (checked: it waits 20 s for the rest, then answers its own)."""
    got = _fresh("""
        def answer(i):
            if i == 0:  # held until every other item is answered (by the others), 20 s at most
                hold(39)
            else:
                note()
            return str(os.getpid()).encode()

        answers = forked.map_all(answer, list(range(40)), [2000] + [1000] * 39)
        print(json.dumps({"held": answers.count(answers[0]), "processes": len(set(answers)), "forks": len(forks),
                          "left": not no_children_left()}))
    """)
    assert got["forks"] == 3 and not got["left"]
    assert got["held"] == 1 and got["processes"] >= 2


def test_answers_are_the_serial_ones():
    got = _fresh("""
        check = lambda i: (i * 7919) % 3 == 0
        items = list(range(997))
        answers = forked.check_all(check, items, [50] * len(items))
        print(json.dumps({"same": answers == [check(i) for i in items], "forks": len(forks),
                          "left": not no_children_left()}))
    """)
    assert got == {"same": True, "forks": got["forks"], "left": False} and got["forks"] >= 1


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_a_child_that_fails_or_is_killed_is_checked_here(how):
    got = _fresh(f"""
        def check(i):
            if os.getpid() != parent:
                if {how!r} == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise RuntimeError("child broke")
            return i % 2 == 0

        answers = forked.check_all(check, list(range(30)), [1000] * 30)
        print(json.dumps({{"same": answers == [i % 2 == 0 for i in range(30)], "forks": len(forks),
                          "left": not no_children_left()}}))
    """)
    assert got["same"] and got["forks"] >= 1 and not got["left"]


@pytest.mark.parametrize("when", ["waiting", "killing", "forking"])
def test_a_ctrl_c_while_children_are_ended_or_made_leaves_none_running_and_no_pipe_open(when):
    """Ctrl-C in this process's task ends the children; another Ctrl-C while the first of them is waited for
    or while they are sent SIGKILL, or a Ctrl-C while one is forked (held back until it is on the list), still
    leaves every child ended (killed before any wait, perhaps not yet reaped) and no pipe of theirs open here.
    The code before left children asleep (waiting) and pipes open (killing, forking), checked."""
    got = _fresh(f"""
        import time

        signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C raises here, however this was started
        pids = []
        forking, real_kill, real_waitpid = os.fork, os.kill, os.waitpid

        def fork_and_note():
            pid = forking()
            if pid:
                pids.append(pid)
                if {when!r} == "forking" and len(pids) == 2:
                    real_kill(os.getpid(), signal.SIGINT)  # held back until the child is on the list
            return pid

        def kill_and_interrupt(pid, sig):
            real_kill(pid, sig)
            if {when!r} == "killing" and sig == signal.SIGKILL and pid == pids[0]:
                real_kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C, while the children are killed

        waits = []

        def waitpid(pid, options):
            if {when!r} == "waiting" and not waits:
                real_kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C, as the first child is waited for
            waits.append(pid)
            return real_waitpid(pid, options)

        os.fork, os.kill, os.waitpid = fork_and_note, kill_and_interrupt, waitpid

        def pipes():
            out = set()
            for fd in os.listdir("/proc/self/fd"):
                try:
                    if os.readlink(f"/proc/self/fd/{{fd}}").startswith("pipe:"):
                        out.add(fd)
                except OSError:
                    pass
            return out

        def answer(i):
            if os.getpid() == parent:
                raise KeyboardInterrupt  # the first Ctrl-C, in this process's task
            time.sleep(60)
            return b"x"

        before = pipes()
        interrupted = False
        try:
            forked.map_all(answer, list(range(40)), [1000] * 40)
        except KeyboardInterrupt:
            interrupted = True
        os.kill, os.waitpid = real_kill, real_waitpid
        left = sorted(pipes() - before)

        def state(pid):
            try:
                with open(f"/proc/{{pid}}/stat") as f:
                    return f.read().rpartition(")")[2].split()[0]
            except FileNotFoundError:
                return "gone"

        deadline = time.monotonic() + 10  # a killed process is a zombie (or reaped) a moment after SIGKILL
        while any(state(p) not in ("Z", "X", "gone") for p in pids) and time.monotonic() < deadline:
            time.sleep(0.01)
        states = [state(p) for p in pids]
        for p in pids:  # tidy up whatever the code under test left
            try:
                os.kill(p, signal.SIGKILL)
                os.waitpid(p, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        print(json.dumps({{"interrupted": interrupted, "children": len(pids), "left": left, "states": states}}))
    """)
    assert got["interrupted"] and got["children"] >= 2
    assert got["left"] == [], got  # no pipe of a child's left open here
    assert all(s in ("Z", "X", "gone") for s in got["states"]), got["states"]  # none still running or asleep


def test_childrens_stages_are_added_to_this_processs():
    """ENVVAULT_STAGES: each child's stage seconds come back after its answers, named "forked children: ...";
    what a child inherited from this process is not counted twice, and the answers are unchanged."""
    got = _fresh("""
        from envvault.vault import timing

        timing.ON = True
        timing.add("before the fork", timing.clock())  # this process's, inherited by every child

        def answer(i):
            if os.getpid() == parent:
                hold()
            else:
                note()
            t0 = timing.clock()
            out = str(i * i).encode()
            timing.add("answer", t0)
            return out

        answers = forked.map_all(answer, list(range(40)), [1000] * 40)
        totals = {k: v[1] for k, v in timing._totals.items()}
        print(json.dumps({"same": answers == [str(i * i).encode() for i in range(40)], "forks": len(forks),
                          "totals": totals}))
    """)
    assert got["same"] and got["forks"] == 3
    totals = got["totals"]
    assert totals.pop("before the fork") == 1 and totals["forked children: answer"] >= 1
    assert sum(totals.values()) == 40 and set(totals) <= {"answer", "forked children: answer"}


def test_a_malformed_stages_frame_is_ignored(monkeypatch):
    """``timing.merge`` takes a child's stages as a measurement: bytes that are not its ``encoded`` form change
    nothing and never raise; a good frame is added under its prefix."""
    from envvault.vault import timing

    monkeypatch.setattr(timing, "_totals", {"mine": [1.0, 1]})
    for bad in (b"", b"not json", b"[1, 2]", b'{"a": 1}', b'{"a": ["x", 1]}', b'{"a": [1.0]}', b"\xff\xfe"):
        timing.merge(bad, "forked children: ")
    assert timing._totals == {"mine": [1.0, 1]}
    timing.merge(b'{"mine": [0.5, 2]}', "forked children: ")
    assert timing._totals == {"mine": [1.0, 1], "forked children: mine": [0.5, 2]}


def test_no_fork_with_another_thread_or_little_work():
    got = _fresh("""
        # alone first: a joined thread may still be listed by /proc for a moment (no fork then: safe)
        alone = forked.check_all(childs, list(range(40)), [1000] * 40)
        small = forked.check_all(lambda i: os.getpid() != parent, list(range(10)), [10] * 10)
        stop = threading.Event()
        t = threading.Thread(target=stop.wait, daemon=True)
        t.start()
        threaded = forked.check_all(lambda i: os.getpid() != parent, list(range(40)), [1000] * 40)
        stop.set()
        t.join()
        print(json.dumps({"threaded": any(threaded), "small": any(small), "alone": any(alone)}))
    """)
    assert got == {"threaded": False, "small": False, "alone": True}  # the last one shows forking was possible


def test_no_fork_with_a_native_thread():
    """zstd's worker threads are not Python threads: ``threading`` does not see them, the process does."""
    got = _fresh("""
        import zstandard

        cctx = zstandard.ZstdCompressor(level=1, threads=2)
        cctx.compress(os.urandom(4 << 20))
        native = len(os.listdir("/proc/self/task")) > 1 and threading.active_count() == 1
        answers = forked.check_all(lambda i: os.getpid() != parent, list(range(40)), [1000] * 40)
        print(json.dumps({"native": native, "forked": any(answers) or bool(forks)}))
    """)
    assert got == {"native": True, "forked": False}


def test_tasks_cover_every_item_once_heaviest_first():
    for weights in ([5] * 17, [100, 1, 1, 1, 1, 1, 1, 100], [1], [3, 9000, 2, 2], list(range(3000)),
                    [7] * (forked._MAX_TASKS + 1)):
        tasks = forked._tasks(weights)
        assert sorted(i for t in tasks for i in t) == list(range(len(weights)))
        assert 1 <= len(tasks) <= forked._MAX_TASKS
        assert weights[tasks[0][0]] == max(weights)
        flat = [weights[i] for t in tasks for i in t]
        assert flat == sorted(weights, reverse=True)


def test_no_pipe_for_the_tasks_answers_here():
    got = _fresh("""
        real_pipe = os.pipe

        def no_pipe():
            raise OSError(24, "Too many open files")

        os.pipe = no_pipe
        answers = forked.map_all(lambda i: str(os.getpid()).encode(), list(range(40)), [1000] * 40)
        os.pipe = real_pipe
        print(json.dumps({"here": answers == [str(parent).encode()] * 40, "forks": len(forks)}))
    """)
    assert got == {"here": True, "forks": 0}


def test_status_sees_an_edit_in_a_childs_task(tmp_path, make_venv, wheelhouse):
    """Status, in a fresh interpreter with forking forced on and every distribution checked in parts of 2
    files: the last stored file of each distribution, edited in place (same size), makes that one distribution
    changed, whichever process checked its part; unchanged, nothing is."""
    venv = _three_snapped(tmp_path, make_venv, wheelhouse)
    got = _fresh(f"""
        from pathlib import Path
        from envvault.snap import fresh
        from envvault.snap.scan import scan_current, statcache_for
        from envvault.vault.statcache import group_paths
        from envvault.vault.store import Vault

        forked.FORK_MIN_WEIGHT = forked._WEIGHT_A_CHILD = 1
        fresh._PART_FILES = 2
        vault, venv = Vault.open({str(tmp_path / "v")!r}), Path({str(venv)!r})
        first = scan_current(vault, venv, facts=False)
        out = {{"forked": len(forks), "again": scan_current(vault, venv, facts=False)["packages"] == first["packages"]}}
        groups = statcache_for(vault, venv).groups
        lasts = [group_paths(g)[-1] for g in groups.values() if len(group_paths(g)) > 2]
        out["lasts"] = len(lasts)
        before, out["changed"] = first, []
        for rel in lasts:
            target = venv / rel
            data = target.read_bytes()
            target.write_bytes(data[:-1] + (b"#" if data[-1:] != b"#" else b"!"))
            after = scan_current(vault, venv, facts=False)
            out["changed"].append([a["name"] for a, b in zip(before["packages"], after["packages"])
                                   if a["manifest"] != b["manifest"]])
            before = after
        out["left"] = not no_children_left()
        print(json.dumps(out))
    """)
    assert got["forked"] and got["again"] and not got["left"]
    assert got["lasts"] >= 2  # more than one part each
    assert all(len(names) == 1 for names in got["changed"]) and len(got["changed"]) == got["lasts"]


@pytest.mark.parametrize("how", ["none", "raise", "kill", "short"])
def test_map_all_answers_are_the_serial_ones_whatever_a_child_does(how):
    """``map_all``: answers of any length (empty ones too) come back in order; a child that raises or is killed
    in its first task, or sends its answers cut short, leaves what it did not answer to this process, which
    answers it with the same function. (This process's first answer waits until the children have answered
    or failed some, so they take tasks however the machine schedules them.)"""
    got = _fresh(f"""
        here = []  # the items this process answered

        def expected(i):
            return b"" if i % 11 == 0 else b"x" * (i % 5) + str(i).encode()

        def answer(i):
            if os.getpid() == parent:
                if not here:
                    hold(1 if {how!r} in ("raise", "kill") else 10)
                here.append(i)
            elif {how!r} in ("raise", "kill"):  # every child fails in its first task
                note(b"f")
                if {how!r} == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise RuntimeError("child broke")
            else:
                note()
            return expected(i)

        items = list(range(60))
        if {how!r} == "short":  # every child writes the first half of its answers' bytes, then ends
            real_write = os.write

            def half(fd, data):
                if os.getpid() == parent or len(data) == 1:
                    return real_write(fd, data)
                real_write(fd, bytes(data)[:len(data) // 2])
                os._exit(0)

            os.write = half
        answers = forked.map_all(answer, items, [1000] * len(items))
        if {how!r} == "short":
            os.write = real_write
        answered_here = sorted(here)
        print(json.dumps({{"same": answers == [expected(i) for i in items], "forks": len(forks),
                          "here": answered_here, "failed": noted().count(b"f"), "left": not no_children_left()}}))
    """)
    assert got["same"] and got["forks"] == 3 and not got["left"]
    if how in ("raise", "kill"):
        assert got["failed"] >= 1 and got["here"] == list(range(60))  # the failed children's tasks, answered here
    else:
        assert got["failed"] == 0 and len(got["here"]) < 60  # the children's answers (whole ones) were used
    if how == "short":
        assert got["here"]  # what the children cut short was answered here


def _three_snapped(tmp_path, make_venv, wheelhouse):
    """A uv venv of three fixture distributions, snapped into the vault ``tmp_path/v``."""
    from envvault.snap import take_snapshot
    from envvault.vault.store import Vault

    venv = make_venv("uv")
    uv_install(venv, *(str(wheelhouse[k]) for k in (C.SMALL_01, C.NS_ALPHA, C.WITH_HEADERS)))
    take_snapshot(Vault.open(tmp_path / "v", create=True), venv, argv=["test"])
    return venv


def test_a_check_scan_without_groups_is_built_in_children_as_here(tmp_path, make_venv, wheelhouse):
    """A check scan with file entries but no distribution groups (a venv ``restore --into`` just wrote) reads
    and builds every distribution in forked children: its packages, warnings and the stat cache it saves (the
    groups, the entry of a file edited in place that a child read, the entries the scan used) are those of the
    same scan in one process, and so is the error when a child's distribution has lost its RECORD."""
    venv = _three_snapped(tmp_path, make_venv, wheelhouse)
    got = _fresh(f"""
        from pathlib import Path
        from envvault.snap.scan import scan_current, statcache_for
        from envvault.vault.store import Vault

        vault, venv = Vault.open({str(tmp_path / "v")!r}), Path({str(venv)!r})
        from envvault.vault.statcache import group_paths

        cache = statcache_for(vault, venv)
        largest = max(cache.groups.values(), key=lambda g: len(group_paths(g)))  # the first task: a child's
        edited = sorted(p for p in group_paths(largest) if p.endswith(".py"))[0]
        data = (venv / edited).read_bytes()
        (venv / edited).write_bytes(data[:-1] + (b"#" if data[-1:] != b"#" else b"!"))
        saved = cache.files_path.read_bytes()
        largest_key = max(cache.groups, key=lambda k: len(group_paths(cache.groups[k])))

        from envvault.env.venv import VenvReader

        real_read, read_here = VenvReader.read, []

        forking = [False]

        def counted_read(self, *args):
            if os.getpid() == parent:
                if forking[0]:
                    hold()
                read_here.append(args[0])
            else:
                note()
            return real_read(self, *args)

        VenvReader.read = counted_read

        def run(fork):
            read_here.clear()
            cache.groups_path.unlink(missing_ok=True)
            cache.files_path.write_bytes(saved)
            forked.FORK_MIN_WEIGHT = forked._WEIGHT_A_CHILD = 1 if fork else 10 ** 9
            forking[0] = fork
            n = len(forks)
            used = statcache_for(vault, venv)  # a restore's way: its own cache, saved by the caller
            got = scan_current(vault, venv, facts=False, cache=used, save_cache=False)
            used._expand_touched()
            touched = sorted(used.touched)  # the entries a save keeps
            used.touch(list(used.files))
            used.save()
            after = statcache_for(vault, venv)
            return {{"packages": got["packages"], "warnings": got["warnings"], "groups": after.groups,
                    "files": after.files, "edited": after.files.get(edited), "touched": touched,
                    "forks": len(forks) - n, "read_here": len(read_here)}}

        def failed(fork):
            try:
                run(fork)
            except Exception as err:
                return f"{{type(err).__name__}}: {{err}}"

        record = venv / largest_key / "RECORD"
        kept = record.read_bytes()
        record.unlink()  # an error in a child's distribution: raised here, as by one process
        errors = [failed(True), failed(False)]
        record.write_bytes(kept)
        a, b = run(True), run(False)
        out = {{"forks": [a.pop("forks"), b.pop("forks")], "read_here": [a.pop("read_here"), b.pop("read_here")],
               "same": a == b, "edited_known": a["edited"] is not None,
               "was_known": json.loads(__import__("zstandard").ZstdDecompressor().decompress(saved))["files"].get(edited),
               "modified": [p["name"] for p in a["packages"] if p["modified"]], "groups": len(a["groups"]),
               "errors": errors, "touched": len(a["touched"]),
               "left": not no_children_left()}}
        print(json.dumps(out))
    """)
    assert got["forks"][0] >= 1 and got["forks"][1] == 0 and not got["left"]
    assert got["read_here"][1] == 3 and got["read_here"][0] < 3  # children read and built some distributions
    assert got["same"] and got["groups"] == 3 and got["touched"] > 3
    assert got["edited_known"] and got["modified"] and len(got["modified"]) == 1
    assert got["errors"][0] == got["errors"][1] and "RECORD is missing" in got["errors"][0]


def _written_by_children(vault: Path, args, writers: str = "3", fork_bytes: int | None = None) -> dict:
    """``envvault ARGS --json`` in a fresh interpreter with ``ENVVAULT_WRITE_PROCESSES=writers`` (and the
    materializer's fork threshold ``fork_bytes``): its exit code, JSON, forks, whether a child is left, and how
    many files forked children wrote (``by_children``)."""
    return _fresh(f"""
        os.environ["ENVVAULT_HOME"] = {str(vault)!r}
        os.environ["ENVVAULT_WRITE_PROCESSES"] = {writers!r}
        os.environ.pop("VIRTUAL_ENV", None)
        from envvault import materialize
        if {fork_bytes!r} is not None:
            materialize._FORK_BYTES = {fork_bytes!r}
        one = materialize._stage_one

        def marked(*a, **kw):  # a byte logged for each file a child writes
            if os.getpid() != parent:
                note(b"w")
            return one(*a, **kw)

        materialize._stage_one = marked
        code, result = cli_here({[str(a) for a in args]!r})
        print(json.dumps({{"code": code, "result": result, "forks": len(forks),
                          "left": not no_children_left(), "by_children": noted().count(b"w")}}))
    """)


@pytest.mark.parametrize("writers", ["1", "3"])
def test_into_of_a_real_torch_venv_is_verified_in_children(tmp_path, torch_venv, writers):
    """``restore --into`` of a venv made by ``python -m venv`` and pip with real torch 2.13.0+cpu and numpy
    (about 16,000 files), its files written by the threads of one process or (``ENVVAULT_WRITE_PROCESSES=3``)
    by forked children too, which make the folders they need as they reach them: the verification reads and
    builds the distributions in forked children, the new venv is verified and imports torch, and ``status``
    then finds it unchanged."""
    from evtools import ev, ev_json

    vault = tmp_path / "v"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", torch_venv)["id"]
    new = tmp_path / "new"
    got = _written_by_children(vault, ["restore", sid, "--into", new], writers)
    assert got["code"] in (0, None) and got["result"]["verified"] is True, got
    assert got["forks"] >= 1 and not got["left"]
    assert got["by_children"] == 0 if writers == "1" else got["by_children"] > 1000, got  # of about 16,600 files
    version = subprocess.run([str(new / "bin" / "python"), "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True, timeout=300)
    assert version.stdout.strip() == "2.13.0+cpu", version.stderr[-2000:]
    assert ev(vault, "status", "--venv", new, "--exit-code").returncode == 0


def test_into_plans_in_children_the_tree_one_process_plans(tmp_path, torch_venv):
    """``restore --into`` of the real torch venv reads its manifests and decides its files in forked children
    (restore/into.py ``_plan_all``): the new venv holds the same entries (bytes, modes, symlink targets) at
    the same path as when one process plans it all (forking refused), and both are verified."""
    from evtools import ev_json

    vault = tmp_path / "v"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", torch_venv)["id"]
    new, first = tmp_path / "new", tmp_path / "first"
    got = _fresh(f"""
        import hashlib, stat
        os.environ["ENVVAULT_HOME"] = {str(vault)!r}
        os.environ.pop("VIRTUAL_ENV", None)
        real_map, children = forked.map_all, []

        def spy(fn, items, weights, **kw):
            kw["pids"] = pids = []
            try:
                return real_map(fn, items, weights, **kw)
            finally:
                children.append((fn.__qualname__, len(pids)))

        forked.map_all = spy

        def into():
            return into_here({sid!r}, {str(new)!r})

        def tree(root):
            out = {{}}
            for d, ds, fs in os.walk(root):
                for n in ds + fs:
                    p = os.path.join(d, n)
                    st = os.lstat(p)
                    rel = os.path.relpath(p, root)
                    if stat.S_ISLNK(st.st_mode):
                        out[rel] = "link " + os.readlink(p)
                    elif stat.S_ISREG(st.st_mode):
                        with open(p, "rb") as f:
                            out[rel] = f"file {{oct(st.st_mode & 0o7777)}} " + hashlib.sha256(f.read()).hexdigest()
            return out

        forked_run = into()
        planned_in_children = [n for name, n in children if name.startswith("_plan_all.")]
        one = tree({str(new)!r})
        os.rename({str(new)!r}, {str(first)!r})
        forked.can_fork = lambda: False
        alone_run = into()
        two = tree({str(new)!r})
        print(json.dumps({{"runs": [forked_run, alone_run], "children": planned_in_children, "files": len(one),
                          "differ": sorted(k for k in one.keys() | two.keys() if one.get(k) != two.get(k))[:20],
                          "left": not no_children_left()}}))
    """)
    for code, result in got["runs"]:
        assert code in (0, None) and result["verified"] is True, got
    assert len(got["children"]) == 1 and got["children"][0] >= 1 and not got["left"], got
    assert got["files"] > 10000 and got["differ"] == [], got


def _restore_signalled(vault: Path, args, ready, sig: int = signal.SIGTERM) -> tuple[int, str, list[str]]:
    """``envvault restore ARGS`` with forked writers (``ENVVAULT_WRITE_PROCESSES=3``), each file slowed by a
    millisecond, sent ``sig`` once ``ready()``: its exit code, its stderr and the pids of its children then."""
    from evtools import ev_env

    code = ("import sys, time\n"
            "from envvault import materialize\n"
            "one = materialize._stage_one\n"
            "def slow(*a, **kw):\n"
            "    time.sleep(0.001)\n"
            "    return one(*a, **kw)\n"
            "materialize._stage_one = slow\n"
            "from envvault.entry import main\n"
            "sys.argv = ['envvault', 'restore'] + sys.argv[1:]\n"
            "main()\n")
    proc = subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=ev_env(vault, ENVVAULT_WRITE_PROCESSES="3", PYTHONPATH=str(ROOT)))
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if ready():
                break
        children = subprocess.run(["ps", "--ppid", str(proc.pid), "-o", "pid="], capture_output=True,
                                  text=True).stdout.split()
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return proc.returncode, err, children


def test_a_terminated_forked_into_removes_its_venv_and_leaves_no_writer(tmp_path, torch_venv):
    """SIGTERM (a scheduler's cancel) while forked writers build the real torch venv: the command ends as after
    Ctrl-C, exit 143 with one line, its writers killed with it, and no half-built venv left. The signal goes
    once the tree holds 500 files (each file is slowed by a millisecond, so that the run is still going)."""
    from evtools import ev_json

    vault = tmp_path / "v"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", torch_venv)["id"]
    new = tmp_path / "new"
    returncode, err, children = _restore_signalled(
        vault, [sid, "--into", new], lambda: new.exists() and sum(len(fs) for _, _, fs in os.walk(new)) >= 500)
    assert returncode == 143, (returncode, err)
    assert err.strip().splitlines()[-1] == "envvault: terminated" and "Traceback" not in err, err
    assert len(children) >= 2, children  # the writers were forked
    assert not new.exists()
    assert not [p for p in children if alive(int(p))]


def _odd_venv(root: Path) -> Path:
    """A venv (``python -m venv``) whose distributions hold what a scan must warn of or tell apart: a RECORD row
    outside the environment, a row with no hash, a file edited in place, a file two distributions list, a file
    gone, an egg-info that cannot be read and an old-style editable (``.egg-link``)."""
    import base64
    import hashlib

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = next((root / "lib").glob("python*/site-packages"))

    def dist(name: str, nfiles: int, extra: tuple = (), edit: bool = False) -> None:
        info = site / f"{name}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        (info / "INSTALLER").write_text("pip\n")
        (site / name).mkdir()
        rows = []
        for i in range(nfiles):
            data = f"x = {i}\n".encode()
            (site / name / f"m{i}.py").write_bytes(data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{name}/m{i}.py,sha256={digest},{len(data)}")
        if edit:
            (site / name / "m0.py").write_bytes(b"edited\n")
        rows += [*extra, f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
        (info / "RECORD").write_text("\n".join(rows) + "\n")

    dist("alpha", 3, ("../../../../../../etc/hostname,,", "alpha/nohash.py,,"))
    (site / "alpha" / "nohash.py").write_text("y = 1\n")
    dist("beta", 400, edit=True)
    dist("gamma", 200, ("alpha/m0.py,,",))
    dist("zeta", 50, ("zeta/gone.py,sha256=abc,3",))
    (site / "delta.egg-info").mkdir()
    (site / "eps.egg-link").write_text("/nonexistent/eps\n")
    return root


def test_a_forked_check_scan_of_odd_distributions_says_what_one_process_says(tmp_path):
    """The odd venv above, every file read (no stat cache yet), forking forced on: the packages, warnings (each
    kind, in order) and stat cache are those of the one-process scan, and children did some of the work."""
    from envvault.vault.store import Vault

    venv = _odd_venv(tmp_path / "odd")
    Vault.open(tmp_path / "v", create=True)
    got = _fresh(f"""
        from pathlib import Path
        from envvault.snap.scan import scan_current, statcache_for
        from envvault.vault.store import Vault

        vault, venv = Vault.open({str(tmp_path / "v")!r}), Path({str(venv)!r})

        def run(fork):
            cache = statcache_for(vault, venv)
            cache.groups_path.unlink(missing_ok=True)
            cache.files_path.unlink(missing_ok=True)
            forked.FORK_MIN_WEIGHT = forked._WEIGHT_A_CHILD = 1 if fork else 10 ** 9
            n = len(forks)
            got = scan_current(vault, venv, facts=False)
            after = statcache_for(vault, venv)
            return {{"packages": got["packages"], "warnings": got["warnings"], "groups": after.groups,
                    "files": after.files, "forks": len(forks) - n}}

        a, b = run(True), run(False)
        print(json.dumps({{"forks": [a.pop("forks"), b.pop("forks")], "same": a == b, "warnings": a["warnings"],
                          "modified": sorted(p["name"] for p in a["packages"] if p["modified"]),
                          "left": not no_children_left()}}))
    """)
    assert got["forks"][0] >= 1 and got["forks"][1] == 0 and not got["left"]
    assert got["same"], got
    said = "\n".join(got["warnings"])
    for needle in ("outside the environment", "old-style editable", "gone.py"):
        assert needle in said, (needle, got["warnings"])
    assert got["modified"] == ["beta"]


def test_a_childs_distribution_with_a_link_leaves_no_group(tmp_path, make_venv, wheelhouse):
    """A distribution a child builds whose files include a symlink that leads to no file keeps no stat cache
    group here either (``remember_group``): the group the last snap left for it is dropped, not kept beside a
    manifest that no longer matches it."""
    venv = _three_snapped(tmp_path, make_venv, wheelhouse)
    got = _fresh(f"""
        from pathlib import Path
        from envvault.snap.scan import scan_current, statcache_for
        from envvault.vault.store import Vault
        from envvault.vault.statcache import group_paths

        vault, venv = Vault.open({str(tmp_path / "v")!r}), Path({str(venv)!r})
        cache = statcache_for(vault, venv)
        keys = sorted(cache.groups)
        linked, edited = keys[0], keys[1]
        target = venv / sorted(p for p in group_paths(cache.groups[linked]) if p.endswith(".py"))[0]
        target.unlink()
        target.symlink_to("nowhere.py")  # a link to no file: no stats of what it leads to, no group
        other = venv / sorted(p for p in group_paths(cache.groups[edited]) if p.endswith(".py"))[0]
        other.write_bytes(other.read_bytes() + b"#")
        forked.FORK_MIN_WEIGHT = forked._WEIGHT_A_CHILD = 1
        got = scan_current(vault, venv, facts=False)
        after = statcache_for(vault, venv)
        print(json.dumps({{"forks": len(forks), "groups": sorted(after.groups), "linked": linked, "edited": edited,
                          "modified": sorted(p["name"] for p in got["packages"] if p["modified"])}}))
    """)
    assert got["forks"] >= 1
    assert got["linked"] not in got["groups"] and got["edited"] in got["groups"]
    assert len(got["modified"]) == 2


def _torch_copy(torch_venv: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the shared torch venv (which must not change) and its site-packages."""
    venv = tmp_path / "venv"
    subprocess.run(["cp", "-a", str(torch_venv), str(venv)], check=True)
    return venv, next((venv / "lib").glob("python3*/site-packages"))


def _temps(root: Path) -> list[str]:
    return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if ".envvault-" in f]


@pytest.mark.parametrize("backup", [False, True])
def test_a_restore_in_place_of_real_torch_is_written_by_forked_children(tmp_path, torch_venv, backup):
    """``rm -rf torch`` then ``restore --venv`` on a copy of the real torch 2.13.0+cpu venv, with
    ``ENVVAULT_WRITE_PROCESSES=3``: forked children write the temp files (this process renames them), the
    environment is verified, imports torch, ``status`` finds it unchanged, and no temp file or child is left.
    With the backup (the default), which here stores a pack (numpy's edited ``version.py``): the pack's id
    is hashed on one thread, so BLAKE3's pool (threads that outlive it) does not keep the writes from forking
    (helper 33: they ran on threads)."""
    import shutil

    from evtools import ev, ev_json

    venv, site = _torch_copy(torch_venv, tmp_path)
    vault = tmp_path / "v"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    shutil.rmtree(site / "torch")
    edited = site / "numpy" / "version.py"
    kept = edited.read_bytes()
    if backup:
        edited.write_bytes(kept + b"# edited: the backup stores this\n" * 20000)
    got = _written_by_children(vault, ["restore", sid, "--venv", venv] + ([] if backup else ["--no-backup"]))
    assert got["code"] in (0, None) and got["result"]["verified"] is True, got
    assert got["forks"] >= 2 and not got["left"], got
    assert got["by_children"] > 1000, got  # of about 11,900 files
    assert bool(got["result"].get("backup")) is backup and edited.read_bytes() == kept
    version = subprocess.run([str(venv / "bin" / "python"), "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True, timeout=300)
    assert version.stdout.strip() == "2.13.0+cpu", version.stderr[-2000:]
    assert ev(vault, "status", "--venv", venv, "--exit-code").returncode == 0
    assert _temps(venv) == []


@pytest.mark.parametrize("how", ["TERM", "KILL"])
def test_a_terminated_forked_restore_in_place_is_finished_by_the_next(tmp_path, torch_venv, how):
    """SIGTERM (or SIGKILL) while forked writers stage torch's files in place: exit 143 with one line (or
    killed), the writers ended with it, nothing of torch renamed into place; the next restore clears the temp
    files left and puts the environment back, verified. The signal goes once 500 temp files are there (each
    file slowed by a millisecond, so that the run is still going)."""
    import shutil

    from evtools import ev, ev_json

    venv, site = _torch_copy(torch_venv, tmp_path)
    vault = tmp_path / "v"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    shutil.rmtree(site / "torch")
    returncode, err, children = _restore_signalled(
        vault, [sid, "--venv", venv, "--no-backup"],
        lambda: (site / "torch").exists() and len(_temps(site / "torch")) >= 500, getattr(signal, f"SIG{how}"))
    if how == "TERM":
        assert returncode == 143, (returncode, err)
        assert err.strip().splitlines()[-1] == "envvault: terminated" and "Traceback" not in err, err
    else:
        assert returncode == -signal.SIGKILL, (returncode, err)
    assert len(children) >= 2, children  # the writers were forked
    deadline = time.monotonic() + 10  # (a killed parent's children are ended by the kernel: PR_SET_PDEATHSIG)
    while [p for p in children if alive(int(p))] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in children if alive(int(p))]
    assert not (site / "torch" / "__init__.py").exists()  # staged only: nothing renamed into place
    again = ev_json(vault, "restore", sid, "--venv", venv, "--no-backup")
    assert again["verified"] is True, again
    assert _temps(venv) == []
    assert ev(vault, "status", "--venv", venv, "--exit-code").returncode == 0


def test_a_cache_restore_over_an_existing_root_stages_in_forked_children(tmp_path):
    """A compile cache restored (``--replace``) over its root whose files all changed: each file is staged under the cache
    restore's temp name (``.<name>.envvault-<pid>-<run>.tmp``) by forked children (forced here for a few
    bytes: the threshold is 64 MiB) and renamed by this process; the tree comes back byte for byte and no
    temp file is left."""
    from evtools import ev_json

    root = tmp_path / "cache"
    want = {}
    for i in range(240):
        path = root / f"d{i % 6}" / f"entry{i:03}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(200 + i * 37))
        want[str(path.relative_to(root))] = path.read_bytes()
    vault = tmp_path / "v"
    cid = ev_json(vault, "cache", "snap", "--no-discover", "--cache-dir", root)["id"]
    for rel in want:
        (root / rel).write_bytes(b"changed since")
    got = _written_by_children(vault, ["cache", "restore", cid, "--to", root, "--replace"], fork_bytes=0)
    assert got["code"] in (0, None) and got["result"]["caches"][0]["written_files"] == 240, got
    assert got["forks"] >= 2 and not got["left"] and got["by_children"] > 0, got
    assert {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()} == want


def test_a_guard_rollback_of_real_torch_is_written_by_forked_children(tmp_path, torch_venv):
    """A guarded command that deletes torch and edits numpy (so the guard's snapshot after it stores a pack),
    then fails: the rollback puts torch back with its files written by forked children. The guard's snapshots
    hash their pack ids on one thread, as a restore's backup does: BLAKE3's pool, alive after an id hashed on it,
    kept the rollback on threads (helper 33); the seeds' rollback of a swapped torch is this restore."""
    from evtools import ev, ev_json

    venv, site = _torch_copy(torch_venv, tmp_path)
    vault = tmp_path / "v"
    ev_json(vault, "snap", "--no-caches", "--venv", venv)
    edited = site / "numpy" / "version.py"
    kept = edited.read_bytes()
    script = f"rm -rf '{site / 'torch'}' && printf '# edited\\n%.0s' $(seq 20000) >> '{edited}'; exit 1"
    # ``cli_here`` adds --json last: the shell's $0, here, after the command.
    got = _written_by_children(vault, ["guard", "--json", "--venv", venv, "--", "sh", "-c", script])
    assert got["code"] == 1 and got["result"]["outcome"] == "restored", got
    assert got["forks"] >= 2 and not got["left"] and got["by_children"] > 1000, got
    assert edited.read_bytes() == kept and (site / "torch" / "__init__.py").is_file()
    assert ev(vault, "status", "--venv", venv, "--exit-code").returncode == 0
    assert _temps(venv) == []


def test_an_armed_crash_point_keeps_a_first_snap_s_groups_in_the_process(tmp_path, torch_venv):
    """A crash test stops (or kills) the process at a named point; with one armed, no work is forked
    (``forked.can_fork``), so the point is passed by the snap itself: the first snap of the real torch venv,
    whose small files 2 forked group processes would otherwise pack, stops itself at its first pack frame.
    Before, a group child passed the point and stopped alone, and the snap waited for it for ever (helper 36)."""
    vault = tmp_path / "vault"
    proc = subprocess.Popen([sys.executable, "-m", "envvault", "snap", "--no-caches", "--venv", str(torch_venv)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=ev_env(vault, ENVVAULT_TEST_CRASH_AT="pack_frame:1:STOP", ENVVAULT_GROUP_PROCESSES="2"))
    try:
        deadline = time.monotonic() + 240
        while True:
            got, st = os.waitpid(proc.pid, os.WNOHANG | os.WUNTRACED)
            if got:
                break
            assert time.monotonic() < deadline, "the snap neither stopped itself nor ended"
            time.sleep(0.05)
        assert os.WIFSTOPPED(st), os.waitstatus_to_exitcode(st)
    finally:
        proc.kill()
        proc.wait()
    assert ev_json(vault, "list", "--all")["snapshots"] == []
