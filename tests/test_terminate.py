"""SIGTERM (a job scheduler's cancel or time limit, ``docker stop``) is handled as Ctrl-C is: the command
stops, cleans up what it half made, says "envvault: terminated" in one line and exits 143. The signal is sent
by the process itself at a named point (``ENVVAULT_TEST_CRASH_AT=<point>:<n>:TERM``), never after a sleep.
A hang-up (SIGHUP: the terminal gone) does not stop a command: it finishes, silently; the terminal is a real
pseudo-terminal whose master side the test closes while the command is stopped at a named point (``:STOP``)
or while the guarded command runs."""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures import catalogue as C
from fixtures import site_packages
from fixtures.guard_helpers import PtyShell, guard_env
from fixtures.venvs import pip_install
from tests.evtools import ROOT, alive, ev, ev_env, ev_json


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
            "from envvault import terminate\n"
            "from envvault.guard.run import run_command\n"
            "terminate.install()\n"
            "def term():\n"
            f"    while not os.path.exists({str(started)!r}):\n"
            "        time.sleep(0.01)\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "threading.Thread(target=term, daemon=True).start()\n"
            f"rc, _ = run_command((sys.executable, '-c', {child!r}), dict(os.environ))\n"
            "print('rc', rc)\n"
            "after = signal.getsignal(signal.SIGTERM)\n"
            "print('after', getattr(after, '__name__', None) or after.name)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=ev_env(tmp_path / "vault"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["rc", "7", "after", "_raise_terminated"], proc.stdout
    # Started with SIGTERM ignored: it stays ignored, for guard and for the command (which sleeps on, then 3).
    ignored = code.replace("terminate.install()\n", "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n")
    ignored = ignored.replace("time.sleep(120)", "time.sleep(1); sys.exit(3)")
    started.unlink()
    proc = subprocess.run([sys.executable, "-c", ignored], capture_output=True, text=True, timeout=120,
                          env=ev_env(tmp_path / "vault"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["rc", "3", "after", "SIG_IGN"], proc.stdout


def _uv_that_is_terminated_meanwhile(tmp_path) -> tuple[Path, Path]:
    """A folder holding a ``uv`` that sends its parent (envvault) SIGTERM, then runs the real uv to its end and
    leaves a mark: a scheduler's cancel landing while uv works. The folder and the mark's path."""
    from envvault.restore.uv import find_uv

    folder, mark = tmp_path / "shim", tmp_path / "uv-finished"
    folder.mkdir()
    shim = folder / "uv"
    shim.write_text(f"#!/bin/sh\nkill -TERM $PPID\n{find_uv()} \"$@\"\nrc=$?\ntouch {mark}\nexit $rc\n")
    shim.chmod(0o755)
    return folder, mark


def test_a_sigterm_while_uv_makes_the_venv_waits_for_uv_then_leaves_no_venv(tmp_path, make_venv, wheelhouse):
    """``--into``: a SIGTERM while uv makes the venv waits for uv (never killed mid-write), then the restore
    ends as terminated and leaves nothing: the folder it made is gone, a folder that was there (empty) is
    empty again."""
    venv = make_venv("venv")
    pip_install(venv, str(wheelhouse[C.TORCH_PLAIN_A]), str(wheelhouse[C.SERVING]))
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    folder, mark = _uv_that_is_terminated_meanwhile(tmp_path)
    env = ev_env(vault, PATH=f"{folder}:{os.environ['PATH']}")
    new, empty = tmp_path / "new", tmp_path / "empty"
    empty.mkdir()
    for target in (new, empty):
        proc = subprocess.run([sys.executable, "-m", "envvault", "restore", sid, "--into", str(target)],
                              capture_output=True, text=True, env=env, timeout=300)
        _terminated(proc)
        assert mark.exists()  # uv ran to its end
        mark.unlink()
    assert not new.exists() and empty.is_dir() and list(empty.iterdir()) == []


def test_guard_takes_a_sigterm_at_its_prompt_for_no_answer():
    """At guard's question, Ctrl-C answers no; a SIGTERM is no answer: it ends guard (click turns both into
    an Abort, told apart by what it was raised from)."""
    import click

    from envvault.commands.guard import _CliUI
    from envvault.errors import Terminated

    def aborted(by):
        def confirm(*_a, **_k):
            try:
                raise by()
            except KeyboardInterrupt:
                raise click.exceptions.Abort() from None  # as click.confirm does
        return confirm

    ui = _CliUI(as_json=False)
    real = click.confirm
    try:
        click.confirm = aborted(KeyboardInterrupt)
        assert ui.confirm("Keep this change?", True) is False
        click.confirm = aborted(Terminated)
        with pytest.raises(click.exceptions.Abort) as got:
            ui.confirm("Keep this change?", True)
        assert isinstance(got.value.__context__, Terminated)
    finally:
        click.confirm = real


def test_a_sigterm_outside_any_command_s_handling_is_one_line_and_143(tmp_path):
    """A SIGTERM that lands while the command line is still being set up (here: inside the CLI's entry, before
    any command's own handling) is the same one line and 143, never a traceback."""
    code = ("import os, signal, sys, types\n"
            "fake = types.ModuleType('envvault.cli')\n"
            "def main():\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    signal.pause()\n"
            "fake.main = main\n"
            "sys.modules['envvault.cli'] = fake\n"
            "sys.argv = ['envvault', 'list']\n"
            "from envvault.entry import main as entry\n"
            "entry()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=ev_env(tmp_path / "vault"))
    _terminated(proc)


def test_the_shell_hook_s_and_the_stamp_s_way_in_handles_sigterm_too(tmp_path, make_venv):
    """``boot_code`` (how the shell hook's guard and the checkpoint stamp's background snap start envvault)
    goes through the entry point: a SIGTERM there cleans up as from the console script."""
    from envvault.env.untrusted import boot_code

    venv = make_venv("venv")
    vault = tmp_path / "vault"
    proc = subprocess.run([sys.executable, "-c", boot_code([str(ROOT)]), "snap", "--no-caches", "--venv", str(venv)],
                          capture_output=True, text=True, timeout=300,
                          env=ev_env(vault, ENVVAULT_TEST_CRASH_AT="snap_objects:1:TERM"), cwd=tmp_path)
    _terminated(proc)
    assert ev_json(vault, "list", "--all")["snapshots"] == []


def _stopped_on_a_terminal(argv: list[str], env: dict) -> tuple[int, int]:
    """Start ``argv`` as the session leader of a new pseudo-terminal (its stdin, stdout and stderr), reading
    what it writes until it stops itself at its armed ``:STOP`` point; (pid, the terminal's master side)."""
    pid, fd = pty.fork()
    if pid == 0:
        try:
            signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as from a shell, whatever the tests run under (nohup)
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    deadline = time.monotonic() + 300
    while True:
        got, st = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
        if got:
            assert os.WIFSTOPPED(st), f"ended before its stop point: {os.waitstatus_to_exitcode(st)}"
            return pid, fd
        assert time.monotonic() < deadline, "never reached its stop point"
        if select.select([fd], [], [], 0.05)[0]:
            os.read(fd, 65536)  # a progress bar on the terminal: read, so that it never waits on a full buffer


def test_a_hang_up_mid_restore_lets_the_restore_finish(tmp_path, make_venv, wheelhouse):
    """The terminal hangs up while a restore writes files (stopped at its second staged file, then the master
    side closed: the kernel sends the session leader SIGHUP and SIGCONT). The restore goes on, as under nohup,
    and finishes: exit 0, the package back, ``status`` unchanged. Before, SIGHUP's default killed it part
    way."""
    venv = make_venv("venv")
    pip_install(venv, *(str(wheelhouse[k]) for k in (C.TORCH_PLAIN_A, C.SERVING)))
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    pkg = site_packages(venv) / "torchlike"
    shutil.rmtree(pkg)
    argv = [sys.executable, "-m", "envvault", "restore", sid, "--venv", str(venv)]
    pid, fd = _stopped_on_a_terminal(argv, ev_env(vault, ENVVAULT_TEST_CRASH_AT="stage:2:STOP"))
    os.close(fd)  # the hang-up
    _, st = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(st) == 0
    assert pkg.is_dir()
    status = ev_json(vault, "status", "--venv", venv)
    assert status["snapshot"] == sid and status["empty"], status


def _guard_hung_up(tmp_path, make_venv, wheelhouse, script: str, shown: str, *options: str) -> tuple[Path, Path]:
    """In an interactive bash on a pseudo-terminal, ``guard OPTIONS -- sh -c SCRIPT`` of a venv with the fixture
    torch (``SCRIPT`` may name ``{pkg}``, its folder, and ``{pid}``, a file for guard's pid); once the terminal
    shows ``shown`` (a regex), the connection drops (``PtyShell.hang_up``) and the test waits for guard to end.
    The venv and the vault."""
    venv = make_venv("venv")
    pip_install(venv, *(str(wheelhouse[k]) for k in (C.TORCH_PLAIN_A, C.SERVING)))
    vault = tmp_path / "vault"
    env = guard_env(venv, vault, extra={"PYTHONPATH": str(ROOT)})
    guard_pid = tmp_path / "guard.pid"
    script = script.format(pkg=site_packages(venv) / "torchlike", pid=guard_pid)
    with PtyShell(["/bin/bash", "--norc", "--noprofile", "-i"], env, cwd=tmp_path) as sh:
        sh.expect("PTYSHELL")
        sh.send(f"{sys.executable} -m envvault guard {' '.join(options)} -- sh -c '{script}'\n")
        sh.expect(shown, timeout=300)
        pid = int(guard_pid.read_text())
        sh.hang_up()
    deadline = time.monotonic() + 300
    while alive(pid):
        assert time.monotonic() < deadline, "guard still running"
        time.sleep(0.05)
    return venv, vault


def test_guard_rolls_back_after_the_terminal_hangs_up(tmp_path, make_venv, wheelhouse):
    """An ssh session drops while a guarded command runs in an interactive bash: bash passes the SIGHUP on to
    its job, guard and the command alike. The command dies of it (exit 129); guard goes on, takes its
    snapshot, rolls back what the command had half done (a package deleted) and ends with the command's
    exit code. Before, guard died with the command and the package stayed deleted."""
    venv, vault = _guard_hung_up(tmp_path, make_venv, wheelhouse,
                                 "echo $PPID > {pid}; rm -rf {pkg}; echo DELETED-$((1+1)); sleep 120", "DELETED-2")
    assert (site_packages(venv) / "torchlike").is_dir()
    status = ev_json(vault, "status", "--venv", venv)
    assert status["empty"], status
    last = ev_json(vault, "list", "--all")["snapshots"]
    assert any("exit 129" in (s.get("message") or "") for s in last), last


def test_a_hang_up_at_guard_s_question_is_no_answer_and_the_change_is_rolled_back(tmp_path, make_venv, wheelhouse):
    """Guard asks on the terminal whether to keep a change to a protected package (no plan showed it) and the
    connection drops while it waits: the read fails (EIO), which is no answer, so guard rolls the change back.
    Before, the failed read ended guard with a storage error (exit 6) and the package stayed deleted (helper 36)."""
    venv, vault = _guard_hung_up(tmp_path, make_venv, wheelhouse, "echo $PPID > {pid}; rm -rf {pkg}",
                                 r"Keep this change\?", "--protect", "torchlike")
    assert (site_packages(venv) / "torchlike").is_dir()
    assert ev_json(vault, "status", "--venv", venv)["empty"]


def test_uv_is_not_ended_by_a_hang_up_of_envvault_s_job(tmp_path, make_venv, wheelhouse):
    """An interactive shell passes a hang-up on to the whole job, envvault's children included: uv making the
    ``--into`` venv (here a shim that sends the job SIGHUP, as bash does, then runs the real uv) runs in a
    session of its own (``terminate.OWN_SESSION``), so it finishes and the restore with it. Before, uv died of
    the hang-up and the restore failed (exit 7, helper 36)."""
    from envvault.restore.uv import find_uv

    venv = make_venv("venv")
    pip_install(venv, str(wheelhouse[C.TORCH_PLAIN_A]), str(wheelhouse[C.SERVING]))
    vault = tmp_path / "vault"
    sid = ev_json(vault, "snap", "--no-caches", "--venv", venv)["id"]
    folder = tmp_path / "shim"
    folder.mkdir()
    shim = folder / "uv"
    # The job's process group is envvault's (started below as a group of its own, as a shell starts a job).
    shim.write_text("#!/bin/sh\nkill -HUP -$(awk '{print $5}' /proc/$PPID/stat)\n"
                    f"exec {find_uv()} \"$@\"\n")
    shim.chmod(0o755)
    new = tmp_path / "new"
    # SIGHUP's default first, as a shell's job has it, whatever the tests run under (nohup ignores it)
    code = ("import runpy, signal, sys\n"
            "signal.signal(signal.SIGHUP, signal.SIG_DFL)\n"
            "sys.argv = ['envvault'] + sys.argv[1:]\n"
            "runpy.run_module('envvault', run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", code, "restore", sid, "--into", str(new), "--json"],
                          capture_output=True, text=True, timeout=300, start_new_session=True,
                          env=ev_env(vault, PATH=f"{folder}:{os.environ['PATH']}"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["verified"] is True


def test_a_progress_bar_on_a_terminal_that_hung_up_ends_the_bar_not_the_work(monkeypatch):
    """Once a terminal hangs up, writes to it fail (EIO) at once, and a shell passes the SIGHUP on a moment
    later: a progress bar drawn in between must not end the restore it shows (helper 37). The bar stops
    drawing; the work goes on."""
    import errno

    from envvault.output import Progress

    class HungUp:
        def write(self, _text):
            raise OSError(errno.EIO, "Input/output error")

        def flush(self):
            raise OSError(errno.EIO, "Input/output error")

        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", HungUp())
    bar = Progress("restore", 100)
    assert bar.enabled
    bar(50)
    assert not bar.enabled and bar.done == 50
    bar(100)
    bar.close()
