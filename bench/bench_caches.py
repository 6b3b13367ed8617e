"""Benchmark: compile-cache snap and restore against tar + zstd, on the real H200 Inductor cache.

Every figure stands beside its anchor, measured in the same run, interleaved (anchor, subject, anchor, ...)
so both see the same machine noise; each is the median of --runs runs (at least 3).

- snap wall: `envvault cache snap` (a fresh vault each run) vs `tar -cf - root | zstd -T0 -3`
- vault bytes: what that snap added to the vault vs the .tar.zst
- restore wall: `envvault cache restore --to` (an empty folder) vs `zstd -dc | tar -x`
- unchanged cache: `envvault snap` of a small venv with the H200 root as its Inductor cache, minus the same
  snap with --no-caches (both with nothing changed since the previous snap)
- precompiled headers: two ~154 MB headers in one cache, vault bytes vs `zstd -3` of each file alone.
  Real ones are built with torch's own `_precompile_header` when a torch venv is given (--torch-python,
  else $ENVVAULT_TEST_TORCH_VENV); a synthetic pair (one real or generated header and a copy with a few
  bytes changed) is always measured too, and labelled as such.

Usage: python bench/bench_caches.py [--runs 3] [--json] [--torch-python PATH] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import zstandard

ROOT = Path(__file__).resolve().parent.parent
H200_TAR = ROOT.parent / "shared" / "data" / "inductor-cache-h200-torch2.11.tar.zst"
PY = sys.executable


def sh(cmd: str, **kw) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, shell=True, check=True, **kw)
    return time.perf_counter() - t


def envvault(vault: Path, *args, env: dict | None = None) -> tuple[float, dict]:
    t = time.perf_counter()
    proc = subprocess.run([PY, "-m", "envvault", "--vault", str(vault), *map(str, args), "--json"],
                          capture_output=True, text=True, env=env or _env())
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"envvault {' '.join(map(str, args))} failed:\n{proc.stderr}")
    return wall, json.loads(proc.stdout)


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "ENVVAULT_HOME")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def vault_bytes(vault: Path) -> int:
    return sum(p.stat().st_size for sub in ("packs", "index", "snapshots") for p in (vault / sub).rglob("*") if p.is_file())


def drop(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def figure(name, value, unit, anchor, anchor_value, goal, note=""):
    ratio = value / anchor_value if anchor_value else None
    return {"figure": name, "value": value, "unit": unit, "anchor": anchor, "anchor_value": anchor_value,
            "ratio": None if ratio is None else round(ratio, 3), "goal": goal,
            "ok": None if goal is None or ratio is None else ratio <= goal, "note": note}


def bench_h200(work: Path, runs: int) -> list[dict]:
    src = work / "h200"
    drop(src)
    src.mkdir(parents=True)
    with open(H200_TAR, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as stream:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            tar.extractall(src, filter="fully_trusted")
    root = src / "torchinductor_root"
    archive = work / "h200.tar.zst"
    snap_walls, tar_walls, inproc, added = [], [], [], []
    sid = vault = None
    for i in range(runs):
        sh("sync")
        tar_walls.append(sh(f"tar -cf - -C {src} torchinductor_root | zstd -T0 -3 -q -f -o {archive}"))
        vault = work / f"vault-h200-{i}"
        drop(vault)
        sh("sync")
        wall, out = envvault(vault, "cache", "snap", "--no-discover", "--cache-dir", root)
        snap_walls.append(wall)
        inproc.append(out["seconds"])
        added.append(vault_bytes(vault))
        sid = out["id"]
    restore_walls, untar_walls = [], []
    for i in range(runs):
        dest = work / "untar"
        drop(dest)
        dest.mkdir()
        sh("sync")
        untar_walls.append(sh(f"zstd -dc {archive} | tar -x -C {dest}"))
        dest2 = work / "restored"
        drop(dest2)
        sh("sync")
        wall, out = envvault(vault, "cache", "restore", sid, "--to", dest2)
        restore_walls.append(wall)
        assert out["caches"][0]["written_files"] == 671, out
    anchor = "tar -cf - | zstd -T0 -3"
    med = statistics.median
    return [
        figure("H200 cache snap wall (CLI)", med(snap_walls), "s", anchor, med(tar_walls), 1.0),
        figure("H200 cache snap, in process", med(inproc), "s", anchor, med(tar_walls), None,
               "the snap's own seconds, without interpreter start-up"),
        figure("H200 cache vault bytes", med(added), "B", ".tar.zst bytes", archive.stat().st_size, 1.2),
        figure("H200 cache restore wall (CLI)", med(restore_walls), "s", "zstd -dc | tar -x", med(untar_walls), 1.0),
    ]


def bench_unchanged(work: Path, runs: int) -> list[dict]:
    venv = work / "venv"
    if not (venv / "bin" / "python").exists():
        subprocess.run([PY, "-m", "venv", str(venv)], check=True)
    root = work / "h200" / "torchinductor_root"
    vault = work / "vault-unchanged"
    drop(vault)
    env = _env(TORCHINDUCTOR_CACHE_DIR=str(root), TMPDIR=str(work / "tmpdir"), TRITON_CACHE_DIR=str(work / "none-t"),
               TORCH_EXTENSIONS_DIR=str(work / "none-x"), CUDA_CACHE_PATH=str(work / "none-c"))
    (work / "tmpdir").mkdir(exist_ok=True)
    envvault(vault, "snap", "--venv", venv, env=env)  # first snaps store everything and fill the stat caches
    envvault(vault, "snap", "--venv", venv, "--no-caches", env=env)
    with_c, without, inproc = [], [], []
    for _ in range(max(runs, 5)):
        w, _ = envvault(vault, "snap", "--venv", venv, "--no-caches", env=env)
        without.append(w)
        w, out = envvault(vault, "snap", "--venv", venv, env=env)
        with_c.append(w)
        doc = json.loads((vault / "snapshots" / f"{out['id']}.json").read_bytes())
        (entry,) = doc["caches"]
        assert entry["reused"] is True, entry
        inproc.append(entry["seconds"])
    med = statistics.median
    added = med(with_c) - med(without)
    return [
        figure("unchanged H200 cache: added to `envvault snap` (CLI)", max(added, 0.0), "s",
               "budget", 0.050, 1.0, f"snap {med(with_c):.3f}s with caches, {med(without):.3f}s --no-caches"),
        figure("unchanged H200 cache: archive step, in process", med(inproc), "s", "budget", 0.050, 1.0),
    ]


PCH_CHILD = r"""
import json, sys
from torch._inductor import codecache as cc
from torch._inductor.cpu_vec_isa import pick_vec_isa
cls = cc.CppPythonBindingsCodeCache
header = cls._get_uncompiled_header("cpu")
cmd = {**cls.cpp_compile_command_flags, "device_type": "cpu", "extra_flags": (), "use_relative_path": False,
       "vec_isa": pick_vec_isa()}
