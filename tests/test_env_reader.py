"""The environment reader seam (envvault/env/reader.py): the venv reader against a real venv."""

from __future__ import annotations

import os

import pytest

from fixtures import catalogue as C
from fixtures import uv_install


class _Memo:
    def __init__(self) -> None:
        self.extra: dict = {}
        self.dirty = 0

    def mark_dirty(self) -> None:
        self.dirty += 1


def test_venv_reader_lists_what_the_dist_scanner_finds(make_venv, wheelhouse):
    from envvault.env.dists import scan_dists
    from envvault.env.reader import reader_for

    venv = make_venv("uv")
    uv_install(venv, str(wheelhouse[C.SMALL_01]))
    reader = reader_for(venv)
    assert reader.kind == "venv" and reader.prefix == venv
    interp = reader.interpreter()
    assert reader.site_dirs() == [interp.purelib, interp.platlib]
    entries = reader.dist_entries()
    assert [e.name for e, _ in entries] == sorted(e.name for e, _ in entries)
    assert entries, "the installed wheel has a dist-info"
    got = sorted((d.name, d.version) for d in reader.distributions())
    assert got == [(d.name, d.version) for d in scan_dists(reader.site_dirs())]
    # The files' facts agree with the interpreter's, without running it.
    assert reader.site_packages() == interp.purelib
    assert interp.version.startswith(reader.python_version())


def test_interpreter_answer_is_memoised_until_pyvenv_cfg_changes(make_venv, monkeypatch):
    import envvault.env.venv as venv_mod
    from envvault.env.reader import reader_for

    venv = make_venv("uv")
    memo = _Memo()
    first = reader_for(venv, memo).interpreter()
    assert memo.dirty == 1 and "probe" in memo.extra

    def no_probe(prefix):
        raise AssertionError("the memo should have answered")

    monkeypatch.setattr(venv_mod, "probe", no_probe)
    assert reader_for(venv, memo).interpreter() == first
    cfg = venv / "pyvenv.cfg"
    st = cfg.stat()
    os.utime(cfg, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    with pytest.raises(AssertionError, match="memo should have answered"):
        reader_for(venv, memo).interpreter()


def test_site_packages_of_a_folder_without_one_is_a_usage_error(tmp_path):
    from envvault.env.reader import reader_for
    from envvault.errors import UsageError

    (tmp_path / "pyvenv.cfg").write_text("version_info = 3.12.4\n")
    reader = reader_for(tmp_path)
    assert reader.python_version() == "3.12.4"
    with pytest.raises(UsageError, match="no site-packages"):
        reader.site_packages()


@pytest.mark.parametrize("relinked", ["python3", "python"])
def test_the_memo_is_asked_again_when_either_interpreter_name_is_relinked(make_venv, monkeypatch, relinked):
    """A uv venv's ``bin/python3`` links to ``python``; the probe runs ``python3``. Relinking either name to
    another interpreter must not leave the old answer in the memo (it did for ``python3``: the key held
    ``bin/python`` alone, so status and a second snap kept the old version)."""
    import envvault.env.venv as venv_mod
    from envvault.env.reader import reader_for
    from fixtures.machine import cpython

    venv = make_venv("uv", cpython("3.12"))
    memo = _Memo()
    reader_for(venv, memo).interpreter()
    probed = []
    real_probe = venv_mod.probe
    monkeypatch.setattr(venv_mod, "probe", lambda prefix: probed.append(prefix) or real_probe(prefix))
    assert reader_for(venv, memo).memoised_interpreter() is not None  # unchanged: the memo answers
    link = venv / "bin" / relinked
    link.unlink()
    link.symlink_to(cpython("3.13"))
    assert reader_for(venv, memo).memoised_interpreter() is None
    got = reader_for(venv, memo).interpreter()
    assert probed == [venv]
    assert got.version.startswith("3.13")  # (uv's python3 links to python: relinking python moves both)
