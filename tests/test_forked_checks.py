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
    assert got[0] is False  # the first slice is this process's
    assert got[-1] is True  # the last one a child's
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


def test_slices_cover_every_item_once():
    for weights in ([5] * 17, [100, 1, 1, 1, 1, 1, 1, 100], [1], [3, 9000, 2, 2]):
        for workers in (2, 3, 8):
            parts = forked._slices(weights, sum(weights), workers)
            assert [i for p in parts for i in p] == list(range(len(weights)))
            assert len(parts) <= workers


def test_status_sees_an_edit_in_a_childs_slice(tmp_path, make_venv, wheelhouse, monkeypatch):
    """Status in this process with forking forced on: a file edited in place (same size) in the last
    distribution, whose check ran in a child, makes that distribution changed; unchanged, nothing is."""
    from envvault.snap import take_snapshot
    from envvault.snap.scan import scan_current
    from envvault.vault.store import Vault

    venv = make_venv("uv")
    uv_install(venv, *(str(wheelhouse[k]) for k in (C.SMALL_01, C.NS_ALPHA, C.WITH_HEADERS)))
    vault = Vault.open(tmp_path / "v", create=True)
    take_snapshot(vault, venv, argv=["test"])
    monkeypatch.setattr(forked, "FORK_MIN_WEIGHT", 1)
    monkeypatch.setattr(forked, "_WEIGHT_A_CHILD", 1)
    forks = []
    real_fork = os.fork
    monkeypatch.setattr(os, "fork", lambda: forks.append(1) or real_fork())
    assert scan_current(vault, venv, facts=False)["packages"]
    assert forks  # the checks did go to children
    first = scan_current(vault, venv, facts=False)
    site = next(venv.glob("lib/python3*/site-packages"))
    last_dist = sorted(site.glob("*.dist-info"))[-1]
    record = (last_dist / "RECORD").read_text().splitlines()
    target = next(site / row.split(",")[0] for row in record if row.split(",")[0].endswith(".py"))
    data = target.read_bytes()
    target.write_bytes(data[:-1] + (b"#" if data[-1:] != b"#" else b"!"))
    second = scan_current(vault, venv, facts=False)
    changed = [a["name"] for a, b in zip(first["packages"], second["packages"]) if a["manifest"] != b["manifest"]]
    assert len(changed) == 1
    assert _no_children_left()
