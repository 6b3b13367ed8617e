"""The corpus of real environment shapes (issue 9): each shape is built with the tool users build it with,
from real registry packages (small ones) or fixture wheels where a shape needs control, and goes through
the whole cycle:

snap; second snap (adds almost nothing); status unchanged right after; break it (uninstall, up/downgrade,
edit, delete, chmod); status and diff name each change; restore in place (verified, bytes and modes equal,
`pip check` and imports work); `restore --into` (verified, provenance files and pyvenv settings equal);
export + `uv pip sync --offline` into a fresh venv (site-packages bytes equal).

Registry packages come from PyPI through one uv cache per session (the first shape downloads, the others
read the cache). A missing interpreter fails the test, never skips it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.machine import cpython
from fixtures.trees import installed_content
from fixtures.venvs import find_uv, isolated_env, site_packages
from fixtures.wheels import build_wheel
from tests.evtools import ev

PYPI = "https://pypi.org/simple"
# Real, small registry packages. jmespath ships `jmespath-1.0.1.data/scripts/jp.py` starting `#!python`,
# which the installer rewrites (issue 9 item 1); certifi's cacert.pem is what images edit.
BASE = ["six==1.17.0", "idna==3.10", "jmespath==1.0.1", "certifi==2024.8.30"]
DOWNGRADE = ("six", "six==1.16.0")
UNINSTALL = "idna"


def _pyenv(minor: str) -> Path:
    return cpython(minor)


@pytest.fixture(scope="session")
def uv_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("uv-cache")


def _run(cmd, *, env=None, check=True, cwd=None) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env or isolated_env(),
                          stdin=subprocess.DEVNULL, cwd=cwd, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}: {' '.join(map(str, cmd))}\n{proc.stdout}\n{proc.stderr}")
    return proc


class Shape:
    """One environment: how to install into it, and what to check after a restore."""

    def __init__(self, venv: Path, uv_cache: Path, *, installer: str, imports=("six", "idna", "jmespath", "certifi")):
        self.venv = venv
        self.uv_cache = uv_cache
        self.installer = installer  # "pip" (the venv's own pip) or "uv"
        self.imports = list(imports)

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def site(self) -> Path:
        return site_packages(self.venv)

    def install(self, *args) -> None:
        if self.installer == "pip":
            _run([self.python, "-m", "pip", "install", "-q", "--index-url", PYPI, *args],
                 env=isolated_env({"PIP_CACHE_DIR": str(self.uv_cache / "pip")}))
        else:
            _run([find_uv(), "pip", "install", "-q", "--python", self.python, "--cache-dir", self.uv_cache,
                  "--index-url", PYPI, *args])

    def uninstall(self, name: str) -> None:
        if self.installer == "pip":
            _run([self.python, "-m", "pip", "uninstall", "-y", "-q", name])
        else:
            _run([find_uv(), "pip", "uninstall", "-q", "--python", self.python, name])

    def pip_check(self) -> None:
        _run([find_uv(), "pip", "check", "--python", self.python])

    def check_imports(self, python: Path | None = None) -> None:
        code = "; ".join(f"import {m}" for m in self.imports) or "pass"
        _run([python or self.python, "-c", code])


def _provenance(venv: Path) -> dict[str, dict]:
    """Per dist-info: INSTALLER, REQUESTED (present or not), direct_url.json (parsed)."""
    out = {}
    for di in sorted(site_packages(venv).glob("*.dist-info")):
        du = di / "direct_url.json"
        out[di.name] = {
            "installer": (di / "INSTALLER").read_text().strip() if (di / "INSTALLER").exists() else None,
            "requested": (di / "REQUESTED").exists(),
            "direct_url": json.loads(du.read_text()) if du.exists() else None,
        }
    return out


def _pyvenv(venv: Path) -> dict[str, str]:
    cfg = {}
    for line in (venv / "pyvenv.cfg").read_text().splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            cfg[k.strip()] = v.strip()
    return cfg


def cycle(tmp: Path, shape: Shape, *, edit: str, delete: str, chmod: str | None, into: bool = True,
          export: bool = True, extra_names: tuple[str, ...] = ()) -> dict:
    """The whole cycle on ``shape``; returns the first snapshot's document (for cross-shape checks).

    ``edit`` and ``delete`` are paths relative to site-packages; ``chmod`` relative to the venv (an
    executable that loses its x bit)."""
    vault = tmp / "vault"
    venv = shape.venv
    before = installed_content(venv)
    prov_before = _provenance(venv)

    first = json.loads(ev(vault, "snap", "--venv", venv, "-m", "first", "--json").stdout)
    assert first["warnings"] == [] or all("cache" in w for w in first["warnings"]), first["warnings"]
    second = json.loads(ev(vault, "snap", "--venv", venv, "-m", "second", "--json").stdout)
    assert second["fingerprint"] == first["fingerprint"]
    assert second["new_bytes"] < 64 * 1024, second  # the snapshot document and little else
    ev(vault, "status", "--venv", venv, "--exit-code")
    ev(vault, "tag", first["id"], "good")

    # Break it: uninstall, downgrade, edit, delete, chmod.
    shape.uninstall(UNINSTALL)
    shape.install(DOWNGRADE[1])
    with open(shape.site / edit, "a") as f:
        f.write("\n# edited in place\n")
    (shape.site / delete).unlink()
    if chmod:
        p = venv / chmod
        p.chmod(p.stat().st_mode & ~0o111)

    st = ev(vault, "status", "--venv", venv, "--exit-code", check=False)
    assert st.returncode == 1, st
    for needle in (UNINSTALL, DOWNGRADE[0], edit.split("/")[-1], delete.split("/")[-1], *extra_names):
        assert needle in st.stdout, (needle, st.stdout)
    if chmod:
        assert chmod.split("/")[-1] in st.stdout, ("mode change not reported", st.stdout)
    diff = ev(vault, "diff", "good", "current", "--venv", venv, "--exit-code", check=False)
    assert diff.returncode == 1, diff
    for needle in (UNINSTALL, DOWNGRADE[0], edit.split("/")[-1], delete.split("/")[-1]):
        assert needle in diff.stdout, (needle, diff.stdout)

    # Restore in place.
    rs = ev(vault, "restore", "good", "--venv", venv)
    assert "verified" in rs.stdout and "NOT verified" not in rs.stdout, rs.stdout
    after = installed_content(venv)
    assert after == before, _tree_delta(before, after)
    assert _provenance(venv) == prov_before
    ev(vault, "status", "--venv", venv, "--exit-code")
    shape.pip_check()
    shape.check_imports()

    if into:
        new = tmp / "into"
        ri = ev(vault, "restore", "good", "--into", new)
        assert "verified" in ri.stdout and "NOT verified" not in ri.stdout, ri.stdout
        assert _provenance(new) == prov_before
        for key in ("include-system-site-packages", "prompt", "seed"):  # uv keeps a seed venv's pip through a sync
            assert _pyvenv(new).get(key) == _pyvenv(venv).get(key), key
        _assert_same_site(venv, new)
        shape.check_imports(new / "bin" / "python")

    if export:
        lock = tmp / "exp" / "pylock.toml"
        ev(vault, "export", "good", "-o", lock)
        fresh = tmp / "fresh"
        _run([find_uv(), "venv", "-q", "--python", _base_python(venv), fresh])
        _run([find_uv(), "pip", "sync", "-q", "--offline", "--preview-features", "pylock", "--python",
              fresh / "bin" / "python", "--cache-dir", tmp / "uvc", lock])
        _assert_same_site(venv, fresh)
    return first


def _assert_same_site(venv: Path, other: Path) -> None:
    """site-packages of both hold the same bytes and modes (bytecode and installer records aside)."""
    a = installed_content(site_packages(venv), skip_installer_files=True)
    b = installed_content(site_packages(other), skip_installer_files=True)
    # uv venv (like virtualenv) writes its distutils shim for Pythons before 3.10: the venv's, no package's.
    for shim in ("_virtualenv.py", "_virtualenv.pth"):
        if shim not in a:
            b.pop(shim, None)
    assert a == b, _tree_delta(a, b)


def _base_python(venv: Path) -> str:
    home = _pyvenv(venv)["home"]
    ver = _pyvenv(venv).get("version_info") or _pyvenv(venv).get("version")
    minor = ".".join(ver.split(".")[:2])
    for name in (f"python{minor}", "python3", "python"):
        if (Path(home) / name).exists():
            return str(Path(home) / name)
    raise AssertionError(f"no interpreter in {home}")


def _tree_delta(a: dict, b: dict) -> str:
    only_a = sorted(set(a) - set(b))[:10]
    only_b = sorted(set(b) - set(a))[:10]
    changed = sorted(k for k in set(a) & set(b) if a[k] != b[k])[:10]
    return f"only before: {only_a}\nonly after: {only_b}\nchanged: {changed}"


# --- the shapes -----------------------------------------------------------------------------------------

JP_EDIT = "jmespath/parser.py"
JP_DELETE = "jmespath/exceptions.py"
CHMOD = "bin/jp.py"


def _make(cmd, venv: Path) -> Path:
    _run(cmd)
    assert (venv / "pyvenv.cfg").exists(), venv
    return venv


def test_python_m_venv_with_pip(tmp_path, uv_cache):
    venv = _make([sys.executable, "-m", "venv", tmp_path / "v"], tmp_path / "v")
    shape = Shape(venv, uv_cache, installer="pip")
    shape.install(*BASE)
    cycle(tmp_path, shape, edit=JP_EDIT, delete=JP_DELETE, chmod=CHMOD)


def test_uv_venv(tmp_path, uv_cache):
    venv = _make([find_uv(), "venv", "-q", "--python", sys.executable, tmp_path / "v"], tmp_path / "v")
    shape = Shape(venv, uv_cache, installer="uv")
    shape.install(*BASE)
    cycle(tmp_path, shape, edit=JP_EDIT, delete=JP_DELETE, chmod=CHMOD)


def test_uv_venv_seed(tmp_path, uv_cache):
    venv = _make([find_uv(), "venv", "-q", "--seed", "--python", sys.executable, "--cache-dir", uv_cache,
                  "--index-url", PYPI, tmp_path / "v"], tmp_path / "v")
    shape = Shape(venv, uv_cache, installer="uv")
    shape.install(*BASE)
    cycle(tmp_path, shape, edit=JP_EDIT, delete=JP_DELETE, chmod=CHMOD)


@pytest.mark.parametrize("flags", [[], ["--no-setuptools"]], ids=["default", "no-setuptools"])
def test_virtualenv(tmp_path, uv_cache, flags):
    venv = _make([sys.executable, "-m", "virtualenv", "-q", *flags, tmp_path / "v"], tmp_path / "v")
    shape = Shape(venv, uv_cache, installer="pip")
    shape.install(*BASE)
    cycle(tmp_path, shape, edit=JP_EDIT, delete=JP_DELETE, chmod=CHMOD)


def test_system_site_packages(tmp_path, uv_cache):
    venv = _make([sys.executable, "-m", "venv", "--system-site-packages", tmp_path / "v"], tmp_path / "v")
    shape = Shape(venv, uv_cache, installer="pip")
    # certifi comes from the system site: this machine's base interpreter runs a .pth at every start that
    # appends a CA to whichever certifi it imports, so a venv-local certifi would change under the test.
    shape.install(*[req for req in BASE if not req.startswith("certifi")])
    cycle(tmp_path, shape, edit=JP_EDIT, delete=JP_DELETE, chmod=CHMOD)


@pytest.mark.parametrize("minor", ["3.8", "3.9", "3.10", "3.12", "3.13"])
def test_every_pyenv_cpython(tmp_path, uv_cache, minor):
    """The tool runs on this interpreter and snaps venvs of every other CPython of the machine."""
    python = _pyenv(minor)
    venv = _make([python, "-m", "venv", tmp_path / "v"], tmp_path / "v")
    shape = Shape(venv, uv_cache, installer="pip")
    shape.install(*BASE)
    cycle(tmp_path, shape, edit=JP_EDIT, delete=JP_DELETE, chmod=CHMOD)


def test_rewritten_shebangs_same_build_by_pip_and_uv(tmp_path, uv_cache):
    """jmespath's `#!python` script is rewritten differently by pip and uv, in two venvs: one build id."""
    ids = []
    for installer in ("pip", "uv"):
        venv = tmp_path / installer
        _run([sys.executable, "-m", "venv", *([] if installer == "pip" else ["--without-pip"]), venv])
        Shape(venv, uv_cache, installer=installer).install("jmespath==1.0.1")
        assert (venv / "bin" / "jp.py").read_text().startswith(f"#!{venv}"), "the installer kept #!python"
        doc = json.loads(ev(tmp_path / "vault", "snap", "--venv", venv, "--json").stdout)
        show = json.loads(ev(tmp_path / "vault", "show", doc["id"], "--json").stdout)
        (pkg,) = [p for p in show["packages"] if p["name"] == "jmespath"]
        ids.append(pkg["build_id"])
    assert ids[0] == ids[1], ids
    d = ev(tmp_path / "vault", "diff", _second_newest(tmp_path / "vault"), "latest")
    assert "jmespath" not in d.stdout, d.stdout


