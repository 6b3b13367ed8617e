"""Issue 4 figures: compile-cache snap and restore against tar + zstd, on the real H200 Inductor cache.

Every figure stands beside its anchor measured in the same run, interleaved (anchor, subject, anchor, ...)
so both see the same machine noise; each is the median of --runs runs (at least 3).

- snap wall: `envvault cache snap` (a fresh vault each run) vs `tar -cf - root | zstd -T0 -3`
- vault bytes: what that snap wrote to the vault vs the .tar.zst
- restore wall: `envvault cache restore --to` (a new folder) vs `zstd -dc | tar -x`
- unchanged cache: `envvault snap` of a small venv whose Inductor cache is the H200 root, minus the same snap
  with --no-caches (both with nothing changed since the last snap), and the archive step's own seconds
- precompiled headers: two ~154 MB headers in one cache, vault bytes vs `zstd -3` of each file alone.
  With a torch venv (--torch-python, else $ENVVAULT_TEST_TORCH_VENV) two real headers are built by torch's
  own `_precompile_header`; a synthetic pair (a header and a copy with 32 bytes changed) is measured too.

    python bench/bench_caches.py [--runs 3] [--json] [--torch-python PATH] [--work DIR] [--skip-pch]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import zstandard  # noqa: E402

from bench.common import (  # noqa: E402
    Figure, drop_dirty, envvault_cmd, ev_env, machine, median, report, run, save, timed,
)
from fixtures.machine import H200_CACHE_TAR  # noqa: E402

H200_TAR = H200_CACHE_TAR


def envvault_json(vault: Path, *args, env: dict | None = None) -> tuple[float, dict]:
    wall, proc = timed(envvault_cmd(vault, *args, "--json"), env=env or ev_env())
    return wall, json.loads(proc.stdout)


def vault_bytes(vault: Path) -> int:
    return sum(p.stat().st_size for sub in ("packs", "index", "snapshots") for p in (vault / sub).rglob("*")
               if p.is_file())


def extract_h200(work: Path) -> Path:
    src = work / "h200"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    with open(H200_TAR, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as stream:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            tar.extractall(src, filter="fully_trusted")
    return src / "torchinductor_root"


def bench_h200(work: Path, root: Path, runs: int) -> list[Figure]:
    archive = work / "h200.tar.zst"
    tar_walls, snap_walls, inproc, written = [], [], [], []
    vault = sid = None
    for i in range(runs):
        drop_dirty()
        w, _ = timed(f"tar -cf - -C '{root.parent}' '{root.name}' | zstd -T0 -3 -q -f -o '{archive}'")
        tar_walls.append(w)
        vault = work / f"vault-h200-{i}"
        shutil.rmtree(vault, ignore_errors=True)
        drop_dirty()
        w, out = envvault_json(vault, "cache", "snap", "--no-discover", "--cache-dir", root)
        snap_walls.append(w)
        inproc.append(out["seconds"])
        written.append(vault_bytes(vault))
        sid = out["id"]
    untar_walls, restore_walls, restore_inproc = [], [], []
    for _ in range(runs):
        dest = work / "untar"
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir()
        drop_dirty()
        w, _ = timed(f"zstd -dc '{archive}' | tar -x -C '{dest}'")
        untar_walls.append(w)
        dest = work / "restored"
        shutil.rmtree(dest, ignore_errors=True)
        drop_dirty()
        w, out = envvault_json(vault, "cache", "restore", sid, "--to", dest)
        assert out["caches"][0]["written_files"] == 671, out
        restore_walls.append(w)
        restore_inproc.append(out["caches"][0]["seconds"])
    anchor = "tar -cf - | zstd -T0 -3"
    return [
        Figure("H200 cache (671 files, 39 MB): snap wall (s)", median(snap_walls), "s", anchor, median(tar_walls),
               "<= 1.0x", 1.0, samples=snap_walls),
        Figure("H200 cache: snap, in process (s)", median(inproc), "s", anchor, median(tar_walls),
               notes="the snap's own seconds: the CLI wall less interpreter start-up and imports", samples=inproc),
        Figure("H200 cache: vault bytes (MB)", median(written) / 1e6, "MB", "that .tar.zst",
               archive.stat().st_size / 1e6, "<= 1.2x", 1.2),
        Figure("H200 cache: restore wall (s)", median(restore_walls), "s", "zstd -dc | tar -x",
               median(untar_walls), "<= 1.0x", 1.0, samples=restore_walls),
        Figure("H200 cache: restore, in process (s)", median(restore_inproc), "s", "zstd -dc | tar -x",
               median(untar_walls), notes="the restore's own seconds, without interpreter start-up and imports",
               samples=restore_inproc),
    ]


def bench_unchanged(work: Path, root: Path, runs: int) -> list[Figure]:
    venv = work / "venv"
    if not (venv / "bin" / "python").exists():
        run([sys.executable, "-m", "venv", str(venv)])
    vault = work / "vault-unchanged"
    shutil.rmtree(vault, ignore_errors=True)
    (work / "tmpdir").mkdir(exist_ok=True)
    env = {k: v for k, v in ev_env().items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_"))}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(root), TMPDIR=str(work / "tmpdir"), TRITON_CACHE_DIR=str(work / "no-t"),
               TORCH_EXTENSIONS_DIR=str(work / "no-x"), CUDA_CACHE_PATH=str(work / "no-c"))
    # The venv has no torch, so an environment's snap does not take a discovered Inductor cache (it could not
    # use it): the cache is named with --cache-dir, which is always taken.
    cache_dir = ("--cache-dir", str(root))
    envvault_json(vault, "snap", "--venv", venv, *cache_dir, env=env)  # store everything, fill the stat caches
    envvault_json(vault, "snap", "--venv", venv, "--no-caches", env=env)
    with_caches, without, step = [], [], []
    for _ in range(max(runs, 5)):
        w, _ = envvault_json(vault, "snap", "--venv", venv, "--no-caches", env=env)
        without.append(w)
        w, out = envvault_json(vault, "snap", "--venv", venv, *cache_dir, env=env)
        with_caches.append(w)
        doc = json.loads((vault / "snapshots" / f"{out['id']}.json").read_bytes())
        (entry,) = doc["caches"]
        assert entry["reused"] is True, entry
        step.append(entry["seconds"])
    added = median(with_caches) - median(without)
    return [
        Figure("unchanged H200 cache: time added to `envvault snap` (s)", max(added, 0.0), "s", goal="<= 0.050 s",
               limit=0.050, notes=f"median snap {median(with_caches):.3f} s with caches, "
               f"{median(without):.3f} s with --no-caches", samples=[round(a - b, 3) for a, b in zip(with_caches, without)]),
        Figure("unchanged H200 cache: archive step, in process (s)", median(step), "s", goal="<= 0.050 s", limit=0.050,
               samples=step),
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
    """Two precompiled headers built by torch's own code (its cmd-line hash differs, so two files)."""
    tmp = work / "pch-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    proc = run([python, "-c", PCH_CHILD, "a", "b"], env={**os.environ, "TMPDIR": str(tmp)}, check=False)
    if proc.returncode != 0:
        print(f"could not build real precompiled headers: {proc.stderr[-500:]}", file=sys.stderr)
        return None
    return [Path(p) for p in json.loads(proc.stdout.strip().splitlines()[-1])]


