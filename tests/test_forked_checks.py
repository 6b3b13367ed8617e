"""An unchanged scan's stat checks shared out to forked children (envvault/snap/forked.py): the answers are
the serial ones whatever the children do (fail, get killed), nothing is left running, no fork happens in a
threaded process or on little work, and an in-place edit in a child's slice is still seen by ``status``."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from envvault.snap import forked
from fixtures import catalogue as C
from fixtures import uv_install

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or (os.cpu_count() or 1) < 2, reason="needs fork and 2 cores")


def _no_children_left() -> bool:
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def test_children_answer_their_slices():
    parent = os.getpid()
    items = list(range(40))
    got = forked.check_all(lambda i: os.getpid() != parent, items, [1000] * 40)  # 40,000: forks
    assert False in got  # this process's slice
    assert True in got  # a child's
    assert _no_children_left()


def test_answers_are_the_serial_ones():
    items = list(range(997))
    check = lambda i: (i * 7919) % 3 == 0  # noqa: E731
    assert forked.check_all(check, items, [50] * len(items)) == [check(i) for i in items]
    assert _no_children_left()


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_a_child_that_fails_or_is_killed_is_checked_here(how):
    parent = os.getpid()

    def check(i):
        if os.getpid() != parent:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("child broke")
        return i % 2 == 0

    items = list(range(30))
    assert forked.check_all(check, items, [1000] * 30) == [i % 2 == 0 for i in items]
    assert _no_children_left()


def test_no_fork_with_another_thread_or_little_work():
    parent = os.getpid()
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    try:
        assert not any(forked.check_all(lambda i: os.getpid() != parent, list(range(40)), [1000] * 40))
    finally:
        stop.set()
        t.join()
    small = list(range(10))
    assert not any(forked.check_all(lambda i: os.getpid() != parent, small, [10] * 10))


def test_no_fork_with_a_native_thread():
    """zstd's worker threads are not Python threads: ``threading`` does not see them, the process does."""
    import zstandard

    parent = os.getpid()
    cctx = zstandard.ZstdCompressor(level=1, threads=2)
    cctx.compress(os.urandom(4 << 20))
    assert len(os.listdir("/proc/self/task")) > 1 and threading.active_count() == 1
    assert not any(forked.check_all(lambda i: os.getpid() != parent, list(range(40)), [1000] * 40))
    del cctx


def test_slices_cover_every_item_once():
    for weights in ([5] * 17, [100, 1, 1, 1, 1, 1, 1, 100], [1], [3, 9000, 2, 2]):
        for workers in (2, 3, 8):
            parts = forked._slices(weights, sum(weights), workers)
            assert sorted(i for p in parts for i in p) == list(range(len(weights)))
            assert len(parts) <= workers
            loads = [sum(weights[i] for i in p) for p in parts]
            assert loads == sorted(loads)  # this process takes the lightest
    parts = forked._slices([9000, 3000, 3000, 3000], 18000, 2)
    assert sorted(sum([9000, 3000, 3000, 3000][i] for i in p) for p in parts) == [9000, 9000]


def test_status_sees_an_edit_in_a_childs_slice(tmp_path, make_venv, wheelhouse, monkeypatch):
    """Status in this process with forking forced on and every distribution checked in parts of 2 files:
    the last stored file of each distribution, edited in place (same size), makes that one distribution
    changed, whichever process checked its part; unchanged, nothing is."""
    from envvault.snap import scan, take_snapshot
    from envvault.snap.scan import scan_current, statcache_for
    from envvault.vault.ingest import group_paths
    from envvault.vault.store import Vault

    venv = make_venv("uv")
    uv_install(venv, *(str(wheelhouse[k]) for k in (C.SMALL_01, C.NS_ALPHA, C.WITH_HEADERS)))
    vault = Vault.open(tmp_path / "v", create=True)
    take_snapshot(vault, venv, argv=["test"])
    monkeypatch.setattr(forked, "FORK_MIN_WEIGHT", 1)
    monkeypatch.setattr(forked, "_WEIGHT_A_CHILD", 1)
    monkeypatch.setattr(scan, "_PART_FILES", 2)
    forks = []
    real_fork = os.fork
    monkeypatch.setattr(os, "fork", lambda: forks.append(1) or real_fork())
    first = scan_current(vault, venv, facts=False)
    assert forks  # the checks did go to children
    assert scan_current(vault, venv, facts=False)["packages"] == first["packages"]
    groups = statcache_for(vault, venv).groups
    lasts = [group_paths(g)[-1] for g in groups.values() if len(group_paths(g)) > 2]
    assert len(lasts) >= 2  # more than one part each
    before = first
    for rel in lasts:
        target = venv / rel
        data = target.read_bytes()
        target.write_bytes(data[:-1] + (b"#" if data[-1:] != b"#" else b"!"))
        after = scan_current(vault, venv, facts=False)
        changed = [a["name"] for a, b in zip(before["packages"], after["packages"]) if a["manifest"] != b["manifest"]]
        assert len(changed) == 1, rel
        before = after
    assert _no_children_left()
