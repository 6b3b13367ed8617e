"""What a first snap's Python objects hold, by allocation site (bench only; tracemalloc slows the snap).

    python3 bench/tracemalloc_snap.py snap --venv VENV --no-caches      (envvault importable, ENVVAULT_HOME set)

Once the groups are built, a thread samples the traced memory every ``EVERY`` seconds and keeps the tracemalloc snapshot of the highest
sample; at the snapshot's commit (``Vault.commit_snapshot``) one more is taken. On stderr: the traced peak,
then the top sites of the highest sample and of the commit. Native buffers outside Python's allocators (zstd's
contexts, glibc's arenas) are not traced: compare the totals with the process's peak RSS
(``bench/rss_timeline.py``)."""

import sys
import threading
import tracemalloc

EVERY = 0.25
TOP = 20


def main() -> None:
    tracemalloc.start(1)
    best = {"cur": 0, "snap": None, "at": None}
    done = threading.Event()

    def sample() -> None:
        import time

        t0 = time.perf_counter()
        while not done.wait(EVERY):
            cur, _ = tracemalloc.get_traced_memory()
            if cur > best["cur"] * 1.05:
                best.update(cur=cur, snap=tracemalloc.take_snapshot(), at=time.perf_counter() - t0)

    from envvault.vault import store

    commit = store.Vault.commit_snapshot

    def report(self, *a, **kw):
        done.set()
        at_commit = tracemalloc.take_snapshot()
        cur, peak = tracemalloc.get_traced_memory()
        print(f"traced: {cur / 1e6:.1f} MB at the commit, peak {peak / 1e6:.1f} MB", file=sys.stderr)
        for title, snap in ((f"highest sample ({best['cur'] / 1e6:.1f} MB at {best['at'] or 0:.2f} s)",
                             best["snap"]), ("at the commit", at_commit)):
            if snap is None:
                continue
            print(f"-- {title}", file=sys.stderr)
            for st in snap.statistics("lineno")[:TOP]:
                print(f"   {st}", file=sys.stderr)
        return commit(self, *a, **kw)

    store.Vault.commit_snapshot = report
    # The sampler starts once the groups are built (``SmallGroups.start``): a thread alive before would keep
    # them from being forked (``forked.can_fork``: one thread only), and so change what the parent holds.
    from envvault.snap import groups

    start = groups.SmallGroups.start

    def start_then_sample(self, *a, **kw):
        try:
            return start(self, *a, **kw)
        finally:
            threading.Thread(target=sample, daemon=True).start()

    groups.SmallGroups.start = start_then_sample
    from envvault.entry import main as ev_main

    sys.argv = ["envvault", *sys.argv[1:]]
    ev_main()


if __name__ == "__main__":
    main()
