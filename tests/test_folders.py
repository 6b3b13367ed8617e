"""Folders a restore makes (``envvault.vault.fsutil.each_folder``, ``remove_folders``): made on several threads
once there are many (a venv has thousands; on a network file system each is a round trip), every one recorded
once, the same error as one thread would raise when something is in the way, and a failed run's folders
removed deepest first however the threads recorded them."""

from __future__ import annotations

import os
import threading

import pytest

from envvault.errors import EnvironmentProblem
from envvault.vault.fsutil import each_folder, makedirs_recording, remove_folders


def _tree(root, n: int = 200) -> list[str]:
    """``n`` leaf folders under 20 parents under 4 grandparents, none made yet."""
    return [os.path.join(root, f"g{i % 4}", f"p{i % 20}", f"leaf{i}") for i in range(n)]


def _maker(created: list[str], threads: set[str]):
    def in_the_way(p):
        return EnvironmentProblem(f"{p} is in the way")

    def make(path: str) -> None:
        threads.add(threading.current_thread().name)
        makedirs_recording(path, created, in_the_way)

    return make


@pytest.mark.parametrize("n", [200, 2000])
def test_many_folders_are_made_on_threads_each_recorded_once(tmp_path, n):
    leaves = _tree(tmp_path, n)
    created: list[str] = []
    threads: set[str] = set()
    each_folder(_maker(created, threads), leaves + leaves[:50])  # repeated paths are made once
    assert all(os.path.isdir(p) for p in leaves)
    wanted = set(leaves) | {os.path.dirname(p) for p in leaves} | {os.path.dirname(os.path.dirname(p)) for p in leaves}
    assert sorted(created) == sorted(wanted)  # every folder made, each recorded once
    assert len([t for t in threads if t.startswith("envvault-mkdir-")]) >= 2  # the work was shared out
    # ... and no thread took a parent another had just made for something in the way (this thread would then
    # have made every folder again)
    assert threading.current_thread().name not in threads
    remove_folders(created)  # children may be recorded before their parents: still all removed
    assert os.listdir(tmp_path) == []


def test_few_folders_are_made_on_this_thread(tmp_path):
    created: list[str] = []
    threads: set[str] = set()
    each_folder(_maker(created, threads), _tree(tmp_path)[:10])
    assert threads == {threading.current_thread().name}
    assert len(created) == 10 + 10 + 4


@pytest.mark.parametrize("workers", [1, 8])
def test_something_in_the_way_raises_what_one_thread_raises(tmp_path, workers):
    leaves = _tree(tmp_path)
    (tmp_path / "g1").mkdir()
    (tmp_path / "g1" / "p5").write_text("a file where a folder goes")  # in the way of ten leaves
    (tmp_path / "g3").write_text("another")  # and of fifty more, later in sorted order
    created: list[str] = []
    with pytest.raises(EnvironmentProblem) as err:
        each_folder(_maker(created, set()), leaves, workers=workers)
    assert str(err.value) == f"{tmp_path / 'g1' / 'p5'} is in the way"
    assert len(created) == len(set(created))
    remove_folders(created)
    assert sorted(os.listdir(tmp_path)) == ["g1", "g3"] and os.listdir(tmp_path / "g1") == ["p5"]


def test_a_folder_another_thread_makes_meanwhile_is_not_in_the_way(tmp_path, monkeypatch):
    """The window each_folder's threads meet: a parent is missing when looked at, and there (made by another
    thread) when checked for something in the way: it is a folder, so this thread goes on."""
    target = tmp_path / "a" / "b"
    real_isdir = os.path.isdir
    raced: list[str] = []

    def isdir(p) -> bool:
        if str(p) == str(tmp_path / "a") and not raced:
            raced.append(str(p))
            os.mkdir(p)  # another thread makes it right after this look
            return False
        return real_isdir(p)

    monkeypatch.setattr(os.path, "isdir", isdir)
    created: list[str] = []
    makedirs_recording(str(target), created, lambda p: EnvironmentProblem(f"{p} is in the way"))
    assert raced and real_isdir(target) and created == [str(target)]
