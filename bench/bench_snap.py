"""Issue 2 and 11 figures: snap of a torch 2.13.0+cpu + numpy venv against tar|zstd, pip freeze and uv pip
freeze; status of the unchanged venv against pip freeze (the 2-core rows of issue 11; the device rows are
bench/gpu_env_run.py's).

    python bench/bench_snap.py [--venv PATH] [--runs 3]
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    Figure, bench_main, drop_dirty, du, envvault_cmd, ev_env, median, run, site_packages,
    timed, timed_rss,
)


def measure(venv: Path, runs: int = 3) -> list[Figure]:
    env = ev_env()
    sp = site_packages(venv)
    work = Path(tempfile.mkdtemp(prefix="evbench-"))
    try:
        # -- first full snap vs tar | zstd -T0 -3 of site-packages ------------------------------------
        tar_walls, snap_walls, rss, vault_bytes, archive = [], [], [], [], 0
        for i in range(runs):
            out = work / "anchor.tar.zst"
            drop_dirty()
            w, _ = timed(f"tar -cf - -C '{sp}' . | zstd -T0 -3 -q -f -o '{out}'")
            tar_walls.append(w)
            archive = out.stat().st_size
            out.unlink()
            vault = work / f"vault{i}"
            drop_dirty()
            w, r, _ = timed_rss(envvault_cmd(vault, "snap", "--venv", venv, "--no-caches", "--json"), env=env)
            snap_walls.append(w)
            rss.append(r)
            vault_bytes.append(du(vault) - du(vault / "state"))
            if i < runs - 1:
                shutil.rmtree(vault)
        vault = work / f"vault{runs - 1}"
        figs = [
            Figure("first full snap: wall (s)", median(snap_walls), "s", "tar -cf - site-packages | zstd -T0 -3",
                   median(tar_walls), "<= 1.0x", 1.0, samples=snap_walls),
            Figure("first full snap: vault bytes (MB)", median(vault_bytes) / 1e6, "MB", "that archive's bytes",
                   archive / 1e6, "<= 1.1x", 1.1),
            Figure("first full snap: peak RSS (MB)", max(rss) / 1e6, "MB", goal="<= 300 MB", limit=300),
        ]
        # -- second snap of the unchanged venv vs pip freeze ---------------------------------------------
        pip_walls, snap2_walls, added, status_walls, again_walls = [], [], [], [], []
        run(envvault_cmd(vault, "snap", "--venv", venv, "--no-caches", "--json"), env=env)  # settle caches
        for _ in range(runs):
            drop_dirty()
            w, _ = timed([venv / "bin" / "python", "-m", "pip", "freeze"])
            pip_walls.append(w)
            before = du(vault) - du(vault / "state")
            drop_dirty()
            w, proc = timed(envvault_cmd(vault, "snap", "--venv", venv, "--no-caches", "--json"), env=env)
            snap2_walls.append(w)
            added.append(du(vault) - du(vault / "state") - before)
            w, _ = timed(envvault_cmd(vault, "status", "--venv", venv, "--exit-code"), env=env)
            status_walls.append(w)
            # the next status, nothing between: answered from the verdict the last one left (envvault/quick.py)
            w, _ = timed(envvault_cmd(vault, "status", "--venv", venv, "--exit-code"), env=env)
            again_walls.append(w)
        figs += [
            Figure("second snap, unchanged venv: wall (s)", median(snap2_walls), "s", "pip freeze",
                   median(pip_walls), "<= 0.15x", 0.15, samples=snap2_walls),
            Figure("status, unchanged venv: wall (s)", median(status_walls), "s", "pip freeze",
                   median(pip_walls), "<= 0.15x", 0.15, samples=status_walls),
            Figure("status again, unchanged venv (the last status's verdict): wall (s)", median(again_walls), "s",
                   "pip freeze", median(pip_walls), "<= 0.15x", 0.15, samples=again_walls),
            Figure("second snap, unchanged venv: bytes added (KiB)", max(added) / 1024, "KiB", goal="<= 64 KiB",
                   limit=64),
        ]
        # -- lock-only snap vs uv pip freeze ------------------------------------------------------------
        uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
        lock_vault = work / "lockvault"
        drop_dirty()
        cold, _ = timed(envvault_cmd(lock_vault, "snap", "--venv", venv, "--lock-only", "--json"), env=env)
        uv_walls, lock_walls = [], []
        for _ in range(runs):
            w, _ = timed([uv, "pip", "freeze", "--python", venv / "bin" / "python"])
            uv_walls.append(w)
            drop_dirty()
            w, _ = timed(envvault_cmd(lock_vault, "snap", "--venv", venv, "--lock-only", "--json"), env=env)
            lock_walls.append(w)
        figs += [
            Figure("--lock-only snap: wall (s)", median(lock_walls), "s", "uv pip freeze", median(uv_walls),
                   "<= 2x", 2.0, notes=f"first lock-only snap of this venv (no stat cache yet): {cold:.3f} s",
                   samples=lock_walls),
        ]
        # -- the same packages installed as links into uv's cache (uv pip install --link-mode symlink) ------
        # Each file a symlink out of the environment: the snap checks its bytes against RECORD before storing
        # any (snap/manifests.py, _plan_linked_in), so it reads each file twice; the anchor follows the links.
        wheels = work / "export.wheels"
        run(envvault_cmd(vault, "export", "latest", "--venv", venv, "-o", work / "export"), env=env)
        linked = work / "linkedvenv"
        run([uv, "venv", "-q", "-p", venv / "bin" / "python", linked], env={**env, "UV_NO_CONFIG": "1"})
        run([uv, "pip", "install", "-q", "--python", linked / "bin" / "python", "--no-index", "--no-deps",
             "--find-links", wheels, "--link-mode", "symlink", "--cache-dir", work / "uvcache",
             *sorted(wheels.glob("*.whl"))], env={**env, "UV_NO_CONFIG": "1"})
        lsp = site_packages(linked)
        ltar, lsnap = [], []
        for i in range(runs):
            out = work / "linked.tar.zst"
            drop_dirty()
            w, _ = timed(f"tar -chf - -C '{lsp}' . | zstd -T0 -3 -q -f -o '{out}'")
            ltar.append(w)
            out.unlink()
            lvault = work / f"linkedvault{i}"
            drop_dirty()
            w, _ = timed(envvault_cmd(lvault, "snap", "--venv", linked, "--no-caches", "--json"), env=env)
            lsnap.append(w)
            shutil.rmtree(lvault)
        figs.append(Figure("first full snap, the same packages as links into uv's cache: wall (s)", median(lsnap), "s",
                           "tar -chf - (links followed) | zstd -T0 -3", median(ltar), "(no goal)", samples=lsnap,
                           notes="uv pip install --link-mode symlink of the wheels `envvault export` rebuilt; each "
                                 "file's bytes are checked against RECORD before any is stored, so each is read twice"))
        # -- after installing one small package ---------------------------------------------------------
        # a real small package from PyPI (or this machine's wheel cache): idna, about 70 KB as a wheel
        run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", work / "dl",
             "idna==3.10"])
        small = next((work / "dl").glob("idna-*.whl"))
        copy = work / "venvcopy"
        shutil.copytree(venv, copy, symlinks=True)
        small_vault = work / "smallvault"
        run(envvault_cmd(small_vault, "snap", "--venv", copy, "--no-caches", "--json"), env=env)
        run([uv, "pip", "install", "--python", copy / "bin" / "python", "--no-index", "--no-cache", small],
            env={**env, "UV_NO_CONFIG": "1"})
        proc = run(envvault_cmd(small_vault, "snap", "--venv", copy, "--no-caches", "--json"), env=env)
        new_bytes = json.loads(proc.stdout)["new_bytes"]
        figs.append(Figure("snap after installing one small package: bytes added", new_bytes, "B",
                           f"{small.name} (compressed) size", small.stat().st_size, "<= 2x", 2.0))
        return figs
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    bench_main(measure, "snap", "snap")
