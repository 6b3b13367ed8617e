"""SIGTERM (a job scheduler's cancel or time limit, ``docker stop``) is handled as Ctrl-C is: the command
stops, cleans up what it half made, says "envvault: terminated" in one line and exits 143. The signal is sent
by the process itself at a named point (``ENVVAULT_TEST_CRASH_AT=<point>:<n>:TERM``), never after a sleep."""

from __future__ import annotations

import os
import subprocess
import sys

from fixtures import catalogue as C
from fixtures.venvs import pip_install
from tests.evtools import ev, ev_env, ev_json


def _run(vault, *args, point: str):
    return subprocess.run([sys.executable, "-m", "envvault", *map(str, args)], capture_output=True, text=True,
                          env=ev_env(vault, ENVVAULT_TEST_CRASH_AT=point), timeout=300)


def _terminated(proc) -> None:
    assert proc.returncode == 143, (proc.returncode, proc.stderr)
    assert proc.stderr.strip().splitlines()[-1] == "envvault: terminated", proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_terminated_into_leaves_no_half_built_venv(tmp_path, make_venv, wheelhouse):
    venv = make_venv("venv")
    pip_install(venv, *(str(wheelhouse[k]) for k in (C.TORCH_PLAIN_A, C.SERVING, C.WITH_HEADERS)))
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    new = tmp_path / "new"
    _terminated(_run(vault, "restore", sid, "--into", new, point="stage:5:TERM"))
    assert not new.exists()
    assert ev_json(vault, "restore", sid, "--into", new)["verified"] is True  # the path is free again


def test_a_terminated_snap_commits_nothing_and_leaves_no_temp_file(tmp_path, make_venv, wheelhouse):
    venv = make_venv("venv")
    pip_install(venv, *(str(wheelhouse[k]) for k in (C.TORCH_PLAIN_A, C.SERVING)))
    vault = tmp_path / "vault"
    _terminated(_run(vault, "snap", "--no-caches", "--venv", venv, point="snap_objects:1:TERM"))
    assert ev_json(vault, "list", "--all")["snapshots"] == []
    assert [p for d, _, fs in os.walk(vault) for p in fs if p.endswith(".tmp")] == []
    assert ev_json(vault, "verify")["ok"]
    out = ev_json(vault, "snap", "--no-caches", "--venv", venv)
    assert ev_json(vault, "verify", "--read-data")["ok"] and ev(vault, "show", out["id"]).returncode == 0


def test_a_command_started_with_sigterm_ignored_keeps_it_ignored(tmp_path, make_venv):
    """A process started with SIGTERM ignored (a supervisor's choice) is not given a handler: the point's
    SIGTERM changes nothing and the snap finishes."""
    venv = make_venv("venv")
    vault = tmp_path / "vault"
    code = ("import signal, runpy, sys\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "sys.argv = ['envvault'] + sys.argv[1:]\n"
            "runpy.run_module('envvault', run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", code, "snap", "--no-caches", "--venv", str(venv)],
                          capture_output=True, text=True, timeout=300,
                          env=ev_env(vault, ENVVAULT_TEST_CRASH_AT="snap_objects:1:TERM"))
    assert proc.returncode == 0, proc.stderr
    assert len(ev_json(vault, "list", "--all")["snapshots"]) == 1


def test_guard_passes_a_sigterm_on_to_the_command_it_runs(tmp_path):
    """While guard runs the guarded command, a SIGTERM sent to guard reaches the command (which decides how to
    end: here, exit 7) and guard goes on with that exit code, as after Ctrl-C, instead of ending first."""
    started = tmp_path / "started"
    child = ("import signal, sys, time\n"
             "signal.signal(signal.SIGTERM, lambda s, f: sys.exit(7))\n"
             f"open({str(started)!r}, 'w').close()\n"
             "time.sleep(120)\n")
    code = ("import os, signal, sys, threading, time\n"
            "from envvault import entry\n"
            "from envvault.guard.run import run_command\n"
            "entry._terminate_as_interrupt()\n"
            "def term():\n"
            f"    while not os.path.exists({str(started)!r}):\n"
            "        time.sleep(0.01)\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "threading.Thread(target=term, daemon=True).start()\n"
            f"rc, _ = run_command((sys.executable, '-c', {child!r}), dict(os.environ))\n"
            "print('rc', rc)\n"
            "print('after', signal.getsignal(signal.SIGTERM).__name__)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=ev_env(tmp_path / "vault"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["rc", "7", "after", "_raise_terminated"], proc.stdout
