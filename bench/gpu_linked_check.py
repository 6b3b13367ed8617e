"""The thirty-eighth session's capability once on the GPU host's real venv: every package of it installed the
way pdm installs with its cache on (each file a symlink into its package cache, RECORD rows ``sha256=``:
``fixtures.pdm_link_install``), from the wheels ``envvault export`` rebuilt (``bench/gpu_env_run.py``'s
``/tmp/gev/exp``); snapped, the cache pruned, ``status``, ``restore latest``, torch imported. Before that
session every snap of such an environment failed (its RECORDs garbled). Not a figure against an anchor: a
check, its walls printed for the note. Run from the repository root after ``gpu_env_run.sh`` with the carried
wheels on ``PYTHONPATH`` (``bench/gpu_linked_check.sh``); writes ``$OUT/linked_check.json``. ``--ab DIR``:
first, ``--rounds`` first snaps of the linked venv by the envvault installed in ``DIR`` (an older build) and
by this one, alternately, each into a vault of its own, their walls in the JSON (``ab``)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fixtures.venvs import pdm_link_install, site_packages  # noqa: E402

W = Path("/tmp/glc")
OUT = Path(os.environ.get("OUT", "bench/out"))


def run(name: str, cmd: list[str], out: dict) -> subprocess.CompletedProcess:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    out[name] = {"wall_s": round(time.perf_counter() - t, 3), "rc": proc.returncode,
                 "stdout_tail": proc.stdout[-1500:], "stderr_tail": proc.stderr[-1500:]}
    print(f"{name}: rc {proc.returncode}, {out[name]['wall_s']} s", flush=True)
    return proc


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--ab", default="")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    wheels = sorted(glob.glob("/tmp/gev/exp/**/*.whl", recursive=True))
    out: dict = {"wheels": len(wheels)}
    if not wheels:
        print("no exported wheels under /tmp/gev/exp: run gpu_env_run.sh first")
        return 1
    shutil.rmtree(W, ignore_errors=True)
    W.mkdir()
    venv, cache, vault = W / "v", W / "pdm-cache", W / "vault"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    t = time.perf_counter()
    failed = []
    for wheel in wheels:
        try:
            pdm_link_install(venv, wheel, cache)
        except (ValueError, OSError) as err:
            failed.append(f"{os.path.basename(wheel)}: {err}")
    out["install_s"] = round(time.perf_counter() - t, 3)
    out["install_failed"] = failed
    links = sum(1 for p in site_packages(venv).rglob("*") if p.is_symlink())
    out["links"] = links
    print(f"installed {len(wheels) - len(failed)} wheels as {links} links in {out['install_s']} s; failed: {failed[:5]}")
    ev = [sys.executable, "-m", "envvault", "--vault", str(vault)]
    if args.ab:
        ab: dict = {"old": [], "new": []}
        for n in range(args.rounds):
            for which in ("old", "new"):
                shutil.rmtree(W / "ab-vault", ignore_errors=True)
                env = dict(os.environ, PYTHONPATH=args.ab if which == "old" else os.environ.get("PYTHONPATH", ""))
                t = time.perf_counter()
                proc = subprocess.run([sys.executable, "-m", "envvault", "--vault", str(W / "ab-vault"), "snap",
                                       "--no-caches", "--venv", str(venv)], capture_output=True, text=True, env=env,
                                      cwd="/tmp")
                ab[which].append(round(time.perf_counter() - t, 3))
                print(f"first snap, linked, {which} round {n + 1}: {ab[which][-1]} s (rc {proc.returncode})", flush=True)
        shutil.rmtree(W / "ab-vault", ignore_errors=True)
        out["ab"] = ab
    probe = [str(venv / "bin" / "python"), "-c", "import torch; print(torch.__version__, torch.cuda.is_available())"]
    run("import before", probe, out)
    snap = run("snap (first, linked)", ev + ["snap", "--no-caches", "--json", "--venv", str(venv)], out)
    if snap.returncode == 0:
        doc = json.loads(snap.stdout)
        out["snap_files"], out["snap_bytes"], out["snap_warnings"] = doc["files"], doc["bytes"], doc["warnings"][:10]
    run("status (unchanged)", ev + ["status", "--json", "--venv", str(venv)], out)
    shutil.rmtree(cache)  # ``pdm cache clear``
    run("import after the cache is pruned", probe, out)
    st = run("status (cache pruned)", ev + ["status", "--json", "--venv", str(venv)], out)
    if st.returncode in (0, 1) and st.stdout.strip().startswith("{"):
        out["changed_packages"] = len(json.loads(st.stdout)["packages"]["changed"])
    res = run("restore latest --no-backup", ev + ["restore", "latest", "--no-backup", "--json", "--venv", str(venv)], out)
    if res.returncode in (0, 1) and res.stdout.strip().startswith("{"):
        doc = json.loads(res.stdout)
        out["restore_verified"], out["restore_written"] = doc.get("verified"), doc.get("written_files")
    run("import after the restore", probe, out)
    run("status after the restore", ev + ["status", "--json", "--venv", str(venv)], out)
    out["links_after"] = sum(1 for p in site_packages(venv).rglob("*") if p.is_symlink())
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "linked_check.json").write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if not isinstance(v, dict)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
