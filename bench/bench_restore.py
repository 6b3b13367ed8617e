"""Issue 3 and 11 figures: restore (torch swapped, torch deleted), --into, export, diff and status on a
torch 2.13.0+cpu + numpy venv.

    python bench/bench_restore.py [--venv PATH] [--runs 3]
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    Figure, bench_main, drop_dirty, envvault_cmd, ev_env, median, retire, run, site_packages, timed,
)


def _uv() -> str:
    return shutil.which("uv") or str(Path(sys.executable).parent / "uv")


def _swap_torch_build(venv: Path) -> int:
    """Make torch 'another build': rewrite its shared libraries in place (same names, other bytes)."""
    lib = site_packages(venv) / "torch" / "lib"
    n = 0
    for so in sorted(lib.glob("*.so*")):
        data = bytearray(so.read_bytes())
        for i in range(0, len(data), 4096):
            data[i] ^= 0xFF
        so.write_bytes(bytes(data))
        n += len(data)
    return n


def measure(venv: Path, runs: int = 3) -> list[Figure]:
    env = ev_env()
    uv = _uv()
    work = Path(tempfile.mkdtemp(prefix="evbench-restore-"))
    figs: list[Figure] = []
    try:
        copy = work / "venv"
        shutil.copytree(venv, copy, symlinks=True)
        vault = work / "vault"
        sid = json.loads(run(envvault_cmd(vault, "snap", "--venv", copy, "--no-caches", "--json"), env=env).stdout)["id"]
        sp = site_packages(copy)
        torch_dirs = ["torch", next(p.name for p in sp.glob("torch-*.dist-info"))]
        archive = work / "torch.tar.zst"
        run(f"tar -cf - -C '{sp}' {' '.join(torch_dirs)} | zstd -T0 -3 -q -f -o '{archive}'")
        wheel = next(Path("/opt/wheels").glob("torch-2.13.0+cpu-*.whl"), None)
        restore_walls, restore_backup_walls, untar_walls, uv_walls = [], [], [], []
        for _ in range(runs):
            _swap_torch_build(copy)
            drop_dirty()
            w, _ = timed(envvault_cmd(vault, "restore", sid, "--venv", copy, "--no-backup", "--no-caches", "--json"), env=env)
            restore_walls.append(w)
            _swap_torch_build(copy)
            drop_dirty()
            w, _ = timed(envvault_cmd(vault, "restore", sid, "--venv", copy, "--no-caches", "--json"), env=env)
            restore_backup_walls.append(w)
            out = work / "untar"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            drop_dirty()
            w, _ = timed(f"zstd -dc '{archive}' | tar -x -C '{out}'")
            untar_walls.append(w)
            if wheel is not None:
                target = work / "uvtarget"
                shutil.rmtree(target, ignore_errors=True)
                run([uv, "venv", "-q", "--python", copy / "bin" / "python", target])
                drop_dirty()
                w, _ = timed([uv, "pip", "install", "-q", "--no-cache", "--no-deps", "--python",
                              target / "bin" / "python", wheel], env={**os.environ, "UV_NO_CONFIG": "1"})
                uv_walls.append(w)
        # Issue 11: torch deleted (rm -rf site-packages/torch), restored; the same anchor, same run.
        rm_walls, rm_backup_walls, rm_untar, status_after = [], [], [], []
        for _ in range(runs):
            shutil.rmtree(sp / "torch")
            drop_dirty()
            w, _ = timed(envvault_cmd(vault, "restore", sid, "--venv", copy, "--no-backup", "--no-caches", "--json"), env=env)
            rm_walls.append(w)
            w, _ = timed(envvault_cmd(vault, "status", "--venv", copy, "--json"), env=env, check=False)
            status_after.append(w)
            shutil.rmtree(sp / "torch")
            drop_dirty()
            w, _ = timed(envvault_cmd(vault, "restore", sid, "--venv", copy, "--no-caches", "--json"), env=env)
            rm_backup_walls.append(w)
            out = work / "untar"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            drop_dirty()
            w, _ = timed(f"zstd -dc '{archive}' | tar -x -C '{out}'")
            rm_untar.append(w)
        figs.append(Figure("restore after rm -rf torch (--no-backup): wall (s)", median(rm_walls), "s",
                           "zstd -dc | tar -x of torch's files", median(rm_untar), "<= 1.0x", 1.0, samples=rm_walls))
        figs.append(Figure("restore after rm -rf torch, with the backup: wall (s)", median(rm_backup_walls), "s",
                           "zstd -dc | tar -x of torch's files", median(rm_untar), "<= 1.1x", 1.1,
                           samples=rm_backup_walls))
        figs.append(Figure("status right after that restore: wall (s)", median(status_after), "s", "", None,
                           "no rehash", samples=status_after))
        figs.append(Figure("restore, torch swapped for another build (--no-backup): wall (s)", median(restore_walls),
                           "s", "zstd -dc | tar -x of torch's files", median(untar_walls), "<= 1.0x", 1.0,
                           samples=restore_walls))
        figs.append(Figure("restore, same, with the backup snapshot first: wall (s)", median(restore_backup_walls),
                           "s", "zstd -dc | tar -x of torch's files", median(untar_walls), "(no goal)",
                           samples=restore_backup_walls))
        if uv_walls:
            figs.append(Figure("restore (--no-backup) vs uv pip install of torch's wheel, empty uv cache",
                               median(restore_walls), "s", "uv pip install torch wheel, --no-cache", median(uv_walls),
                               "< 1.0x", 1.0))
        # --into the whole venv vs uv pip install -r of the same set from a warm uv cache
        lock = work / "lock" / "pylock.toml"
        export_walls = []
        for _ in range(runs):
            shutil.rmtree(lock.parent, ignore_errors=True)
            drop_dirty()
            w, _ = timed(envvault_cmd(vault, "export", sid, "-o", lock, "--json"), env=env)
            export_walls.append(w)
        figs.append(Figure("export (every wheel rebuilt): wall (s)", median(export_walls), "s", goal="(device: <= 10 s)",
                           samples=export_walls))
        wheels = sorted((work / "lock" / "pylock.wheels").glob("*.whl"))
        req = work / "req.txt"
        req.write_text("\n".join(str(w) for w in wheels) + "\n")
        cache = work / "uvcache"
        warm_target = work / "warm"
        run([uv, "venv", "-q", "--python", copy / "bin" / "python", warm_target])
        run([uv, "pip", "install", "-q", "--cache-dir", cache, "--python", warm_target / "bin" / "python", "-r", req],
            env={**os.environ, "UV_NO_CONFIG": "1"})
        into_walls, uvr_walls, uvoff_walls = [], [], []
        for i in range(runs):
            target = work / f"into{i}"
            drop_dirty()
            w, _ = timed(envvault_cmd(vault, "restore", sid, "--into", target, "--no-caches", "--json"), env=env)
            into_walls.append(w)
            t2 = work / f"uvr{i}"
            run([uv, "venv", "-q", "--python", copy / "bin" / "python", t2])
            drop_dirty()
            w, _ = timed([uv, "pip", "install", "-q", "--cache-dir", cache, "--python", t2 / "bin" / "python", "-r", req],
                         env={**os.environ, "UV_NO_CONFIG": "1"})
            uvr_walls.append(w)
            t3 = work / f"uvoff{i}"  # issue 11's anchor: the exported wheels, offline, no cache to link from
            run([uv, "venv", "-q", "--python", copy / "bin" / "python", t3])
            drop_dirty()
            w, _ = timed([uv, "pip", "install", "-q", "--offline", "--no-deps", "--no-cache", "--python",
                          t3 / "bin" / "python", *wheels], env={**os.environ, "UV_NO_CONFIG": "1"})
            uvoff_walls.append(w)
            for tree in (target, t2, t3):
                retire(tree, work / "retired")  # no inode freed before the next round's runs
        shutil.rmtree(work / "retired", ignore_errors=True)
        figs.append(Figure("restore --into, whole venv vs uv install of the exported wheels: wall (s)",
                           median(into_walls), "s", "uv pip install --offline --no-deps --no-cache (exported wheels)",
                           median(uvoff_walls), "<= 1.0x", 1.0, samples=into_walls))
        figs.append(Figure("restore --into, whole venv: wall (s)", median(into_walls), "s",
                           "uv pip install -r (same wheels), warm uv cache", median(uvr_walls), "<= 2x", 2.0,
                           samples=into_walls))
        # status on the unchanged venv vs pip freeze
        run(envvault_cmd(vault, "status", "--venv", copy, "--json"), env=env, check=False)
        st_walls, pf_walls = [], []
        for _ in range(runs):
            w, _ = timed([copy / "bin" / "python", "-m", "pip", "freeze"])
            pf_walls.append(w)
            w, _ = timed(envvault_cmd(vault, "status", "--venv", copy, "--json"), env=env, check=False)
            st_walls.append(w)
        figs.append(Figure("status, unchanged torch venv: wall (s)", median(st_walls), "s", "pip freeze",
                           median(pf_walls), "<= 0.25x", 0.25, samples=st_walls))
        # diff of two 200-package snapshots
        from envvault.vault.store import Vault

        v = Vault.open(vault)
        base = v.load_snapshot(sid).doc
        proto = base["packages"][0]
        ids = []
        for variant in range(2):
            pkgs = []
            for k in range(200):
                p = dict(proto, name=f"pkg{k:03d}", version=f"1.{k}.{variant if k % 10 == 0 else 0}")
                pkgs.append(p)
            ids.append(v.commit_snapshot(dict(base, packages=pkgs, message=f"synthetic 200 #{variant}")))
        diff_walls = []
        for _ in range(max(runs, 5)):
            w, _ = timed(envvault_cmd(vault, "diff", ids[0], ids[1], "--json"), env=env)
            diff_walls.append(w)
        figs.append(Figure("diff of two 200-package snapshots: wall (s)", median(diff_walls), "s", goal="<= 0.150 s",
                           limit=0.150, samples=diff_walls))
        return figs
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    bench_main(measure, "restore", "restore / diff / status")
