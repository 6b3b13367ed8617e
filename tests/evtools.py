"""Running the real envvault CLI in a subprocess, as users do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# Where the command keeps its bytecode when it has to (envvault/entry.py): outside any HOME a test makes, so
# tests that check a HOME stays untouched check envvault's own writes.
BYTECODE_CACHE = Path(os.environ.get("TMPDIR", "/tmp")) / f"envvault-tests-xdg-cache-{os.getuid()}"


def ev_env(vault: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "ENVVAULT_HOME")}
    env["ENVVAULT_HOME"] = str(vault)
    env.setdefault("XDG_CACHE_HOME", str(BYTECODE_CACHE))
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def ev(vault: Path, *args: str, check: bool = True, env: dict | None = None, timeout: float = 900,
       **popen) -> subprocess.CompletedProcess:
    """``python -m envvault *args`` with ``ENVVAULT_HOME=vault``; on failure the output is in the error."""
    proc = subprocess.run(
        [sys.executable, "-m", "envvault", *map(str, args)],
        capture_output=True, text=True, env=env or ev_env(vault), timeout=timeout, **popen,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"envvault {' '.join(map(str, args))} exited {proc.returncode}\n"
                             f"stdout: {proc.stdout}\nstderr: {proc.stderr}")
    return proc


def ev_json(vault: Path, *args: str, **kw) -> dict:
    proc = ev(vault, *args, "--json", **kw)
    return json.loads(proc.stdout)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """A failure the way users must see it: non-zero exit, one line on stderr, no traceback."""
    assert proc.returncode != 0, proc
    err = proc.stderr.strip()
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    for n in needles:
        assert n in err, (n, err)


def alive(pid: int) -> bool:
    """Process ``pid`` runs and is not a zombie (an orphan's zombie is reaped by init, maybe later)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def follows_backend(backend) -> bool:
    """``backend`` has every method ``envvault.vault.backend.Backend`` declares, each with its parameters (the
    protocol is a plain class at run time: envvault/runtime_types.py, so ``isinstance`` cannot tell)."""
    import inspect

    from envvault.vault.backend import Backend

    declared = {n: f for n, f in vars(Backend).items() if callable(f) and not n.startswith("_")}
    return bool(declared) and isinstance(getattr(backend, "location", None), str) and all(
        list(inspect.signature(getattr(backend, n)).parameters) == list(inspect.signature(f).parameters)[1:]
        for n, f in declared.items())


@contextmanager
def mounted(path: Path, *, tmpfs_size: str | None = None):
    """For the block, ``path`` is a tmpfs of ``tmpfs_size`` (a full disk), else a read-only bind of itself (a
    read-only filesystem: a container's image layer). Needs root, which CI has."""
    assert os.geteuid() == 0, "this test mounts a filesystem; CI runs as root"
    steps = ([["-t", "tmpfs", "-o", f"size={tmpfs_size}", "tmpfs", str(path)]] if tmpfs_size else
             [["--bind", str(path), str(path)], ["-o", "remount,bind,ro", str(path)]])
    subprocess.run(["mount", *steps[0]], check=True, capture_output=True)
    try:
        for step in steps[1:]:
            subprocess.run(["mount", *step], check=True, capture_output=True)
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def behind_a_gc(vault: str | Path, args, *, keep_last: int | None = 0, env: dict | None = None,
                holder_env: dict | None = None, meanwhile=None) -> tuple[int, str, str]:
    """``python -m envvault *args`` started while a real process holds the vault lock exclusively (as ``envvault
    gc`` does), checked to say on stderr that it waits; ``meanwhile()`` is called then, while it waits; then
    that process runs gc's own code (``collect_garbage(keep_last=...)``; none with ``keep_last=None``) under the
    lock it holds and lets go. ``vault``: a folder or an ``s3://`` address. Returns the command's (exit code,
    stdout, stderr)."""
    import select

    env = env or ev_env(Path(vault))
    run_gc = "" if keep_last is None else (
        "    v.lock = lambda *a, **k: contextlib.nullcontext(True)  # held already, by this process\n"
        f"    collect_garbage(v, keep_last={keep_last})\n")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import contextlib, sys\n"
        "from envvault.vault.store import Vault\n"
        "from envvault.vault.gc import collect_garbage\n"
        "v = Vault.open(sys.argv[1])\n"
        "with v.lock(exclusive=True):\n"
        "    print('held', flush=True)\n"
        "    sys.stdin.readline()\n" + run_gc +
        "print('done', flush=True)\n"), str(vault)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=holder_env or env)
    try:
        assert holder.stdout.readline() == "held\n"
        proc = subprocess.Popen([sys.executable, "-m", "envvault", *map(str, args)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready, _, _ = select.select([proc.stderr], [], [], 120)  # a bound: the note comes at once
        assert ready, "nothing on stderr while waiting for the lock"
        line = proc.stderr.readline()  # said while the lock is still held
        assert "waiting for the vault lock" in line and "Ctrl-C" in line, line
        assert proc.poll() is None  # still waiting
        if meanwhile is not None:
            meanwhile()
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline() == "done\n"
        out, err = proc.communicate(timeout=300)
    finally:
        holder.kill()
        holder.wait()
    return proc.returncode, out, err


def gc_keeping_none(report: Path, env: dict | None = None) -> str:
    """Python statements on one line (``pathlib``, ``subprocess``, ``sys`` imported) for a guarded command:
    ``envvault gc --keep-last 0 --json`` (in ``env``, else the command's own environment), its report
    written to ``report``, its success asserted."""
    in_env = "" if env is None else f"env={env!r}, "
    return (f"gc = subprocess.run([sys.executable, '-m', 'envvault', 'gc', '--keep-last', '0', '--json'], {in_env}"
            f"capture_output=True, text=True); pathlib.Path({str(report)!r}).write_text(gc.stdout); "
            f"assert gc.returncode == 0, gc.stderr")


def s3_node(s3_server, tmp_path: Path, name: str, url: str, endpoint: str | None = None) -> dict:
    """The environment of one node of a bucket vault: its own cache (and so its own machine-local state) for
    the vault at ``url`` on the test's S3 server (tests/s3server.py)."""
    env = ev_env(url, ENVVAULT_CACHE_DIR=str(tmp_path / f"cache-{name}"), **s3_server.env(endpoint))
    for k in ("AWS_PROFILE", "AWS_DEFAULT_REGION", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        env.pop(k, None)
    return env
