"""Guard leases (thirty-third session) checked on a real environment and a real S3 server: ``python
bench/lease_real_env_check.py VENV WORK``. Starts moto's standalone server on 127.0.0.1 (moto must be
importable), makes a bucket vault, and plays two nodes of it (each its own ``ENVVAULT_CACHE_DIR``, so its own
machine-local guard locks, as two hosts have). Touches VENV (one file is deleted by a guarded command; guard's
rollback must put it back); WORK is emptied. Prints one line a check (with its time) and exits non-zero when
one fails.

1. Node A snaps VENV into the bucket; node A's guard runs a command that has node B run ``gc --keep-last 0``,
   then deletes a file and fails. B's gc keeps A's "before" snapshot (A's lease), A's rollback puts the file
   back byte for byte, ``status`` on A says unchanged, no lease object is left.
2. A guard SIGKILLed while its command runs leaves its lease: a gc on the same host treats it as stale (its
   process is gone), drops it, and may drop that snapshot; the vault verifies.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from envcheck import ENVVAULT, Checks, purelib  # noqa: E402
from s3server import S3Server  # noqa: E402  (the tests' moto server)


def main() -> int:
    venv, work = Path(sys.argv[1]).absolute(), Path(sys.argv[2]).absolute()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    server = S3Server(work / "moto.log")
    try:
        return _checks(venv, work, server)
    finally:
        server.stop()


def _checks(venv: Path, work: Path, server: S3Server) -> int:
    server.bucket("vault")
    base = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "AWS_PROFILE")}
    base.update(server.env(), ENVVAULT_HOME="s3://vault/team")
    a = dict(base, ENVVAULT_CACHE_DIR=str(work / "node-a"))
    b = dict(base, ENVVAULT_CACHE_DIR=str(work / "node-b"))
    ev = ENVVAULT
    checks = Checks(a, work)
    say = checks.say

    def run(env, *args, check=True):
        return checks.run(*args, check=check, env=env)

    def leases() -> list[str]:
        return [k for k in server.keys("vault", "team/locks/") if "/lease-" in k]

    proc, t = run(a, "snap", "--venv", venv, "--no-caches", "-m", "older", "--json")
    files = json.loads(proc.stdout).get("files")
    print(f"     node A's first snap into the bucket: {t:.1f} s ({files} files)", flush=True)
    site = purelib(venv)
    victim = next(p for p in sorted(site.glob("*/__init__.py")) if p.stat().st_size > 100)
    digest = hashlib.sha256(victim.read_bytes()).hexdigest()

    # 1. A gc on node B while node A's guarded command runs.
    script = (f"import os, subprocess, sys; r = subprocess.run({ev!r} + ['gc', '--keep-last', '0', '--json'], "
              f"env={b!r}, capture_output=True, text=True); open({str(work / 'gc.json')!r}, 'w').write(r.stdout); "
              f"open({str(work / 'gc.err')!r}, 'w').write(r.stderr); "
              f"os.unlink({str(victim)!r}); sys.exit(1 if r.returncode == 0 else 9)")
    proc, t = run(a, "guard", "--venv", venv, "--yes", "--json", "--", sys.executable, "-c", script, check=False)
    doc = json.loads(proc.stdout or "{}")
    gc = json.loads((work / "gc.json").read_text() or "{}")
    say(bool(gc) and doc.get("before") in gc.get("kept_for_guards", ()),
        f"node B's gc --keep-last 0 kept node A's running guard's snapshot (removed {len(gc.get('removed_snapshots', ()))}, "
        f"kept for guards {len(gc.get('kept_for_guards', ()))}; {(work / 'gc.err').read_text().strip()[-200:]})")
    same = victim.exists() and hashlib.sha256(victim.read_bytes()).hexdigest() == digest
    say(proc.returncode == 1 and doc.get("outcome") == "restored" and same,
        f"node A's rollback put {victim.relative_to(site)} back byte for byte ({t:.1f} s for the guard; exit "
        f"{proc.returncode}, {doc.get('outcome')})")
    proc, t = run(a, "status", "--venv", venv, "--json", check=False)
    say(proc.returncode == 0 and json.loads(proc.stdout).get("empty") is True, f"status on node A: unchanged ({t:.2f} s)")
    left = leases()
    say(not left, f"no lease object left in the bucket ({left[:2]})")

    # 2. A guard killed mid-command leaves its lease; a gc on this host drops it (its process is gone).
    started = work / "started"
    killed = subprocess.Popen(ev + ["guard", "--venv", str(venv), "--yes", "--", sys.executable, "-c",
                                    f"import pathlib, time; pathlib.Path({str(started)!r}).touch(); time.sleep(600)"],
                              env=a, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, cwd=work)
    deadline = time.monotonic() + 600
    while not started.exists():
        if killed.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the guard to kill never ran its command")
        time.sleep(0.05)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    say(len(leases()) == 1, "a SIGKILLed guard left its lease")
    proc, t = run(b, "gc", "--keep-last", "1", "--json")
    gc = json.loads(proc.stdout)
    say(not gc["kept_for_guards"] and not leases(),
        f"a gc on the same host dropped the dead guard's lease and kept nothing for it ({t:.1f} s)")
    proc, t = run(b, "verify", "--json", check=False)
    say(proc.returncode == 0, f"verify on node B: ok ({t:.1f} s)")
    return checks.end()


if __name__ == "__main__":
    sys.exit(main())
