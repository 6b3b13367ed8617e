"""The command's quick exit (envvault/entry.py, ``leave_now``): once a command is done, it ends without the
interpreter's teardown, with the same exit code, the same output (flushed first) and what ``atexit`` was given
run; the teardown still happens with another thread alive, under a tracer or profiler, and with
ENVVAULT_QUICK_EXIT=0. Each case runs in a fresh interpreter, as the command does."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fixtures.machine import cpython

ROOT = Path(__file__).resolve().parent.parent

# An object whose finalizer runs only in the interpreter's teardown (a module global), and an atexit handler.
_PRELUDE = """
import atexit, os, sys, threading
class Witness:
    def __del__(self, write=os.write):
        write(2, b"teardown ran\\n")
witness = Witness()
atexit.register(lambda: os.write(2, b"atexit ran\\n"))
"""


def _run(code: str, *args: str, **env_extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("ENVVAULT_QUICK_EXIT", "COVERAGE_PROCESS_START", "PYTHONUNBUFFERED")}  # stdout buffered, as usual
    env.update(PYTHONPATH=str(ROOT), **env_extra)
    return subprocess.run([sys.executable, "-c", _PRELUDE + textwrap.dedent(code), *args], capture_output=True,
                          text=True, env=env, timeout=120)


_MAIN = """
from envvault.entry import main
sys.argv[0] = "envvault"
main()
"""


def test_a_finished_command_skips_the_teardown_only():
    quick = _run(_MAIN, "--version")
    normal = _run(_MAIN, "--version", ENVVAULT_QUICK_EXIT="0")
    assert quick.returncode == normal.returncode == 0
    assert quick.stdout == normal.stdout and "envvault" in quick.stdout
    assert "atexit ran" in quick.stderr and "atexit ran" in normal.stderr
    assert "teardown ran" not in quick.stderr
    assert "teardown ran" in normal.stderr  # the witness works: without the quick exit it is finalized


def test_exit_codes_and_messages_are_kept(tmp_path):
    from envvault.vault.store import Vault

    vault = str(tmp_path / "v")
    Vault.open(vault, create=True)
    for args, code in ((["show", "nosuch"], 4), (["--no-such-option"], 2), (["list"], 0)):
        quick = _run(_MAIN, "--vault", vault, *args)
        normal = _run(_MAIN, "--vault", vault, *args, ENVVAULT_QUICK_EXIT="0")
        assert quick.returncode == normal.returncode == code, (args, quick.stderr)
        assert quick.stdout == normal.stdout
        assert quick.stderr.replace("teardown ran\n", "") == normal.stderr.replace("teardown ran\n", "")
        assert "teardown ran" not in quick.stderr


def test_long_output_is_flushed_whole(tmp_path):
    """stdout to a pipe is block-buffered: what is still in the buffer at the end must reach the reader."""
    quick = _run(_MAIN, "--help")
    normal = _run(_MAIN, "--help", ENVVAULT_QUICK_EXIT="0")
    assert quick.returncode == 0 and quick.stdout == normal.stdout and len(quick.stdout) > 1000
    code = """
    from envvault import entry
    sys.stdout.write("x" * 300000)
    sys.stdout.write("end")  # a small write stays in the buffer
    try:
        raise SystemExit(3)
    except SystemExit as done:
        entry.leave_now(done.code)
    """
    got = _run(code)
    assert got.returncode == 3 and got.stdout == "x" * 300000 + "end" and "teardown ran" not in got.stderr


def test_teardown_kept_when_something_may_need_it():
    cases = {
        "another thread alive": """
            t = threading.Thread(target=__import__("time").sleep, args=(0.3,))
            t.start()
        """,
        "a tracer": """
            sys.settrace(lambda *a: None)
        """,
        "a profiler": """
            sys.setprofile(lambda *a: None)
        """,
    }
    for name, setup in cases.items():
        got = _run(textwrap.dedent(setup) + _MAIN, "--version")
        assert got.returncode == 0, (name, got.stderr)
        assert "teardown ran" in got.stderr and "atexit ran" in got.stderr, name
    code = """
    from envvault import entry
    entry.leave_now("a message")  # a non-numeric exit (Python prints it): left to the normal exit
    print("still here")
    """
    got = _run(code)
    assert got.returncode == 0 and "still here" in got.stdout and "teardown ran" in got.stderr


@pytest.mark.parametrize("minor", ["3.8", "3.11", "3.12", "3.13"])
def test_cprofile_gets_its_report_on_every_python(tmp_path, minor):
    """From 3.12 cProfile watches through ``sys.monitoring``, not ``sys.setprofile``: ``python -m cProfile -m
    envvault ...`` must still print its report (the device's start-up profiles lost theirs on 3.12 before)."""
    script = tmp_path / "probe.py"
    script.write_text("from envvault import entry\nentry.leave_now(0)\nprint('still here')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("ENVVAULT_QUICK_EXIT", "PYTHONUNBUFFERED")}
    env["PYTHONPATH"] = str(ROOT)  # entry.py imports only the standard library
    got = subprocess.run([str(cpython(minor)), "-m", "cProfile", str(script)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert got.returncode == 0, got.stderr[-2000:]
    assert "still here" in got.stdout and "function calls" in got.stdout


def test_closed_streams_and_odd_codes_exit_as_python_does(tmp_path):
    """A stream whose descriptor was closed at start is None in Python; an exit code is kept to its low byte
    (-1 is 255); in both the quick exit ends as the normal one does, with no traceback."""
    from envvault.vault.store import Vault

    vault = str(tmp_path / "v")
    Vault.open(vault, create=True)
    launch = [sys.executable, "-c", _PRELUDE + _MAIN]
    for args, closing, code in ((["--version"], ">&-", 0), (["--vault", vault, "show", "nosuch"], "2>&-", 4),
                                (["--vault", vault, "list"], ">&- 2>&-", 0)):
        for quick in ("1", "0"):
            env = dict(os.environ, PYTHONPATH=str(ROOT), ENVVAULT_QUICK_EXIT=quick)
            env.pop("PYTHONUNBUFFERED", None)
            got = subprocess.run(["sh", "-c", f'"$@" {closing}', "sh", *launch, *args], capture_output=True,
                                 text=True, env=env, timeout=120)
            assert got.returncode == code, (args, closing, quick, got.stderr[-1500:])
            assert "Traceback" not in got.stderr, (args, closing, quick)
    for raw, low in ((-1, 255), (-2, 254), (256, 0), (300, 44)):
        got = _run(f"""
        from envvault import entry
        entry.leave_now({raw})
        print("still here")
        """)
        assert got.returncode == low and "still here" not in got.stdout and "teardown ran" not in got.stderr, raw


def test_output_that_fails_after_atexit_and_huge_codes_end_as_python_ends():
    """An atexit handler writing to a pipe the reader closed: the flush fails, and the quick exit ends with 120
    as Python's own exit does; a code beyond a C int is left to Python. Both compared with ENVVAULT_QUICK_EXIT=0."""
    code = """
    import time
    from envvault import entry
    atexit.register(lambda: sys.stdout.write("after the reader left"))
    time.sleep(0.5)  # the reader has closed its end by now
    entry.leave_now(0)
    """
    for quick in ("1", "0"):
        env = dict(os.environ, PYTHONPATH=str(ROOT), ENVVAULT_QUICK_EXIT=quick)
        env.pop("PYTHONUNBUFFERED", None)
        proc = subprocess.Popen([sys.executable, "-c", _PRELUDE + textwrap.dedent(code)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env)
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == 120, (quick, err[-1500:])
    huge = {}
    for quick in ("1", "0"):
        got = _run("""
        from envvault import entry
        entry.leave_now(1 << 40)
        sys.exit(1 << 40)
        """, ENVVAULT_QUICK_EXIT=quick)
        huge[quick] = got.returncode
        assert "teardown ran" in got.stderr, quick  # left to the normal exit
    assert huge["1"] == huge["0"]
