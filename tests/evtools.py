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