print(json.dumps([cc._precompile_header(header, "envvault bench " + tag, min_optimize=False, **cmd) + ".gch"
                  for tag in sys.argv[1:]]))
"""


def real_pchs(work: Path, python: Path) -> list[Path] | None:
    tmp = work / "pch-tmp"
    found = sorted((tmp / f"torchinductor_{os.environ.get('USER') or 'root'}").glob("precompiled_headers/*.gch"))
    if len(found) >= 2:
        return found[:2]
    drop(tmp)
    tmp.mkdir(parents=True)
    proc = subprocess.run([str(python), "-c", PCH_CHILD, "a", "b"], capture_output=True, text=True,
                          env={**os.environ, "TMPDIR": str(tmp)}, timeout=1200)
    if proc.returncode != 0:
        print(f"could not build real precompiled headers: {proc.stderr[-500:]}", file=sys.stderr)
        return None
    return [Path(p) for p in json.loads(proc.stdout.strip().splitlines()[-1])]


def pch_pair(work: Path, name: str, a: Path, b: Path, note: str) -> dict:
    root = work / f"pch-{name}"
    drop(root)
    root.mkdir()
    shutil.copyfile(a, root / "one.h.gch")
    shutil.copyfile(b, root / "two.h.gch")
    vault = work / f"vault-pch-{name}"
    drop(vault)
    envvault(vault, "cache", "snap", "--no-discover", "--cache-dir", root)
    cctx = zstandard.ZstdCompressor(level=3, threads=-1)
    separate = sum(len(cctx.compress(p.read_bytes())) for p in (a, b))
    size = a.stat().st_size
    return figure(f"two precompiled headers ({name}, {size / 1e6:.0f} MB each): vault bytes", vault_bytes(vault), "B",
                  "zstd -3 of each alone", separate, 0.6, note)


def bench_pch(work: Path, torch_python: Path | None) -> tuple[list[dict], list[str]]:
    notes, rows = [], []
    pchs = real_pchs(work, torch_python) if torch_python else None
    if pchs:
        rows.append(pch_pair(work, "real", pchs[0], pchs[1],
                             "built twice by torch's _precompile_header here; GCC output differs throughout"))
        base = pchs[0]
    else:
        notes.append("no torch venv: no real precompiled headers; the pair below is synthetic")
        base = work / "synthetic-base.gch"
        if not base.exists():
            import random

            rnd = random.Random(0)
            words = [bytes(rnd.randrange(256) for _ in range(rnd.randrange(4, 40))) for _ in range(5000)]
            base.write_bytes(b"".join(rnd.choice(words) for _ in range(7_000_000))[: 154 << 20])
    twin = work / "twin.gch"
    data = bytearray(base.read_bytes())
    for off in (4096, len(data) // 3, len(data) // 2 + 17, len(data) - 100):
        data[off : off + 8] = bytes(8 - i for i in range(8))
    twin.write_bytes(data)
    rows.append(pch_pair(work, "synthetic twin", base, twin,
                         f"{base.name if pchs else 'generated data'} and a copy with 32 bytes changed in 4 places"))
    return rows, notes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    ap.add_argument("--torch-python", type=Path,
                    default=Path(os.environ["ENVVAULT_TEST_TORCH_VENV"]) / "bin" / "python"
                    if os.environ.get("ENVVAULT_TEST_TORCH_VENV") else None)
    ap.add_argument("--work", type=Path, help="work folder (default: a temp folder, removed afterwards)")
    ap.add_argument("--skip-pch", action="store_true")
    args = ap.parse_args()
    runs = max(args.runs, 3)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-caches-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        rows = bench_h200(work, runs) + bench_unchanged(work, runs)
        notes: list[str] = []
        if not args.skip_pch:
            more, notes = bench_pch(work, args.torch_python)
            rows += more
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    doc = {"bench": "caches", "runs": runs, "python": platform.python_version(), "cpus": os.cpu_count(),
           "machine": platform.machine(), "figures": rows, "notes": notes}
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    print(f"{'figure':<62} {'value':>12} {'anchor':>12} {'ratio':>6} {'goal':>5}  anchor is")
    for r in rows:
        def fmt(v):
            return f"{v / 1e6:.2f} MB" if r["unit"] == "B" else f"{v * 1000:.0f} ms"
        goal = f"<={r['goal']}" if r["goal"] is not None else ""
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        flag = "" if r["ok"] is None else ("  ok" if r["ok"] else "  MISSED")
        print(f"{r['figure']:<62} {fmt(r['value']):>12} {fmt(r['anchor_value']):>12} {ratio:>6} {goal:>5}  {r['anchor']}{flag}")
        if r["note"]:
            print(f"    {r['note']}")
    for n in notes:
        print(f"note: {n}")


if __name__ == "__main__":
    main()
