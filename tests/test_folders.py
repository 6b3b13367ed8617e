"""The folders a restore makes (``envvault.vault.fsutil``): ``makedirs_recording`` records each folder it made
and names what is in the way, and a folder someone else makes meanwhile is not in its way;
``remove_folders`` removes a failed run's folders deepest first, whatever order they were recorded in."""

from __future__ import annotations

import os

import pytest

from envvault.errors import EnvironmentProblem
from envvault.vault.fsutil import makedirs_recording, remove_folders


def _in_the_way(p):
    return EnvironmentProblem(f"{p} is in the way")


def test_folders_are_recorded_outermost_first_and_removed_deepest_first(tmp_path):
    created: list[str] = []
    for leaf in ("g0/p0/a", "g0/p0/b", "g0/p1/c", "g1/p2/d"):
        makedirs_recording(str(tmp_path / leaf), created, _in_the_way)
    assert created == [str(tmp_path / p) for p in ("g0", "g0/p0", "g0/p0/a", "g0/p0/b", "g0/p1", "g0/p1/c",
                                                    "g1", "g1/p2", "g1/p2/d")]
    (tmp_path / "g1" / "p2" / "kept.txt").write_text("not made by the run")
    remove_folders(sorted(created, key=len))  # parents listed before their children: still removed
    assert sorted(os.listdir(tmp_path)) == ["g1"] and os.listdir(tmp_path / "g1" / "p2") == ["kept.txt"]


def test_a_file_in_the_way_is_named(tmp_path):
    (tmp_path / "g0").write_text("a file where a folder goes")
    created: list[str] = []
    with pytest.raises(EnvironmentProblem, match=f"^{tmp_path / 'g0'} is in the way$"):
        makedirs_recording(str(tmp_path / "g0" / "p0" / "a"), created, _in_the_way)
    assert created == []


def test_a_folder_made_meanwhile_is_not_in_the_way(tmp_path, monkeypatch):
    """A parent missing when looked at and there (made by another process) when checked for something in
    the way: it is a folder, so the run goes on (the check before raised 'in the way', checked)."""
    target = tmp_path / "a" / "b"
    real_isdir = os.path.isdir
    raced: list[str] = []

    def isdir(p) -> bool:
        if str(p) == str(tmp_path / "a") and not raced:
            raced.append(str(p))
            os.mkdir(p)  # made by someone else right after this look
            return False
        return real_isdir(p)

    monkeypatch.setattr(os.path, "isdir", isdir)
    created: list[str] = []
    makedirs_recording(str(target), created, _in_the_way)
    assert raced and real_isdir(target) and created == [str(target)]
