"""The floors under the first snap and ``restore --into`` on the device (issue 11): what the work envvault must
do costs with no pipeline around it, beside the anchors, in the same call.

- ``tar -cf - | cat >/dev/null``: reading the venv's files in one stream (tar's own floor).
- ``tar | zstd -3`` (the first snap's anchor, zstandard with every core).
- Python threads (one a core) reading every file in 1 MiB pieces and doing to each piece part of what a first
  snap does: sha256 (the RECORD check); zstd level 3; BLAKE3 and zstd; sha256, BLAKE3 and zstd (all of it):
  every file on its own, no order, no output, no dedup, no manifests.
- With ``EV`` (an envvault command) set, the first snap itself (``--no-caches``, a fresh vault each run).
  Every row ``FLOOR_ROUNDS`` times (3), the order rotating round by round; medians, and each row's ratio to
  the anchor of its own round.
- Where uv's cache lies (its file system and the one of /tmp) and the kernel's dirty-page limits: uv's
  install (the anchor of ``--into``) links or copies from its cache; envvault writes every byte.
- ``dd`` of 2 GiB into /tmp, page cache only and then with ``fdatasync``: the disk's write speed.
- With ``EV`` set and ``INTO`` not 0: the venv snapped and exported, then, 2 rounds in turn, uv's install of
  the exported wheels as ``--into``'s anchor runs it (uv's default link mode) and with ``--link-mode copy``,
  and ``restore --into``; the link count of the largest file each left says whether uv linked or copied.

Usage (device, with the carried wheels installed as gpu_env_run.sh does): ``python3 bench/gpu_floors.py``;
writes ``$OUT/gpu_floors.txt``.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import subprocess
import sys
import threading
import time

OUT = os.environ.get("OUT", "/tmp")
UV = os.environ.get("UV", "/tmp/site/bin/uv")
TOOL_PY = os.environ.get("TOOL_PY", sys.executable)
PIECE = 1 << 20
lines: list[str] = []


def say(text: str) -> None:
    print(text, flush=True)
    lines.append(text)
    with open(os.path.join(OUT, "gpu_floors.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def sh(cmd: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    return time.perf_counter() - t0, (p.stdout + p.stderr).strip()


def files_of(root: str) -> list[tuple[str, int]]:
    out = []
    for dp, dn, fn in os.walk(root):
        for name in fn:
            p = os.path.join(dp, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if st.st_mode & 0o170000 == 0o100000:
                out.append((p, st.st_size))
    out.sort(key=lambda f: -f[1])  # the largest first: the threads end together
    return out


def parallel(files: list[tuple[str, int]], work, threads: int) -> float:
    it = iter(files)
    lock = threading.Lock()

    def run() -> None:
        while True:
            with lock:
                f = next(it, None)
            if f is None:
                return
            work(f[0])

    t0 = time.perf_counter()
    ts = [threading.Thread(target=run) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def main() -> None:
    venv = os.environ.get("VENV", sys.prefix)
    cores = os.cpu_count() or 1
    files = files_of(venv)
    total = sum(s for _, s in files)
    say(f"venv {venv}: {len(files)} files, {total / 1e9:.2f} GB; {cores} cores; python {sys.version.split()[0]}")
    zc = ("import sys, zstandard; zstandard.ZstdCompressor(level=3, threads=-1)"
          ".copy_stream(sys.stdin.buffer, sys.stdout.buffer)")
    sh(f"tar -cf - -C {venv} . | cat >/dev/null")  # the page cache warm
    import blake3
    import zstandard

    local = threading.local()

    def work(sha256: bool, b3: bool, zstd: bool):
        """Read each file in 1 MiB pieces and do to each piece what is asked."""
        def one(path: str) -> None:
            c = getattr(local, "c", None)
            if c is None and zstd:
                c = local.c = zstandard.ZstdCompressor(level=3)
            h = hashlib.sha256() if sha256 else None
            with open(path, "rb", buffering=0) as f:
                while True:
                    b = f.read(PIECE)
                    if not b:
                        return
                    if h is not None:
                        h.update(b)
                    if b3:
                        blake3.blake3(b).digest()
                    if zstd:
                        c.compress(b)
        return one

    t = f"{cores} threads: read"
    rows = {
        "tar -cf - | cat >/dev/null": lambda: sh(f"tar -cf - -C {venv} . | cat >/dev/null")[0],
        "tar | zstd -3 (all cores) >/tmp/floors.tar.zst": lambda: sh(
            f"tar -cf - -C {venv} . | {TOOL_PY} -c '{zc}' >/tmp/floors.tar.zst")[0],
        f"{t} + sha256": lambda: parallel(files, work(True, False, False), cores),
        f"{t} + zstd -3 a MiB": lambda: parallel(files, work(False, False, True), cores),
        f"{t} + BLAKE3 + zstd -3 a MiB": lambda: parallel(files, work(False, True, True), cores),
        f"{t} + sha256 + BLAKE3 + zstd -3 a MiB": lambda: parallel(files, work(True, True, True), cores),
    }
    ev = os.environ.get("EV")
    if ev:  # the first snap itself, a fresh vault each time, in the same rounds
        def first_snap() -> float:
            sh("rm -rf /tmp/floors-snap-vault")
            wall, text = sh(f"ENVVAULT_HOME=/tmp/floors-snap-vault {ev} snap --venv {venv} --no-caches -m first")
            if "snapshot" not in text:
                say(f"first snap failed: {text[-300:]}")
            return wall
        rows["envvault first snap (--no-caches)"] = first_snap
    walls: dict[str, list[float]] = {k: [] for k in rows}
    names = list(rows)
    for i in range(int(os.environ.get("FLOOR_ROUNDS", "3"))):
        for name in names[i % len(names):] + names[:i % len(names)]:
            walls[name].append(rows[name]())
    for name, ws in walls.items():
        say(f"{name}: median {statistics.median(ws):.2f} s ({', '.join(f'{w:.2f}' for w in ws)})")
    anchor = walls["tar | zstd -3 (all cores) >/tmp/floors.tar.zst"]
    for name, ws in walls.items():  # round by round against the anchor of the same round
        ratios = sorted(w / a for w, a in zip(ws, anchor))
        say(f"{name} / tar | zstd, round by round: median {statistics.median(ratios):.2f}x "
            f"({', '.join(f'{r:.2f}' for r in ratios)})")
    sh("rm -rf /tmp/floors-snap-vault")
    os.unlink("/tmp/floors.tar.zst")
    for cmd in (f"{UV} cache dir", "df -h /tmp ~ $( " + UV + " cache dir ) 2>&1 | sort -u",
                "stat -f -c '%T' /tmp; stat -f -c '%T' $(" + UV + " cache dir) 2>&1",
                "cat /proc/sys/vm/dirty_ratio /proc/sys/vm/dirty_background_ratio /proc/sys/vm/dirty_bytes "
                "/proc/sys/vm/dirty_background_bytes; free -g | head -2",
                "echo UV_LINK_MODE=${UV_LINK_MODE:-unset}"):
        say(f"$ {cmd}\n{sh(cmd)[1]}")
    for cmd in ("dd if=/dev/zero of=/tmp/floors.dd bs=1M count=2048 2>&1 | tail -1",
                "dd if=/dev/zero of=/tmp/floors.dd bs=1M count=2048 conv=fdatasync 2>&1 | tail -1"):
        wall, text = sh(cmd)
        say(f"$ {cmd}: {wall:.2f} s: {text}")
        os.unlink("/tmp/floors.dd")
    if ev and os.environ.get("INTO", "1") != "0":
        into_rows(ev, venv, files[0][0][len(venv) + 1:])


def into_rows(ev: str, venv: str, largest: str) -> None:
    w = "/tmp/floors-into"
    base = getattr(sys, "_base_executable", sys.executable)
    os.environ["ENVVAULT_HOME"] = f"{w}-vault"
    sh(f"rm -rf {w} {w}-vault && mkdir -p {w}")
    say(f"snap: {sh(f'{ev} snap --venv {venv} --no-caches -m floors')[0]:.2f} s")
    wall, text = sh(f"{ev} export latest -o {w}/exp/pylock.toml")
    say(f"export: {wall:.2f} s {text[-200:]}")
    rows = {
        "uv pip install (default link mode)": ("", f"{w}/uvv"),
        "uv pip install --link-mode copy": ("--link-mode copy", f"{w}/uvc"),
        "restore --into": (None, f"{w}/into"),
    }
    walls: dict[str, list[float]] = {k: [] for k in rows}
    names = list(rows)
    for i in range(2):
        for name in names[i % 3:] + names[:i % 3]:
            mode, dest = rows[name]
            sh(f"rm -rf {w}/uvv {w}/uvc {w}/into")
            if mode is None:
                wall, text = sh(f"{ev} restore latest --into {dest}")
            else:
                sh(f"{UV} venv -q --python {base} {dest}")
                wall, text = sh(f"{UV} pip install -q --offline --no-deps {mode} --python {dest}/bin/python "
                                f"{w}/exp/pylock.wheels/*.whl")
            walls[name].append(wall)
            try:
                links = os.stat(os.path.join(dest, largest)).st_nlink
            except OSError as err:
                links = f"? ({err.strerror}) {text[-200:]}"
            say(f"{name}, round {i + 1}: {wall:.2f} s; links of {largest}: {links}")
    sh(f"rm -rf {w} {w}-vault")
    for name, ws in walls.items():
        say(f"{name}: median {statistics.median(ws):.2f} s")


if __name__ == "__main__":
    main()