def pch_pair(work: Path, name: str, a: Path, b: Path, notes: str) -> Figure:
    root = work / f"pch-{name.replace(' ', '-')}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    shutil.copyfile(a, root / "one.h.gch")
    shutil.copyfile(b, root / "two.h.gch")
    vault = work / f"vault-{root.name}"
    shutil.rmtree(vault, ignore_errors=True)
    envvault_json(vault, "cache", "snap", "--no-discover", "--cache-dir", root)
    cctx = zstandard.ZstdCompressor(level=3, threads=-1)
    separate = sum(len(cctx.compress(p.read_bytes())) for p in (a, b))
    return Figure(f"two precompiled headers, {name} ({a.stat().st_size / 1e6:.0f} MB each): vault bytes (MB)",
                  vault_bytes(vault) / 1e6, "MB", "zstd -3 of each file alone", separate / 1e6, "<= 0.6x", 0.6,
                  notes=notes)


def bench_pch(work: Path, torch_python: Path | None) -> list[Figure]:
    figs = []
    pchs = real_pchs(work, torch_python) if torch_python else None
    if pchs:
        figs.append(pch_pair(work, "real", pchs[0], pchs[1],
                             "both built here by torch 2.13's _precompile_header from the same header: GCC's "
                             "output differs all through the file, so content-defined chunks cannot be shared"))
        base, what = pchs[0], "a real header"
    else:
        base, what = work / "generated.gch", "generated bytes (no torch venv given: no real header)"
        import random

        rnd = random.Random(0)
        words = [rnd.randbytes(rnd.randrange(4, 40)) for _ in range(5000)]
        base.write_bytes(b"".join(rnd.choices(words, k=7_000_000))[: 154 << 20])
    twin = work / "twin.gch"
    data = bytearray(base.read_bytes())
    for off in (4096, len(data) // 3, len(data) // 2 + 17, len(data) - 100):
        data[off : off + 8] = bytes(range(8, 0, -1))
    twin.write_bytes(data)
    figs.append(pch_pair(work, "synthetic twin", base, twin, f"{what} and a copy with 32 bytes changed in 4 places"))
    return figs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON document")
    default_torch = os.environ.get("ENVVAULT_TEST_TORCH_VENV")
    ap.add_argument("--torch-python", type=Path, default=Path(default_torch) / "bin" / "python" if default_torch else None)
    ap.add_argument("--work", type=Path, help="work folder, kept (default: a temp folder, removed)")
    ap.add_argument("--skip-pch", action="store_true", help="leave out the precompiled-header figures")
    args = ap.parse_args()
    runs = max(args.runs, 3)
    # As an installed envvault has them (pip compiles on install): without .pyc files every run would pay
    # for compiling the modules it imports (this machine sets PYTHONDONTWRITEBYTECODE).
    run([sys.executable, "-m", "compileall", "-q", str(Path(__file__).resolve().parent.parent / "envvault")])
    work = args.work or Path(tempfile.mkdtemp(prefix="evbench-caches-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        root = extract_h200(work)
        figs = bench_h200(work, root, runs) + bench_unchanged(work, root, runs)
        if not args.skip_pch:
            figs += bench_pch(work, args.torch_python)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    path = save(figs, "caches", {"runs": runs})
    if args.json:
        print(json.dumps({"machine": machine(), "runs": runs, "figures": [f.to_json() for f in figs]}, indent=1))
    else:
        report(figs, "compile caches")
        for f in figs:
            if f.notes:
                print(f"  {f.name}: {f.notes}")
        print(path)


if __name__ == "__main__":
    main()