def _second_newest(vault: Path) -> str:
    rows = json.loads(ev(vault, "list", "--all", "--json").stdout)["snapshots"]
    return rows[1]["id"]


def test_edited_certifi_bundle(tmp_path, uv_cache):
    """An image appends a CA to certifi's bundle before anything is snapped (and to pip's vendored one)."""
    venv = _make([sys.executable, "-m", "venv", tmp_path / "v"], tmp_path / "v")
    shape = Shape(venv, uv_cache, installer="pip")
    shape.install(*BASE)
    for bundle in (shape.site / "certifi" / "cacert.pem", *shape.site.glob("pip/_vendor/certifi/cacert.pem")):
        with open(bundle, "a") as f:
            f.write("\n# Corporate CA\n-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    cycle(tmp_path, shape, edit=JP_EDIT, delete=JP_DELETE, chmod=CHMOD)


def _setuptools_project(root: Path, name: str) -> Path:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text(f"NAME = {name!r}\n")
    (root / "pyproject.toml").write_text(
        f'[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "{name}"\nversion = "0.1"\n')
    return root


def _hatch_project(root: Path, name: str) -> Path:
    (root / "src" / name).mkdir(parents=True)
    (root / "src" / name / "__init__.py").write_text(f"NAME = {name!r}\n")
    (root / "pyproject.toml").write_text(
        f'[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
        f'[project]\nname = "{name}"\nversion = "0.1"\n')
    return root


def test_editables_pip_setuptools_and_uv_hatchling(tmp_path, uv_cache):
    venv = _make([sys.executable, "-m", "venv", tmp_path / "v"], tmp_path / "v")
    shape = Shape(venv, uv_cache, installer="pip", imports=("six", "jmespath", "edpip", "eduv"))
    shape.install(*BASE)
    shape.install("-e", _setuptools_project(tmp_path / "edpip", "edpip"))
    _run([find_uv(), "pip", "install", "-q", "--python", shape.python, "--cache-dir", uv_cache, "--index-url",
          PYPI, "-e", _hatch_project(tmp_path / "eduv", "eduv")])
    shape.check_imports()
    # Export of editables goes through their source folders (a build): not part of the offline sync here.
    cycle(tmp_path, shape, edit=JP_EDIT, delete=JP_DELETE, chmod=CHMOD, export=False)
    lock = (tmp_path / "lock2" / "pylock.toml")
    ev(tmp_path / "vault", "export", "good", "-o", lock, "--no-wheels")
    text = lock.read_text()
    assert "editable = true" in text and str(tmp_path / "edpip") in text and str(tmp_path / "eduv") in text, text


def test_egg_link_editable(tmp_path, uv_cache):
    """An old-style editable: `.egg-link` plus a line in easy-install.pth, no dist-info in site-packages."""
    venv = _make([sys.executable, "-m", "venv", tmp_path / "v"], tmp_path / "v")
    shape = Shape(venv, uv_cache, installer="pip")
    shape.install(*BASE)
    proj = tmp_path / "oldproj"
    (proj / "oldpkg").mkdir(parents=True)
    (proj / "oldpkg" / "__init__.py").write_text("X = 1\n")
    (proj / "oldpkg.egg-info").mkdir()
    (proj / "oldpkg.egg-info" / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: oldpkg\nVersion: 0.3\n")
    (shape.site / "oldpkg.egg-link").write_text(f"{proj}\n.")
    (shape.site / "easy-install.pth").write_text(f"{proj}\n")
    vault = tmp_path / "vault"
    doc = json.loads(ev(vault, "snap", "--venv", venv, "--json").stdout)
    show = json.loads(ev(vault, "show", doc["id"], "--json").stdout)
    assert "oldpkg" in [p["name"] for p in show["packages"]]
    assert any("oldpkg" in w and "outside" in w for w in doc["warnings"]), doc["warnings"]
    (shape.site / "oldpkg.egg-link").unlink()
    (shape.site / "easy-install.pth").write_text("")
    st = ev(vault, "status", "--venv", venv, "--exit-code", check=False)
    assert st.returncode == 1 and "oldpkg" in st.stdout, st


def test_local_folder_and_file_url_installs(tmp_path, uv_cache):
    venv = _make([sys.executable, "-m", "venv", tmp_path / "v"], tmp_path / "v")
    shape = Shape(venv, uv_cache, installer="pip", imports=("six", "jmespath", "fromdir", "fromurl"))
    shape.install(*BASE)
    shape.install(_setuptools_project(tmp_path / "fromdir", "fromdir"))
    whl = build_wheel(tmp_path / "wh", "fromurl", "1.0", {"fromurl/__init__.py": b"X = 1\n"})
    shape.install(whl.as_uri())
    cycle(tmp_path, shape, edit=JP_EDIT, delete=JP_DELETE, chmod=CHMOD)
    req = tmp_path / "req.txt"
    ev(tmp_path / "vault", "export", "good", "-o", req, "--format", "requirements")
    text = req.read_text()
    assert f"fromurl @ {whl.as_uri()}" in text, text


def test_namespaces_pth_and_data(tmp_path, uv_cache, wheelhouse):
    venv = _make([find_uv(), "venv", "-q", "--python", sys.executable, tmp_path / "v"], tmp_path / "v")
    shape = Shape(venv, uv_cache, installer="uv", imports=("six", "jmespath", "sharedns.alpha", "sharedns.beta", "withpth"))
    shape.install(*BASE)
    data = build_wheel(tmp_path / "wh", "withpth", "1.0",
                       {"withpth/__init__.py": b"X = 1\n", "withpth.pth": b"import os\n"},
                       data={"share/withpth/readme.txt": b"shared data\n", "etc/withpth/withpth.conf": b"[x]\ny=1\n"})
    _run([find_uv(), "pip", "install", "-q", "--python", shape.python, "--no-index",
          _by_name(wheelhouse, "nsa_alpha"),
          _by_name(wheelhouse, "nsa_beta"), data])
    assert (venv / "etc" / "withpth" / "withpth.conf").exists()
    cycle(tmp_path, shape, edit=JP_EDIT, delete=JP_DELETE, chmod=CHMOD)


def _by_name(wheelhouse: dict, stem: str) -> Path:
    (hit,) = [p for p in wheelhouse.values() if Path(p).name.startswith(stem + "-")]
    return hit


def test_150_packages(tmp_path, uv_cache):
    wh = tmp_path / "wh"
    wheels = [build_wheel(wh, f"bulk{i:03d}", "1.0", {f"bulk{i:03d}/__init__.py": f"N = {i}\n".encode(),
                                                      f"bulk{i:03d}/data.txt": os.urandom(200)})
              for i in range(146)]
    venv = _make([find_uv(), "venv", "-q", "--python", sys.executable, tmp_path / "v"], tmp_path / "v")
    shape = Shape(venv, uv_cache, installer="uv")
    shape.install(*BASE)
    _run([find_uv(), "pip", "install", "-q", "--python", shape.python, "--no-index", *wheels])
    assert len(list(shape.site.glob("*.dist-info"))) >= 150
    cycle(tmp_path, shape, edit=JP_EDIT, delete=JP_DELETE, chmod=CHMOD)
