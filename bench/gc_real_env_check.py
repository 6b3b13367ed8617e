"""The thirty-second session's two gc fixes, checked on a real environment (not a fixture): ``python
bench/gc_real_env_check.py VENV WORK``. Touches VENV (one file is deleted by a guarded command, and guard's
rollback must put it back); WORK is emptied and holds the vault. Prints one line a check and exits non-zero
when one fails.

1. A guarded command that runs ``envvault gc --keep-last 0`` and then fails: gc keeps the snapshot the
   running guard would roll back to, and the rollback puts the deleted file back (before: exit 4, no rollback).
   Then a guarded command that runs ``envvault guard`` of the same environment: the inner one runs its command
   as part of the outer guard (before: refused, exit 3).
2. A gc killed by SIGKILL part way (stopped after its first snapshot deletion, while another process lists the
   index, then killed with an index file gone and its pack still there): a snap by that process afterwards
   stores the objects again, so the next gc leaves no damaged snapshot (``verify --read-data``).
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
from envcheck import ENVVAULT, Checks, purelib  # noqa: E402


def main() -> int:
    venv, work = Path(sys.argv[1]).absolute(), Path(sys.argv[2]).absolute()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    vault = work / "vault"
    env = dict(os.environ, ENVVAULT_HOME=str(vault))
    env.pop("VIRTUAL_ENV", None)
    ev = ENVVAULT
    checks = Checks(env, work)
    say = checks.say

    def run(*args, check=True, extra=None):
        return checks.run(*args, check=check, env=dict(env, **(extra or {})))

    # 1. gc inside a guarded command.
    _, t = run("snap", "--venv", venv, "--no-caches", "-m", "older")
    site = purelib(venv)
    victim = next(p for p in sorted(site.glob("*/__init__.py")) if p.stat().st_size > 100)
    digest = hashlib.sha256(victim.read_bytes()).hexdigest()
    script = (f"import os, subprocess, sys; r = subprocess.run({ev!r} + ['gc', '--keep-last', '0', '--json'], "
              f"capture_output=True, text=True); open({str(work / 'gc.json')!r}, 'w').write(r.stdout); "
              f"os.unlink({str(victim)!r}); sys.exit(1)")
    proc, t = run("guard", "--venv", venv, "--yes", "--json", "--", sys.executable, "-c", script, check=False)
    doc = json.loads(proc.stdout or "{}")
    gc = json.loads((work / "gc.json").read_text() or "{}")
    say(proc.returncode == 1 and doc.get("outcome") == "restored",
        f"guard whose command ran gc --keep-last 0, then deleted {victim.relative_to(venv)} and failed: exit "
        f"{proc.returncode}, outcome {doc.get('outcome')}, {t:.1f} s; the command's gc removed "
        f"{len(gc.get('removed_snapshots', []))} snapshot(s), kept {gc.get('kept_snapshots')}")
    say(doc.get("before") not in gc.get("removed_snapshots", []), "the running guard's before snapshot was kept")
    say(victim.exists() and hashlib.sha256(victim.read_bytes()).hexdigest() == digest,
        "the deleted file is back, byte for byte")
    status, _ = run("status", "--venv", venv, "--exit-code", check=False)
    say(status.returncode == 0, f"status after the rollback: {status.stdout.strip()[:120]}")

    # 1b. A guard run by the guarded command, on the same environment: part of the outer guard.
    marker = work / "inner-ran"
    inner = ev + ["guard", "--venv", str(venv), "--yes", "--", sys.executable, "-c",
                  f"import pathlib; pathlib.Path({str(marker)!r}).touch()"]
    script = (f"import os, subprocess, sys; assert subprocess.run({inner!r}).returncode == 0; "
              f"os.unlink({str(victim)!r}); sys.exit(1)")
    proc, t = run("guard", "--venv", venv, "--yes", "--json", "--", sys.executable, "-c", script, check=False)
    doc = json.loads(proc.stdout or "{}")
    say(proc.returncode == 1 and doc.get("outcome") == "restored" and marker.exists()
        and "is guarded by the envvault guard that runs this command" in proc.stderr,
        f"a guard run by the guarded command ran its command as part of the outer guard, whose rollback "
        f"followed ({t:.1f} s)")
    say(hashlib.sha256(victim.read_bytes()).hexdigest() == digest, "the deleted file is back again")

    # 2. A gc killed part way, a reader that listed the index meanwhile.
    from envvault.snap import take_snapshot
    from envvault.vault.store import Vault

    os.environ["ENVVAULT_HOME"] = str(vault)
    run("gc", "--keep-last", "0")  # (guard's snapshots are ordinary ones now)
    run("snap", "--venv", venv, "--no-caches", "-m", "to be dropped")
    gcp = subprocess.Popen(ev + ["gc", "--keep-last", "0"], cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env=dict(env, ENVVAULT_TEST_CRASH_AT="gc_snapshot_removed:1:STOP,gc_index_removed"))
    _pid, how = os.waitpid(gcp.pid, os.WUNTRACED)
    say(os.WIFSTOPPED(how), "gc stopped after its first snapshot deletion")
    reader = Vault.open(vault)
    listed = len(reader.index())
    os.kill(gcp.pid, signal.SIGCONT)
    gcp.wait(timeout=600)
    say(gcp.returncode == -signal.SIGKILL, f"gc killed with an index file gone (the reader listed {listed} objects "
                                            "during it)")
    t = time.monotonic()
    again = take_snapshot(reader, venv, message="after a killed gc")
    t_snap = time.monotonic() - t
    _, t_gc = run("gc")
    verify, t_verify = run("verify", "--read-data", "--json", check=False)
    ok = verify.returncode == 0 and json.loads(verify.stdout).get("ok") is True
    say(ok and again.id in Vault.open(vault).snapshot_ids(),
        f"the reader's snap after the killed gc ({t_snap:.1f} s) survives the next gc ({t_gc:.1f} s): verify "
        f"--read-data {'ok' if ok else verify.stdout[-300:]} ({t_verify:.1f} s)")
    return checks.end()


if __name__ == "__main__":
    sys.exit(main())
