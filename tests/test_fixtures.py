"""The fixtures themselves: wheels are valid and deterministic, venvs and installs are real, the index
works for pip and uv, and the torch-swap scenarios behave as fixtures/README.md says."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

from fixtures import (
    CommandError,
    IndexServer,
    build_catalogue,
    build_wheel,
    make_venv as plain_make_venv,
    pip_install,
    python_of,
    record_hash,
    serve_index,
    site_packages,
    uv_install,
)
from fixtures.machine import cpython
from fixtures.catalogue import (
    BROKEN,
    SMALL_01,
    SERVING,
    TORCH_CU128,
    TORCH_CU130,
    TORCH_PLAIN_A,
    TORCH_PLAIN_B,
)

TORCHES = (TORCH_CU128, TORCH_CU130, TORCH_PLAIN_A, TORCH_PLAIN_B)
# name -> (venv kind, venv has its own pip, install function)
INSTALLERS = {
    "uv": ("uv", False, uv_install),
    "pip": ("venv", True, pip_install),
    "pip--python": ("venv", False, pip_install),  # the dev venv's pip driving a pip-less venv
}


def _venv_for(make_venv, installer: str) -> Path:
    kind, with_pip, _ = INSTALLERS[installer]
    return make_venv(kind, with_pip=with_pip)


def _install(installer: str, venv: Path, *args, **kw):
    return INSTALLERS[installer][2](venv, *args, **kw)


def _dist_versions(venv: Path, project: str) -> list[str]:
    """Versions of every installed dist-info of ``project`` (normally exactly one)."""
    return sorted(p.name[len(project) + 1 : -len(".dist-info")] for p in site_packages(venv).glob(f"{project}-*.dist-info"))


def _run(venv: Path, *cmd: str) -> str:
    return subprocess.run(cmd, cwd=venv, capture_output=True, text=True, check=True).stdout.strip()


def _torchlike_info(venv: Path) -> str:
    return _run(venv, str(venv / "bin" / "torchlike-info"))


# --- wheels -----------------------------------------------------------------------------------


def test_catalogue_is_deterministic(wheelhouse, tmp_path):
    again = build_catalogue(tmp_path)
    assert again.keys() == wheelhouse.keys()
    for key, path in wheelhouse.items():
        assert again[key].read_bytes() == path.read_bytes(), key
    assert again[TORCH_PLAIN_A].name == again[TORCH_PLAIN_B].name != again[TORCH_CU128].name


def test_record_lists_every_member_with_hash_and_size(wheelhouse):
    for path in wheelhouse.values():
        _check_record(path)


def _check_record(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        record_name = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows = [line.rsplit(",", 2) for line in zf.read(record_name).decode().splitlines()]
        assert sorted(r[0] for r in rows) == sorted(names)
        for path, digest, size in rows:
            if path == record_name:
                assert (digest, size) == ("", "")
            else:
                assert digest == record_hash(zf.read(path)) and int(size) == zf.getinfo(path).file_size
        wheel = zf.read(record_name.replace("RECORD", "WHEEL")).decode()
        assert "Tag: py3-none-any" in wheel.splitlines() and "Root-Is-Purelib: true" in wheel


def test_torchlike_builds_differ_only_where_real_builds_do(wheelhouse):
    def member(key, suffix):
        with zipfile.ZipFile(wheelhouse[key]) as zf:
            return zf.read(next(n for n in zf.namelist() if n.endswith(suffix)))

    sos = {key: member(key, "torchlike/_C.so") for key in TORCHES}
    assert len(set(sos.values())) == 4 and all(190_000 < len(b) < 210_000 for b in sos.values())
    assert b"__version__ = '2.11.0+cu130'" in member(TORCH_PLAIN_B, "torchlike/version.py")
    assert b"cuda: Optional[str] = '12.8'" in member(TORCH_PLAIN_A, "torchlike/version.py")
    assert b"Version: 2.11.0\n" in member(TORCH_PLAIN_B, "METADATA")
    assert b"torchlike-info = torchlike.cli:main" in member(TORCH_CU128, "entry_points.txt")
    assert b"Requires-Dist: torchlike==2.11.0" in member(SERVING, "METADATA")


def test_build_wheel_build_tag_scripts_and_tag_sets(tmp_path):
    path = build_wheel(tmp_path, "Odd.Name", "1.0", {"odd_name/__init__.py": b""},
                       scripts={"odd-tool": b"#!python\nprint('odd')\n"}, tag="py2.py3-none-any", build_tag="7")
    assert path.name == "odd_name-1.0-7-py2.py3-none-any.whl"
    with zipfile.ZipFile(path) as zf:
        wheel = zf.read("odd_name-1.0.dist-info/WHEEL").decode().splitlines()
        script = zf.getinfo("odd_name-1.0.data/scripts/odd-tool")
    assert {"Build: 7", "Tag: py2-none-any", "Tag: py3-none-any"} <= set(wheel)
    assert stat.S_IMODE(script.external_attr >> 16) == 0o755


# --- venvs and installs ---------------------------------------------------------------------


@pytest.mark.parametrize("installer", INSTALLERS)
def test_installed_files_land_where_expected(wheelhouse, make_venv, installer):
    venv = _venv_for(make_venv, installer)
    links = [wheelhouse[TORCH_CU128].parent]
    _install(installer, venv, "torchlike==2.11.0+cu128", "nsa-alpha", "nsa-beta", "withheaders", find_links=links)

    assert _dist_versions(venv, "torchlike") == ["2.11.0+cu128"]
    assert _torchlike_info(venv) == "torchlike 2.11.0+cu128 cuda 12.8"
    assert (venv / "share/torchlike/build.txt").read_text().startswith("torchlike 2.11.0+cu128\n")
    headers = list(venv.glob("include/site/python3.*/withheaders/withheaders.h"))
    assert len(headers) == 1, sorted(venv.rglob("*.h"))
    sp = site_packages(venv)
    assert not (sp / "sharedns" / "__init__.py").exists()
    out = _run(venv, str(python_of(venv)), "-c",
               "import sharedns.alpha as a, sharedns.beta as b, torchlike; print(a.NAME, b.NAME, torchlike.version.cuda)")
    assert out == "alpha beta 12.8"
    installed_so = (sp / "torchlike/_C.so").read_bytes()
    with zipfile.ZipFile(wheelhouse[TORCH_CU128]) as zf:
        assert installed_so == zf.read("torchlike/_C.so")
    # pip byte-compiles and lists the .pyc files in RECORD (hash-less); uv does not compile by default.
    record = (sp / "torchlike-2.11.0+cu128.dist-info/RECORD").read_text()
    assert ("__pycache__/version." in record) == installer.startswith("pip")


@pytest.mark.parametrize("installer", ["uv", "pip--python"])
def test_failing_install_changes_nothing(wheelhouse, make_venv, installer):
    venv = _venv_for(make_venv, installer)
    with pytest.raises(CommandError) as err:
        _install(installer, venv, "brokenpkg", find_links=[wheelhouse[BROKEN].parent])
    assert "envvault-no-such-package-anywhere" in str(err.value)
    assert _dist_versions(venv, "brokenpkg") == []


@pytest.mark.parametrize("version", ["3.8", "3.13"])
def test_other_interpreters(wheelhouse, make_venv, version):
    pythons = [cpython(version)]
    links = [wheelhouse[TORCH_CU128].parent]
    for kind, install in (("uv", uv_install), ("venv", pip_install)):
        venv = make_venv(kind, pythons[0])
        install(venv, "torchlike==2.11.0+cu128", find_links=links)
        assert site_packages(venv).parent.name == f"python{version}"
        assert _torchlike_info(venv) == "torchlike 2.11.0+cu128 cuda 12.8"


# --- the index ------------------------------------------------------------------------------


def test_index_pages_hashes_and_metadata(wheelhouse):
    wheel = wheelhouse[TORCH_CU130]
    with IndexServer([wheel, wheelhouse[SERVING]]) as srv:
        root = urllib.request.urlopen(srv.url).read().decode()
        assert 'href="servingpkg/"' in root and 'href="torchlike/"' in root
        page = urllib.request.urlopen(srv.url + "torchlike").read().decode()  # redirected to torchlike/
        href = page.split('href="', 1)[1].split('"', 1)[0]
        assert href.endswith("torchlike-2.11.0%2Bcu130-py3-none-any.whl#sha256=" + hashlib.sha256(wheel.read_bytes()).hexdigest())
        base = srv.url.removesuffix("/simple/")
        assert urllib.request.urlopen(base + href.split("#")[0]).read() == wheel.read_bytes()
        metadata = urllib.request.urlopen(base + href.split("#")[0] + ".metadata").read()
        assert metadata.startswith(b"Metadata-Version: 2.1\nName: torchlike\nVersion: 2.11.0+cu130\n")
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(srv.url + "nosuchproject/")
        assert srv.downloads() == [wheel.name]
    with pytest.raises(ValueError):
        IndexServer([wheelhouse[TORCH_PLAIN_A], wheelhouse[TORCH_PLAIN_B]])


# --- the swap scenarios (see fixtures/README.md) ----------------------------------------------
#
# servingpkg requires torchlike==2.11.0. Under PEP 440 an unlabelled == pin matches any local label,
# so an installed 2.11.0+cu128 already satisfies it: neither pip nor uv swaps on a plain install.
# What does swap: a forced reinstall (pip --force-reinstall, uv --reinstall), or an eager upgrade
# (pip -U --upgrade-strategy eager, uv -U) when the index offers a build that sorts higher
# (2.11.0+cu130 > 2.11.0+cu128 > 2.11.0).

# Venvs with their own pip cost ~6 s each (ensurepip); the swap proof below runs with it, the other
# scenarios use the dev venv's pip (same pip version) through --python.


def _venv_with_cu128(wheelhouse, make_venv, installer: str) -> Path:
    venv = _venv_for(make_venv, installer)
    _install(installer, venv, "torchlike==2.11.0+cu128", find_links=[wheelhouse[TORCH_CU128].parent])
    return venv


@pytest.mark.parametrize("installer, extra", [
    ("uv", []), ("uv", ["-U"]),
    ("pip--python", []), ("pip--python", ["-U"]), ("pip--python", ["-U", "--upgrade-strategy", "eager"]),
])
def test_plain_pin_keeps_labelled_build(wheelhouse, make_venv, installer, extra):
    venv = _venv_with_cu128(wheelhouse, make_venv, installer)
    with IndexServer([wheelhouse[SERVING], wheelhouse[TORCH_PLAIN_B]]) as srv:
        _install(installer, venv, "servingpkg", *extra, index_url=srv.url)
        assert srv.downloads() == [wheelhouse[SERVING].name]
    assert _dist_versions(venv, "torchlike") == ["2.11.0+cu128"]
    assert _run(venv, str(venv / "bin" / "serve")) == "serving with torchlike 2.11.0+cu128 cuda 12.8"


@pytest.mark.parametrize("installer, force", [
    ("uv", "--reinstall"), ("pip", "--force-reinstall"), ("pip--python", "--force-reinstall")])
def test_forced_reinstall_swaps_to_served_plain_build(wheelhouse, make_venv, installer, force):
    venv = _venv_with_cu128(wheelhouse, make_venv, installer)
    with serve_index([wheelhouse[SERVING], wheelhouse[TORCH_PLAIN_B]]) as url:
        _install(installer, venv, "servingpkg", force, index_url=url)
    assert _dist_versions(venv, "torchlike") == ["2.11.0"]
    # The dist-info says 2.11.0 while the code says 2.11.0+cu130, like torch from PyPI.
    assert _torchlike_info(venv) == "torchlike 2.11.0+cu130 cuda 13.0"
    assert not (site_packages(venv) / "torchlike-2.11.0+cu128.dist-info").exists()


@pytest.mark.parametrize("installer, extra", [("uv", ["-U"]), ("pip--python", ["-U", "--upgrade-strategy", "eager"])])
def test_eager_upgrade_swaps_to_higher_label(wheelhouse, make_venv, installer, extra):
    venv = _venv_with_cu128(wheelhouse, make_venv, installer)
    with serve_index([wheelhouse[SERVING], wheelhouse[TORCH_CU130]]) as url:
        _install(installer, venv, "servingpkg", *extra, index_url=url)
    assert _dist_versions(venv, "torchlike") == ["2.11.0+cu130"]
    assert _torchlike_info(venv) == "torchlike 2.11.0+cu130 cuda 13.0"


@pytest.mark.parametrize("installer, force", [("uv", "--reinstall-package=torchlike"), ("pip--python", "--force-reinstall")])
def test_same_version_other_build_needs_force(wheelhouse, make_venv, installer, force):
    venv = _venv_for(make_venv, installer)
    _install(installer, venv, "torchlike==2.11.0", find_links=[wheelhouse[TORCH_PLAIN_A].parent])
    so = site_packages(venv) / "torchlike/_C.so"
    before = so.read_bytes()
    with serve_index([wheelhouse[TORCH_PLAIN_B]]) as url:
        _install(installer, venv, "torchlike==2.11.0", "-U", index_url=url)
        assert so.read_bytes() == before  # same name and version: both installers see nothing to do
        _install(installer, venv, "torchlike==2.11.0", force, index_url=url)
    assert _dist_versions(venv, "torchlike") == ["2.11.0"]
    assert so.read_bytes() != before
    assert _torchlike_info(venv) == "torchlike 2.11.0+cu130 cuda 13.0"


def test_make_venv_refuses_unknown_kind_and_uv_with_pip(tmp_path):
    with pytest.raises(ValueError):
        plain_make_venv(tmp_path / "a", "conda")
    with pytest.raises(ValueError):
        plain_make_venv(tmp_path / "b", "uv", with_pip=True)


def test_uv_stamps_local_wheel_installs_into_record(wheelhouse, make_venv, tmp_path):
    """uv 0.13 adds dist-info/uv_cache.json to RECORD for --find-links and path installs (not for index
    installs). It holds the wheel file's ctime, so the same wheel bytes copied anew give another RECORD."""
    links = tmp_path / "links"
    links.mkdir()
    wheel = links / wheelhouse[SMALL_01].name
    records = []
    for _ in range(2):
        wheel.unlink(missing_ok=True)
        wheel.write_bytes(wheelhouse[SMALL_01].read_bytes())
        ctime_ns = os.stat(wheel).st_ctime_ns
        venv = make_venv("uv")
        uv_install(venv, "smallpkg==0.1.0", find_links=[links])
        dist_info = site_packages(venv) / "smallpkg-0.1.0.dist-info"
        stamp = json.loads((dist_info / "uv_cache.json").read_text())["timestamp"]
        assert stamp["secs_since_epoch"] * 10**9 + stamp["nanos_since_epoch"] == ctime_ns
        records.append((dist_info / "RECORD").read_text().splitlines())
    differing = set(records[0]) ^ set(records[1])
    assert {line.split(",")[0] for line in differing} == {"smallpkg-0.1.0.dist-info/uv_cache.json"}
    venv = make_venv("uv")
    with serve_index([wheel]) as url:
        uv_install(venv, "smallpkg==0.1.0", index_url=url)
    assert not (site_packages(venv) / "smallpkg-0.1.0.dist-info/uv_cache.json").exists()
