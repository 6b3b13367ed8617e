"""The ``envvault`` command's entry point (the console script and ``python -m envvault``).

Before the command imports anything else, ``keep_bytecode`` makes sure what it imports is compiled once,
not on every run. Where envvault was installed without its bytecode and Python will not write it beside the
sources (``PYTHONDONTWRITEBYTECODE``, which many container images set, or a folder this user cannot
write), it keeps it under envvault's cache folder instead (``sys.pycache_prefix``, Python's own mirror tree). On the
GPU host, whose image sets PYTHONDONTWRITEBYTECODE=1, envvault installed by uv into a venv of its own (uv
compiles nothing unless asked) compiled 60 modules on every ``status``: 0.19 s of 0.5 s
(bench/results/profiles/profile_status_own.txt). ``ENVVAULT_BYTECODE_CACHE=0`` leaves Python as it is.

Then an unchanged ``status`` is answered from the verdict of the last full one (``quick.py``) before the
CLI and the model are imported, a plain ``snap`` or ``cache restore`` runs without click (``lean.py``), and
every other command goes to ``cli.py``.

Only the command does this: importing envvault as a library (``envvault.torch`` in a training script)
changes nothing in the importing process.
"""

from __future__ import annotations

import os
import stat
import sys

__all__ = ["main", "keep_bytecode", "leave_now"]


def main() -> None:
    keep_bytecode()
    from envvault import terminate

    terminate.install()  # SIGTERM handled as Ctrl-C
    try:
        _run()
    except KeyboardInterrupt as stop:  # one that came outside a command's own handling (imports, the exit)
        from envvault.errors import Terminated

        term = isinstance(stop, Terminated)
        sys.stderr.write("envvault: terminated\n" if term else "envvault: interrupted\n")
        sys.exit(Terminated.exit_code if term else 130)


def _run() -> None:
    from envvault.quick import answer

    try:
        code = answer(sys.argv[1:])  # an unchanged status, before the CLI is imported (quick.py)
        if code is None:
            from envvault.lean import answer as run_lean

            code = run_lean(sys.argv[1:])  # a plain snap or cache restore, without click (lean.py)
    except BrokenPipeError:
        sys.exit(0)
    if code is not None:
        leave_now(code)
        sys.exit(code)
    from envvault.cli import main as cli_main

    try:
        cli_main()
    except SystemExit as done:
        leave_now(done.code)
        raise


def leave_now(code) -> None:
    """End the command at once with ``code`` once it is done, skipping the interpreter's teardown (freeing
    every module and object one by one: 20-60 ms of a 0.15-0.3 s command, bench/results/issue11_device.md),
    as ``os._exit`` does; returns (the normal exit follows) when anything could still need that teardown:
    another thread alive (a non-daemon one would be joined), a tracer or profiler (coverage, cProfile want
    their report), an exit code that is not a number or does not fit a C int (Python deals with those),
    output that cannot be flushed, or ``ENVVAULT_QUICK_EXIT=0``. What ``atexit`` was given runs first, as at
    a normal exit. Files envvault writes are closed (and made durable) by the code that writes them, never
    by the teardown."""
    if code is None:
        code = 0
    if (not isinstance(code, int) or not -(1 << 31) <= code < 1 << 31 or _observed()
            or os.environ.get("ENVVAULT_QUICK_EXIT", "") == "0"):
        return
    import threading

    if threading.active_count() > 1 or not _flushed():
        return  # a closed pipe, a closed stream: the normal exit reports it as it always did
    import atexit

    atexit._run_exitfuncs()  # what was registered (the stage report, a bucket's pending heads) runs once
    # The OS keeps the low byte of the code, as at a normal exit (-1 is 255); output that could not be
    # flushed after atexit's handlers ends with 120, as Python's own exit does.
    os._exit(code & 0xFF if _flushed() else 120)


def _flushed() -> bool:
    """stdout and stderr flushed; False when one could not be (a stream that is None, because its file
    descriptor was closed when Python started, is skipped: nothing was written to it)."""
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except Exception:  # noqa: BLE001 - whatever a stream raises, the normal exit deals with it
        return False
    return True


def _observed() -> bool:
    """A tracer or profiler is set: ``sys.settrace``/``sys.setprofile`` (coverage, the pure-Python profiler)
    or, from Python 3.12, a ``sys.monitoring`` tool (cProfile, coverage's sysmon core, debuggers)."""
    if sys.gettrace() is not None or sys.getprofile() is not None:
        return True
    monitoring = getattr(sys, "monitoring", None)
    return monitoring is not None and any(monitoring.get_tool(i) is not None for i in range(6))


def keep_bytecode() -> str | None:
    """Point ``sys.pycache_prefix`` at ``$XDG_CACHE_HOME/envvault/pycache`` (``~/.cache/...``) when this
    process would otherwise compile what it imports on every run; the folder used, or None (nothing
    changed). The folder must be this user's own, open to no one else, and no one else may replace it or a
    folder above it (bytecode there is run): ``_safe_above``."""
    if os.environ.get("ENVVAULT_BYTECODE_CACHE", "") == "0" or sys.pycache_prefix is not None:
        return None
    tag = sys.implementation.cache_tag
    if tag is None:
        return None
    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.exists(os.path.join(here, "__pycache__", f"cli.{tag}.pyc")):
        return None  # compiled at install (what it imports from elsewhere is the user's business)
    if not sys.dont_write_bytecode and os.access(here, os.W_OK):
        return None  # Python writes it beside the sources on the first run
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    if not os.path.isabs(base):
        return None  # no home folder
    folder = os.path.join(base, "envvault", "pycache")
    try:
        _make_private(folder)
        real = os.path.realpath(folder)
        st = os.lstat(real)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077 or not _safe_above(real):
        return None
    sys.pycache_prefix = real
    sys.dont_write_bytecode = False
    return real


def _make_private(folder: str) -> None:
    """Make ``folder`` and each missing folder above it with mode 0700 (``os.makedirs`` gives the ones above
    the umask's default: 0777 under umask 000)."""
    missing = []
    path = folder
    while not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass


def _safe_above(real: str) -> bool:
    """No one but this user (or root) can replace ``real`` or a folder above it: each is owned by this user or
    root, and one others may write is root's and sticky (``/tmp``). ``real`` has no symlink in it."""
    me = os.geteuid()
    path = os.path.dirname(real)
    while True:
        try:
            st = os.lstat(path)
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (me, 0):
            return False
        if st.st_mode & 0o022 and not (st.st_uid == 0 and st.st_mode & stat.S_ISVTX):
            return False
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent
