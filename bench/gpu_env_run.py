"""Issue 11's figures on the GPU host's own venv, each beside its anchor in the same run.

Run on the device machine from the repository root (``bash bench/gpu_env_run.sh``): its ``python3`` is a real
pip-installed venv (torch 2.11.0+cu130, 197 packages, about 69,000 files, 7.3 GB), with no network and no
``zstd`` CLI, so the anchors compress with Python's ``zstandard`` (level 3, every core) behind ``tar``.
envvault and its dependencies come as cp312 wheels in ``.whl/`` (envvault's own wheel built fresh).

Rows (median of ``--repeat`` rounds, of at least 7 for the rows under a second; each round runs a row and its
anchor in turn, the order rotating; the page cache is warmed first, for both):

- first full snap vs ``tar -cf - VENV | zstd -3 -T0``; vault bytes vs that archive's bytes
- second snap, unchanged, and ``status`` unchanged vs ``pip freeze``; ``--lock-only`` snap vs ``uv pip freeze``
- restore after ``rm -rf site-packages/torch``, ``--no-backup`` and with the default backup, vs
  ``zstd -dc | tar -x`` of torch; ``status`` right after that restore
- ``restore --into`` a new venv vs ``uv pip install --offline --no-deps`` of the exported wheels; ``export``
- the H200 compile cache (``--cache-tar``): ``cache snap`` and ``cache restore`` vs tar|zstd and zstd -dc|tar

With ``--profile``, the first snap, a restore and ``--into`` also run under cProfile (the main thread's
cumulative and own times, top rows, in ``profile_*.txt``) and ``status`` under ``-X importtime``.
Everything goes to ``$OUT/gpu_env_run.json``, rewritten after every row, so a timeout keeps what was measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time

OUT = os.environ.get("OUT") or os.path.abspath("bench/out")
W = "/tmp/gev"
# Overridable for a local dry run: EV/UV (the commands), TOOL_PY (a python with envvault and zstandard).
EV = os.environ.get("EV", "/tmp/site/bin/envvault")
UV = os.environ.get("UV", "/tmp/site/bin/uv")
TOOL_PY = os.environ.get("TOOL_PY", "python3")
WHEELS = os.environ.get("WHEELS", os.path.abspath(".whl"))  # envvault's wheel and its dependencies'
ZSTD_C = ("import sys, zstandard; zstandard.ZstdCompressor(level=3, threads=-1)"
          ".copy_stream(sys.stdin.buffer, sys.stdout.buffer)")
ZSTD_D = "import sys, zstandard; zstandard.ZstdDecompressor().copy_stream(sys.stdin.buffer, sys.stdout.buffer)"

result: dict = {"machine": {}, "rows": [], "steps": [], "errors": []}


def save() -> None:
    with open(os.path.join(OUT, "gpu_env_run.json"), "w") as f:
        json.dump(result, f, indent=1)


def sh(cmd: str, *, env: dict | None = None, want: int | None = 0, name: str = "", cwd: str = W) -> dict:
    """Run one shell command; its wall time, exit code, peak RSS (the largest process of its tree, from
    wait4) and output tails become a step."""
    import tempfile
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        p = subprocess.Popen(["bash", "-c", cmd], stdout=out, stderr=err, env=env, cwd=cwd)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        o, e = out.read()[-800:], err.read()[-800:]
    step = {"name": name or cmd[:60], "cmd": cmd, "rc": p.returncode, "wall_s": round(wall, 3),
            "rss_mb": round(ru.ru_maxrss / 1024, 1),
            "stdout_tail": o.decode(errors="replace"), "stderr_tail": e.decode(errors="replace")}
    if want is not None and p.returncode != want:
        result["errors"].append(f"{step['name']}: exit {p.returncode} (want {want}): {step['stderr_tail'][-300:]}")
    result["steps"].append(step)
    save()
    return step


def timed(name: str, cmd: str, repeat: int, *, before: str | None = None, want: int | None = 0) -> list[float]:
    """The walls of ``repeat`` runs (``before`` runs untimed ahead of each, then a sync)."""
    walls = []
    for i in range(repeat):
        if before:
            sh(before, name=f"{name}: setup {i + 1}", want=None)
            os.sync()
        walls.append(sh(cmd, name=f"{name} {i + 1}", want=want)["wall_s"])
    return walls


def timed_rounds(specs: list[tuple], repeat: int) -> list[list[float]]:
    """Each (name, cmd, before) of ``specs`` run once a round, in turn, ``repeat`` rounds: an anchor and the
    rows measured against it alternate, so a drift of the machine (the disk's writeback, another tenant) falls
    on both, and the one that goes first moves round by round (the order rotates): on the device a write of
    gigabytes right after another ran 0.7-2.6 s slower whichever build it was (bench/results/issue11_device.md,
    seventh session). The walls of each, in the order of ``specs``."""
    walls: list[list[float]] = [[] for _ in specs]
    for i in range(repeat):
        for k in ((j + i) % len(specs) for j in range(len(specs))):
            name, cmd, before = specs[k]
            if before:
                sh(before, name=f"{name}: setup {i + 1}", want=None)
                os.sync()
            walls[k].append(sh(cmd, name=f"{name} {i + 1}", want=0)["wall_s"])
    return walls


def retire(*folders: str) -> str:
    """A shell command that puts finished trees away without freeing an inode before the next timed run:
    their files emptied (the blocks freed, the inodes kept) and each folder moved under ``W/retired``, removed
    once the rounds are done. The device's ext4 has no journal; there the kernel skips every inode freed in the
    last minutes when it picks one for a new file, scanning past them all on every create (ialloc.c,
    ``recently_deleted``), so a tree removed just before a timed ``--into`` or uv install slowed whichever came
    next by up to 2x (bench/gpu_into_fair.sh, bench/results/gpu_wchan_*.txt, gpu_into_fair_*.txt). A file with
    other names (uv's cache linked into a venv) is left whole: emptying it would empty them too."""
    return "; ".join(f"if [ -d {f} ]; then find {f} -type f -links 1 -print0 | xargs -0 -r truncate -s 0; "
                     f"mkdir -p {W}/retired && mv {f} $(mktemp -d -p {W}/retired); fi" for f in folders)


def row(figure: str, ours: list[float], anchor: list[float] | None, anchor_name: str, goal: str, **extra) -> None:
    med = statistics.median(ours)
    r = {"figure": figure, "envvault_s": med, "runs": ours, "anchor": anchor_name, "goal": goal, **extra}
    if anchor:
        am = statistics.median(anchor)
        r.update(anchor_s=am, anchor_runs=anchor, ratio=round(med / am, 2) if am else None)
    result["rows"].append(r)
    save()
    print(f"{figure:58s} {med:8.2f} s  {anchor_name}: "
          f"{(str(r.get('anchor_s')) + ' s') if anchor else '-':>10}  ratio {r.get('ratio', '-')}  goal {goal}",
          flush=True)


def profile(name: str, args: str, before: str | None = None) -> None:
    """One command under cProfile (main thread): cumulative and own time, top 40 each."""
    if before:
        sh(before, name=f"profile {name}: setup", want=None)
    prof = os.path.join(W, f"{name}.prof")
    sh(f"{TOOL_PY} -m cProfile -o {prof} -m envvault {args}", name=f"profile {name}", want=None)
    import io
    import pstats
    buf = io.StringIO()
    try:
        st = pstats.Stats(prof, stream=buf)
        st.sort_stats("cumulative").print_stats(40)
        st.sort_stats("tottime").print_stats(30)
    except Exception as err:  # a profile that failed to write is a note, not a stop
        buf.write(f"no profile: {err!r}\n")
    with open(os.path.join(OUT, f"profile_{name}.txt"), "w") as f:
        f.write(buf.getvalue())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--cache-tar", default="")
    ap.add_argument("--skip", default="", help="comma-separated row groups to skip: snap,fast,system,restore,cache,export,into")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    os.makedirs(OUT, exist_ok=True)
    shutil.rmtree(W, ignore_errors=True)
    os.makedirs(W)
    venv = sys.prefix
    sp = sysconfig.get_paths()["purelib"]
    base = getattr(sys, "_base_executable", sys.executable)
    os.environ.update(ENVVAULT_HOME=f"{W}/vault")
    if "EV" not in os.environ:  # the carried wheels, installed by gpu_env_run.sh
        os.environ.update(PYTHONPATH="/tmp/site", PATH=f"/tmp/site/bin:{os.environ['PATH']}")
    os.environ.pop("VIRTUAL_ENV", None)
    result["machine"] = {"cores": os.cpu_count(), "venv": venv, "python": sys.version.split()[0],
                         "files": sum(len(f) for _, _, f in os.walk(venv)), "repeat": a.repeat,
                         # a slim image: no compiled stdlib, and nothing compiled at run time is kept
                         "stdlib_bytecode": os.path.exists(__import__("dataclasses").__cached__),
                         "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE", "")}
    save()
    r = a.repeat
    rc = max(r, 7)  # rows under a second each (start-up bound, noisy): more rounds cost little

    # Warm the page cache for everyone: read the venv once.
    sh(f"tar -cf - -C {venv} . | cat >/dev/null", name="warm page cache")

    if "snap" not in skip:
        if a.profile:
            profile("snap_full", f"snap --venv {venv} -m profiled", before=f"rm -rf {W}/vault")
        anchor, snaps = timed_rounds([
            ("anchor tar|zstd -3 venv", f"tar -cf - -C {venv} . | {TOOL_PY} -c '{ZSTD_C}' >{W}/venv.tar.zst", None),
            ("first full snap", f"{EV} snap --venv {venv} -m full", f"rm -rf {W}/vault"),
        ], r)
        rss = max(st["rss_mb"] for st in result["steps"] if st["name"].startswith("first full snap "))
        row("first full snap (page cache warm)", snaps, anchor, "tar | zstd -3 on all cores", "<= 1.0x",
            rss_mb=rss, rss_goal="<= 300 MB")
        vb = int(subprocess.run(["du", "-sb", f"{W}/vault"], capture_output=True, text=True).stdout.split()[0])
        ab = os.path.getsize(f"{W}/venv.tar.zst")
        result["rows"].append({"figure": "vault bytes", "envvault_bytes": vb, "anchor_bytes": ab,
                               "ratio": round(vb / ab, 3), "goal": "<= 1.0x"})
        print(f"vault bytes {vb / 1e9:.2f} GB  archive {ab / 1e9:.2f} GB  ratio {vb / ab:.3f}", flush=True)
        sh(f"{EV} tag latest full", name="tag full")
    else:
        sh(f"{EV} snap --venv {venv} -m full && {EV} tag latest full", name="snap (setup)")

    if "fast" not in skip:
        # Cheap rows: at least 7 rounds, each beside its anchor in turn (a first run's cold start is one of 7).
        freeze, again, stat, dif = timed_rounds([
            ("pip freeze", f"{sys.executable} -m pip freeze", None),
            ("second snap", f"{EV} snap --venv {venv} -m again", None),
            ("status", f"{EV} status --venv {venv} --exit-code", None),
            ("diff", f"{EV} diff full current --exit-code", None),
        ], rc)
        row("second snap, unchanged", again, freeze, "pip freeze", "<= 0.15x")
        row("status, unchanged", stat, freeze, "pip freeze", "<= 0.15x")
        # Status after status, no snapshot between (each snapshot moves the vault's side of a verdict, so the
        # rounds above measure the full command every time): from the second on, the quick status
        # (envvault/quick.py) answers from the verdict the first one recorded.
        freeze_q, stat_q = timed_rounds([
            ("pip freeze (status again rows)", f"{sys.executable} -m pip freeze", None),
            ("status again", f"{EV} status --venv {venv} --exit-code", None),
        ], rc)
        row("status, unchanged, again (the verdict of the last status)", stat_q, freeze_q, "pip freeze", "<= 0.15x")
        uvf, lo = timed_rounds([
            ("uv pip freeze", f"{UV} pip freeze --python {sys.executable}", None),
            ("lock-only snap", f"{EV} snap --venv {venv} --lock-only -m lo", None),
        ], rc)
        row("--lock-only snap", lo, uvf, "uv pip freeze", "<= 2x")
        row("diff full current, unchanged", dif, freeze, "pip freeze", "-")
        # envvault installed in a venv of its own (``uv tool install --compile-bytecode`` style): its start-up
        # runs none of the measured venv's .pth files (numba's imports importlib.resources: 40 ms here). The
        # bytecode is compiled at install, as a careful user would: this host sets PYTHONDONTWRITEBYTECODE=1
        # (without it, envvault keeps its bytecode in its cache folder from the second run: envvault/entry.py)
        tool = f"{W}/tool"
        st = sh(f"{base} -m venv --without-pip {tool} && {UV} pip install -q --offline --no-index --no-deps "
                f"--compile-bytecode --python {tool}/bin/python {WHEELS}/*.whl", name="envvault in a venv of its own (setup)", want=None)
        if st["rc"] == 0:
            freeze2, again2, stat2 = timed_rounds([
                ("pip freeze (own venv rows)", f"{sys.executable} -m pip freeze", None),
                ("second snap (own venv)", f"env -u PYTHONPATH {tool}/bin/envvault snap --venv {venv} -m again", None),
                ("status (own venv)", f"env -u PYTHONPATH {tool}/bin/envvault status --venv {venv} --exit-code", None),
            ], rc)
            row("second snap, unchanged, envvault in its own venv", again2, freeze2, "pip freeze", "<= 0.15x")
            row("status, unchanged, envvault in its own venv", stat2, freeze2, "pip freeze", "<= 0.15x")
            freeze3, stat3 = timed_rounds([
                ("pip freeze (own venv, status again rows)", f"{sys.executable} -m pip freeze", None),
                ("status again (own venv)", f"env -u PYTHONPATH {tool}/bin/envvault status --venv {venv} --exit-code", None),
            ], rc)
            row("status, unchanged, again, envvault in its own venv", stat3, freeze3, "pip freeze", "<= 0.15x")
            uvf2, lo2 = timed_rounds([
                ("uv pip freeze (own venv rows)", f"{UV} pip freeze --python {sys.executable}", None),
                ("lock-only snap (own venv)", f"env -u PYTHONPATH {tool}/bin/envvault snap --venv {venv} --lock-only -m lo", None),
            ], rc)
            row("--lock-only snap, envvault in its own venv", lo2, uvf2, "uv pip freeze", "<= 2x")
        if a.profile:
            sh(f"{TOOL_PY} -X importtime -m envvault status --venv {venv} 2>{OUT}/importtime_status.txt",
               name="importtime status", want=None)
            profile("status", f"status --venv {venv}")

    if "system" not in skip:  # issue 13 once on this host: the base interpreter is a system Python
        for name, cmd in (("system snap", f"{EV} snap --python {base} -m system"),
                          ("system second snap", f"{EV} snap --python {base} -m again"),
                          ("system status", f"{EV} status --python {base} --exit-code")):
            st = sh(cmd, name=name)
            print(f"{name:58s} {st['wall_s']:8.2f} s  rc {st['rc']}  {st['stdout_tail'].strip()[-150:]}", flush=True)

    if "restore" not in skip:
        torch_dir = os.path.join(sp, "torch")
        sh(f"tar -cf - -C {sp} torch | {TOOL_PY} -c '{ZSTD_C}' >{W}/torch.tar.zst", name="torch archive (setup)")
        if a.profile:
            profile("restore_torch", f"restore full --venv {venv} --no-backup", before=f"rm -rf {torch_dir}")
        # ENVVAULT_STAGES=1: the restore phases on stderr
        anchor, nb, bk = timed_rounds([
            ("anchor zstd -dc|tar -x torch", f"{TOOL_PY} -c '{ZSTD_D}' <{W}/torch.tar.zst | tar -xf - -C {sp}",
             f"rm -rf {torch_dir}"),
            ("restore --no-backup", f"ENVVAULT_STAGES=1 {EV} restore full --venv {venv} --no-backup", f"rm -rf {torch_dir}"),
            ("restore (backup)", f"ENVVAULT_STAGES=1 {EV} restore full --venv {venv}", f"rm -rf {torch_dir}"),
        ], r)
        row("restore after rm -rf torch, --no-backup", nb, anchor, "zstd -dc | tar -x of torch", "<= 1.0x")
        row("restore after rm -rf torch, default backup", bk, anchor, "zstd -dc | tar -x of torch", "<= 1.1x")
        # Status right after a restore, then the next one, beside pip freeze: a fresh restore a round (the
        # restore leaves what the status reads: its stat cache, its verdict), at least 5 rounds, since one
        # sample of a 0.1-0.2 s command on this host spreads by half its value.
        st, st2, freeze = [], [], []
        for i in range(max(r, 5)):
            sh(f"rm -rf {torch_dir} && {EV} restore full --venv {venv} --no-backup", name=f"restore before status {i + 1}")
            os.sync()
            st += timed("status right after a restore", f"{EV} status --venv {venv} --exit-code", 1)
            st2 += timed("the next status after a restore", f"{EV} status --venv {venv} --exit-code", 1)
            freeze += timed("pip freeze (again)", f"{sys.executable} -m pip freeze", 1)
        row("status right after a restore", st, freeze, "pip freeze", "<= 0.15x")
        row("the next status after a restore", st2, freeze, "pip freeze", "<= 0.15x")

    if "cache" not in skip and a.cache_tar:
        c = f"{W}/cache"
        sh(f"rm -rf {c} && mkdir -p {c} && {TOOL_PY} -c '{ZSTD_D}' <{a.cache_tar} | tar -xf - -C {c}", name="cache (setup)")
        sh(f"tar -cf - -C {c} . | cat >/dev/null", name="warm cache")
        anchor, snaps = timed_rounds([
            ("anchor tar|zstd cache", f"tar -cf - -C {c} . | {TOOL_PY} -c '{ZSTD_C}' >{W}/cache.tar.zst", None),
            ("cache snap", f"{EV} cache snap --no-discover --cache-dir {c} -m c", None),
        ], rc)
        row("compile cache snap", snaps, anchor, "tar | zstd -3", "<= 1.0x")
        anchor_r, rest = timed_rounds([
            ("anchor zstd -dc|tar cache", f"{TOOL_PY} -c '{ZSTD_D}' <{W}/cache.tar.zst | tar -xf - -C {c}",
             f"rm -rf {c} && mkdir -p {c}"),
            ("cache restore", f"{EV} cache restore --to {c}", f"rm -rf {c}"),
        ], rc)
        row("compile cache restore", rest, anchor_r, "zstd -dc | tar -x", "<= 1.0x")

    export = f"{EV} export full -o {W}/exp/pylock.toml"
    if "export" not in skip:
        # Its context: the same bytes written by a plain copy of its wheels, in the same rounds (no goal: the
        # export's goal is 10 s; the copy says how fast this host's disk writes them).
        exp, cpy = timed_rounds([
            ("export", export, f"rm -rf {W}/exp"),
            ("anchor cp -r of the exported wheels", f"cp -r {W}/exp {W}/exp-copy",
             f"rm -rf {W}/exp-copy; [ -d {W}/exp ] || {export}"),
        ], r)
        sh(f"rm -rf {W}/exp-copy", name="tidy", want=None)
        row("export (all wheels)", exp, cpy, "cp -r of its wheels (the same bytes written)", "<= 10 s")

    if "into" not in skip:
        if a.profile:
            profile("into", f"restore full --into {W}/into-prof")
        if not os.path.isdir(f"{W}/exp"):
            sh(export, name="export (setup)", want=0)
        # ENVVAULT_STAGES=1: the verification's seconds on stderr
        into, uvi = timed_rounds([
            ("restore --into", f"ENVVAULT_STAGES=1 {EV} restore full --into {W}/into", retire(f"{W}/into", f"{W}/uvv")),
            ("uv pip install exported wheels",
             f"{UV} pip install -q --offline --no-deps --python {W}/uvv/bin/python {W}/exp/pylock.wheels/*.whl",
             f"{retire(f'{W}/into', f'{W}/uvv')}; {UV} venv -q --python {base} {W}/uvv"),
        ], r)
        sh(f"rm -rf {W}/retired", name="tidy", want=None)
        sh(f"rm -rf {W}/uvv && {EV} restore full --into {W}/into-check && "
           f"{W}/into-check/bin/python -c 'import torch; print(torch.__version__, torch.cuda.is_available())'",
           name="torch in --into venv", want=None)
        sh(f"rm -rf {W}/into-check {W}/into", name="tidy", want=None)
        row("restore --into whole venv", into, uvi, "uv pip install --offline --no-deps of exported wheels", "<= 1.0x")

    sh(f"{EV} verify", name="verify vault", want=0)
    print("errors:", len(result["errors"]))
    for e in result["errors"]:
        print("  ", e[:400])
    save()
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
