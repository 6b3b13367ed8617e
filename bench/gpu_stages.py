"""Issue 11's profile per stage on the GPU host's venv: what each primitive of a snap costs on one core,
and where a snap's threads wait (``ENVVAULT_STAGES=1``) at several reader counts.

Run on the device machine after ``bench/gpu_env_run.sh`` installed the carried wheels in /tmp/site
(``python3 bench/gpu_stages.py``); writes ``$OUT/gpu_stages.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import time

sys.path.insert(0, "/tmp/site")
import blake3  # noqa: E402
import zstandard  # noqa: E402
from pyfastcdc import FastCDC  # noqa: E402

OUT = os.environ.get("OUT") or "bench/out"
# argv: READERS[:NAMERS[:COMPRESSORS[:WRITERS[:IN_FLIGHT_MIB[:FRAMES_A_COMPRESSOR[:SWITCH_US]]]]]] to snap with (default 2 4 8, namers as envvault chooses); "--snaps-only" skips the
# one-core rates
ARGS = [a for a in sys.argv[1:] if a != "--snaps-only"]
READERS = ARGS or ["2", "4", "8"]
venv = sys.prefix
res: dict = {"venv": venv, "cores": os.cpu_count(), "primitives": {}, "snaps": []}


def save():
    with open(os.path.join(OUT, "gpu_stages.json"), "w") as f:
        json.dump(res, f, indent=1)


files = []
for d, _, names in os.walk(venv):
    for n in names:
        p = os.path.join(d, n)
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if os.path.isfile(p) and not os.path.islink(p):
            files.append((st.st_size, p))
files.sort(reverse=True)
total = sum(s for s, _ in files)
res["files"], res["bytes"] = len(files), total
res["largest"] = [[s, p[len(venv):]] for s, p in files[:15]]
big = [p for s, p in files if s >= 1 << 20]
res["bytes_in_files_over_1MiB"] = sum(s for s, p in files if s >= 1 << 20)
# one-core rates on the large files (first 1.5 GB of them), page cache warm
sample, got = [], 0
for s, p in files:
    if s < 1 << 20:
        break
    sample.append(p)
    got += s
    if got > 1500 << 20:
        break
if "--snaps-only" in sys.argv:
    sample = []
data = [open(p, "rb").read() for p in sample]
nbytes = sum(map(len, data))


def rate(name, fn):
    t = time.perf_counter()
    fn()
    dt = time.perf_counter() - t
    res["primitives"][name] = {"s": round(dt, 3), "GB_s": round(nbytes / dt / 1e9, 2)}
    print(f"{name:40s} {nbytes / dt / 1e9:6.2f} GB/s", flush=True)
    save()


def read_all():
    for p in sample:
        with open(p, "rb") as f:
            f.read()


def primitives():
    rate("read (python, warm)", read_all)
    rate("sha256", lambda: [hashlib.sha256(d).digest() for d in data])
    rate("blake3 (1 thread)", lambda: [blake3.blake3(d).digest() for d in data])
    cdc = FastCDC(avg_size=1 << 20, min_size=256 << 10, max_size=4 << 20)
    chunks = []
    rate("fastcdc cut", lambda: chunks.extend(bytes(c.data) for d in data for c in cdc.cut_buf(d)))
    rate("blake3 per chunk", lambda: [blake3.blake3(c).digest() for c in chunks])
    for lvl in (1, 2, 3):
        z = zstandard.ZstdCompressor(level=lvl)
        rate(f"zstd -{lvl} per chunk (1 thread)", lambda: [z.compress(c) for c in chunks])


if sample:
    primitives()
data = []  # free the sample

sp = sysconfig.get_paths()["purelib"]
for readers in READERS:
    readers, _, namers = readers.partition(":")
    namers, _, compressors = namers.partition(":")
    compressors, _, writers = compressors.partition(":")
    writers, _, tuning = writers.partition(":")
    env = dict(os.environ, ENVVAULT_STAGES="1", ENVVAULT_READERS=readers, ENVVAULT_HOME="/tmp/gst/vault",
               PYTHONPATH="/tmp/site")
    if namers:
        env["ENVVAULT_NAMERS"] = namers
    if compressors:
        env["ENVVAULT_COMPRESSORS"] = compressors
    if writers:
        env["ENVVAULT_WRITERS"] = writers
    subprocess.run(["rm", "-rf", "/tmp/gst"])
    t = time.perf_counter()
    cmd = ["/tmp/site/bin/envvault"]
    if tuning:  # IN_FLIGHT_MIB[:FRAMES_A_COMPRESSOR[:SWITCH_US]]: the pipeline's bounds, patched for this run
        mib, _, rest = tuning.partition(":")
        frames, _, switch = rest.partition(":")
        patch = ["import sys", "from envvault.vault import packs, threads"]
        if mib:
            patch.append(f"packs._IN_FLIGHT_BYTES = {int(mib)} << 20")
        if frames:
            patch.append(f"packs.PackWriter._in_flight_a_worker = {int(frames)}")
        if switch:
            patch.append(f"threads.SWITCH_INTERVAL = {int(switch)} / 1e6")
        patch += ["from envvault.cli import main", "sys.argv[0] = 'envvault'", "main()"]
        cmd = [sys.executable, "-c", "; ".join(patch)]
    proc = subprocess.Popen(cmd + ["snap", "--venv", venv, "--no-caches", "-m", "s"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.stdout.read(), proc.stderr.read()
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    p = subprocess.CompletedProcess(proc.args, os.waitstatus_to_exitcode(status), out, err)
    stages = [ln for ln in p.stderr.splitlines() if ln.startswith("envvault-stage")]
    stages.append(f"peak RSS: {ru.ru_maxrss / 1024:.0f} MB")
    res["snaps"].append({"readers": readers, "namers": namers or "default", "compressors": compressors or "default",
                         "writers": writers or "default", "tuning": tuning, "wall_s": round(wall, 2), "rc": p.returncode, "stages": stages,
                         "tail": p.stderr[-300:] if p.returncode else ""})
    print(f"readers {readers} namers {namers or 'default'} compressors {compressors or 'default'} writers {writers or 'default'} {tuning}: {wall:.2f} s rc {p.returncode}", *stages, sep="\n  ", flush=True)
    save()
