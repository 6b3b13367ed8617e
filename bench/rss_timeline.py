"""Run a command and sample its own process's memory every 20 ms (bench only): where in a first snap the
parent's peak RSS is reached, and of what (anonymous memory: the heap and thread buffers; file pages: the
mapped libraries). Usage: python3 bench/rss_timeline.py CMD [ARGS...]. On stderr at the end: one line every
half second (seconds from the start, VmRSS, RssAnon, RssFile, threads, children), then the peak and when it
came. Its exit code is the command's."""

import os
import subprocess
import sys
import time

KEYS = ("VmRSS:", "RssAnon:", "RssFile:", "Threads:")


def _status(pid: int) -> dict:
    got = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                for key in KEYS:
                    if line.startswith(key):
                        got[key] = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return got


def _children(pid: int) -> int:
    n = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                n += len(f.read().split())
    except OSError:
        pass
    return n


def main() -> int:
    t0 = time.perf_counter()
    proc = subprocess.Popen(sys.argv[1:])
    rows, peak, peak_at, last_shown = [], {}, 0.0, -1.0
    while proc.poll() is None:
        now = time.perf_counter() - t0
        st = _status(proc.pid)
        if st.get("VmRSS:", 0) > peak.get("VmRSS:", 0):
            peak, peak_at = st, now
        if now - last_shown >= 0.5 and st:
            rows.append((now, st, _children(proc.pid)))
            last_shown = now
        time.sleep(0.02)
    end = time.perf_counter() - t0
    mb = lambda st, k: st.get(k, 0) // 1024  # noqa: E731
    for now, st, kids in rows:
        print(f"{now:6.2f} s  rss {mb(st, 'VmRSS:'):4d} MB  anon {mb(st, 'RssAnon:'):4d}  file "
              f"{mb(st, 'RssFile:'):3d}  threads {st.get('Threads:', 0):3d}  children {kids}", file=sys.stderr)
    print(f"peak rss {mb(peak, 'VmRSS:')} MB (anon {mb(peak, 'RssAnon:')}, file {mb(peak, 'RssFile:')}, threads "
          f"{peak.get('Threads:', 0)}) at {peak_at:.2f} s of {end:.2f} s", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
