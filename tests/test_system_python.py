"""System Pythons (issue 13): the installation an interpreter sees, snapped and restored like a venv.

Two shapes, each through the whole cycle (snap, second snap, status, break, diff, restore, ``--into``, export):

- a COPY of pyenv's CPython 3.12 (``cp -a`` into a temp folder; the original is never touched, and the test
  checks that it is not): pip installs into its prefix, a user site (``PYTHONUSERBASE`` in the temp folder),
  and a package made system-managed by a dpkg admin dir of the test's own (``ENVVAULT_DPKG_ADMINDIR``);
- Debian's ``/usr/bin/python3`` with apt's ``python3-*`` packages (``.ci/run`` installs python3-six and
  python3-idna): only the user site (in the temp folder) is changed by pip; a dpkg-owned file is edited and
  put back byte for byte inside the test, to see that restore reports it and leaves it alone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.machine import DEBIAN_PYTHON, cpython
from fixtures.venvs import isolated_env
from fixtures.wheels import build_wheel, record_hash
from tests.evtools import assert_one_line_error, ev, ev_env


def _tree_state(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` with its size, mtime and mode: a change anywhere shows."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            out[p] = (st.st_size, st.st_mtime_ns, st.st_mode)
    return out


def _wheels(out: Path) -> Path:
    build_wheel(out, "alpha", "1.0", {"alpha/__init__.py": b"VERSION = '1.0'\n"})
    build_wheel(out, "alpha", "2.0", {"alpha/__init__.py": b"VERSION = '2.0'\n"})
    build_wheel(out, "beta", "1.0", {"beta/__init__.py": b"B = 1\n"}, console_scripts={"beta-run": "beta:main"})
    build_wheel(out, "usersite", "1.0", {"usersite/__init__.py": b"U = 1\ndef main():\n    pass\n"},
                console_scripts={"usersite-run": "usersite:main"})
    build_wheel(out, "aptowned", "1.0", {"aptowned/__init__.py": b"A = 1\n", "aptowned/data.txt": b"apt\n"})
    return out


def _pip(python: Path, env: dict, *args: str) -> None:
    proc = subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", "--no-cache-dir", *args],
                          capture_output=True, text=True, env=env, cwd="/")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _packages(doc: dict) -> dict[str, dict]:
    return {p["name"]: p for p in doc["packages"]}


def _names(entries) -> set[str]:
    return {e["name"] for e in entries}


# -- a copy of pyenv's CPython -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pyenv_copy(tmp_path_factory):
    """(python, env, tmp): a copied pyenv CPython 3.12 with alpha 1.0 (pip), aptowned 1.0 (dpkg-owned in
    the test's admin dir, no INSTALLER, as Debian ships it) and usersite 1.0 in the user site."""
    original = cpython("3.12").parent.parent
    tmp = tmp_path_factory.mktemp("syspy")
    prefix = tmp / "py"
    subprocess.run(["cp", "-a", str(original), str(prefix)], check=True)
    python = prefix / "bin" / "python3.12"
    ran = subprocess.run([str(python), "-I", "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True)
    assert ran.returncode == 0 and ran.stdout.strip() == str(prefix), ran  # runs from its new place
    wheels = _wheels(tmp / "wheels")
    (tmp / "home").mkdir()
    env = isolated_env({"PYTHONUSERBASE": str(tmp / "user"), "HOME": str(tmp / "home"),
                        "ENVVAULT_DPKG_ADMINDIR": str(tmp / "dpkg"), "PIP_NO_INDEX": "1",
                        "PIP_FIND_LINKS": str(wheels)})
    _pip(python, env, "install", "alpha==1.0", "aptowned==1.0")
    _pip(python, env, "install", "--user", "usersite==1.0")
    # aptowned as a distribution package ships it: no INSTALLER, its files in dpkg's list.
    site = prefix / "lib" / "python3.12" / "site-packages"
    di = site / "aptowned-1.0.dist-info"
    (di / "INSTALLER").unlink()
    record = (di / "RECORD").read_text().splitlines()
    (di / "RECORD").write_text("".join(f"{r}\n" for r in record if not r.startswith("aptowned-1.0.dist-info/INSTALLER")))
    listed = ["/.", str(site), str(site / "aptowned"), str(di)] + [
        str(site / r.split(",")[0]) for r in record if not r.startswith("aptowned-1.0.dist-info/INSTALLER")]
    (tmp / "dpkg" / "info").mkdir(parents=True)
    (tmp / "dpkg" / "info" / "python3-aptowned.list").write_text("\n".join(listed) + "\n")
    before_original = _tree_state(original)
    yield python, env, tmp
    assert _tree_state(original) == before_original  # the original pyenv build is never touched


def test_pyenv_copy_whole_cycle(pyenv_copy):
    python, env, tmp = pyenv_copy
    vault = tmp / "vault"
    venv_env = ev_env(vault, UV_CACHE_DIR=str(tmp / "uv-cache"),
                      **{k: env[k] for k in ("PYTHONUSERBASE", "HOME", "ENVVAULT_DPKG_ADMINDIR")})
    home_before = _tree_state(tmp / "home")
    run = lambda *a, **kw: ev(vault, *a, env=venv_env, **kw)  # noqa: E731
    run_json = lambda *a, **kw: json.loads(run(*a, "--json", **kw).stdout)  # noqa: E731

    first = run_json("snap", "--python", python, "--no-caches")
    # The root holds the prefix and the user site: the temp folder.
    assert first["venv"] == str(tmp)
    second = run_json("snap", "--python", python, "--no-caches")
    assert second["fingerprint"] == first["fingerprint"]
    snap = run_json("show", second["id"])
    py = snap["python"]
    assert py["environment"] == "system" and py["prefix"] == "py" and py["version"].startswith("3.12.")
    assert py["user_site"] == "user/lib/python3.12/site-packages"
    assert py["sites"] == ["user/lib/python3.12/site-packages", "py/lib/python3.12/site-packages"]
    assert py["interpreter"] == os.path.realpath(python) and py["build"]
    pk = _packages(snap)
    assert pk["alpha"]["installer"] == "pip" and pk["alpha"]["site"] == "py/lib/python3.12/site-packages"
    assert pk["usersite"]["site"] == "user/lib/python3.12/site-packages"
    assert pk["aptowned"]["installer"] == "debian"
    assert run_json("status", "--python", python)["empty"]

    # Break it: pip upgrades and adds in the prefix, removes from the user site, an apt-owned file is edited.
    _pip(python, env, "install", "alpha==2.0", "beta==1.0")
    _pip(python, env, "uninstall", "-y", "usersite")
    owned = tmp / "py" / "lib" / "python3.12" / "site-packages" / "aptowned" / "data.txt"
    owned.write_text("edited by hand\n")
    status = run("status", "--python", python, "--json", "--exit-code", check=False)
    assert status.returncode == 1, status.stderr
    changes = json.loads(status.stdout)["packages"]
    assert _names(changes["added"]) == {"beta"} and _names(changes["removed"]) == {"usersite"}
    assert _names(changes["changed"]) == {"alpha", "aptowned"}
    diff = run_json("diff", second["id"], "current", "--python", python)["packages"]
    assert _names(diff["changed"]) == {"alpha", "aptowned"}

    # Restore in place: pip's files back, the dpkg-owned one reported and left as it is.
    restored = run("restore", second["id"], "--python", python, "--json", check=False)
    doc = json.loads(restored.stdout)
    assert restored.returncode == 1 and not doc["verified"], restored.stderr  # aptowned still differs
    assert any("python3-aptowned" in w and "apt-get install --reinstall python3-aptowned" in w
               for w in doc["warnings"]), doc["warnings"]
    assert owned.read_text() == "edited by hand\n"
    check = subprocess.run([str(python), "-c", "import alpha, usersite, sys; print(alpha.VERSION, usersite.__file__)"],
                           capture_output=True, text=True, env=env, cwd="/")
    assert check.returncode == 0 and check.stdout.startswith("1.0 " + str(tmp / "user")), check
    assert not (tmp / "py" / "bin" / "beta-run").exists()
    left = json.loads(run("status", "--python", python, "--json", check=False).stdout)["packages"]
    assert _names(left["changed"]) == {"aptowned"} and not left["added"] and not left["removed"]

    # --into: a fresh venv with the same packages (system-managed ones copied).
    new = tmp / "moved"
    into = run_json("restore", second["id"], "--into", new)
    assert into["verified"], into
    moved_py = new / "bin" / "python"
    check = subprocess.run([str(moved_py), "-c", "import alpha, usersite, aptowned; print(alpha.VERSION)"],
                           capture_output=True, text=True, env=env, cwd="/")
    assert check.returncode == 0 and check.stdout.strip() == "1.0", check

    # guard around a `pip install --user` of that interpreter: snapshots before and after, the change named.
    guarded = run("guard", "--python", python, "--yes", "--json", "--", str(python), "-m", "pip", "install",
                  "--user", "--no-index", "--find-links", env["PIP_FIND_LINKS"], "beta==1.0")
    gdoc = json.loads(guarded.stdout)
    assert gdoc["exit_code"] == 0 and _names(gdoc["diff"]["packages"]["added"]) == {"beta"}, gdoc
    assert run_json("show", gdoc["after"])["venv"] == str(tmp)

    # The shell hook, with no venv active and ENVVAULT_PYTHON naming the system interpreter (a container's).
    hook = run("shell-hook", "bash").stdout
    shell_env = dict(venv_env, PATH=f"{python.parent}:{venv_env['PATH']}", ENVVAULT_PYTHON=str(python),
                     PIP_NO_INDEX="1", PIP_FIND_LINKS=env["PIP_FIND_LINKS"], PIP_CONFIG_FILE=os.devnull)
    shell_env.pop("PYTHONPATH")
    shell_env.pop("VIRTUAL_ENV", None)
    hooked = subprocess.run(["bash", "-c", hook + '\npython3.12 -m pip uninstall -y -q beta'], capture_output=True,
                            text=True, env=shell_env, cwd=str(tmp), stdin=subprocess.DEVNULL)
    assert hooked.returncode == 0 and "removed   beta 1.0" in hooked.stderr, hooked

    # `sudo ... python3.12 -m pip install --break-system-packages` through the hook, with a stand-in sudo on PATH
    # (none is installed here; it drops its flags and runs the rest): guarded as a change of the system Python,
    # guard itself running as the user; any other sudo command runs as typed.
    bindir = tmp / "sudo-bin"
    bindir.mkdir()
    (bindir / "sudo").write_text('#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do shift; done\n'
                                 'echo "sudo ran: $*" >&2\nexec "$@"\n')
    (bindir / "sudo").chmod(0o755)
    sudo_env = dict(shell_env, PATH=f"{bindir}:{shell_env['PATH']}")
    hooked = subprocess.run(["bash", "-c", hook + "\nsudo -E python3.12 -m pip install -q --break-system-packages "
                             "beta==1.0 && sudo -n true"], capture_output=True, text=True, env=sudo_env,
                            cwd=str(tmp), stdin=subprocess.DEVNULL)
    assert hooked.returncode == 0, hooked
    assert re.search(r"added +beta 1\.0", hooked.stderr), hooked.stderr
    assert "sudo ran: python3.12 -m pip install -q --break-system-packages beta==1.0" in hooked.stderr
    assert "sudo ran: true" in hooked.stderr and hooked.stderr.count("envvault") >= 1
    assert (tmp / "py" / "bin" / "beta-run").exists()

    # Export, and nothing written outside the temp folder (HOME untouched: no ~/.local, no cache).
    out = tmp / "export" / "pylock.toml"
    run("export", second["id"], "-o", out)
    text = out.read_text()
    assert 'name = "alpha"' in text and 'name = "usersite"' in text
    assert _tree_state(tmp / "home") == home_before


def test_sudo_pip_and_break_system_packages_are_parsed_as_installs():
    from envvault.guard.command import locate_target, parse_command

    for argv, n in ((["sudo", "pip", "install", "x"], 1), (["sudo", "-E", "-H", "python3", "-m", "pip", "install", "x"], 3),
                    (["sudo", "/usr/bin/pip3.11", "uninstall", "-y", "x"], 1),
                    (["pip", "install", "--break-system-packages", "x"], 0),
                    (["sudo", "python3.12", "-mpip", "install", "--break-system-packages", "x"], 1)):
        cmd = parse_command(argv)
        assert cmd.tool == "pip" and cmd.mutating and not cmd.elsewhere and cmd.argv == tuple(argv), (argv, cmd)
        assert cmd.sudo == tuple(argv[:n]), (argv, cmd.sudo)
        if cmd.sudo:  # sudo's PATH, not the user's, finds the tool: only --python names the environment
            assert locate_target(cmd, {"PATH": os.environ["PATH"]}, Path("/")) is None
    for argv in (["sudo", "apt-get", "install", "x"], ["sudo", "-u", "bob", "pip", "install", "x"],
                 ["sudo", "uv", "pip", "install", "x"], ["sudo"], ["sudo", "pip", "install", "--dry-run", "x"]):
        assert not parse_command(argv).mutating, argv


def test_python_bad_input_is_one_line(tmp_path):
    vault = tmp_path / "vault"
    for args, needle in ((["--python", tmp_path / "nope"], "not an executable file"),
                         (["--python", "/bin/true"], "does not answer like a CPython"),
                         (["--python", sys.executable], "belongs to the virtual environment"),
                         (["--python", "/usr/bin/python3", "--venv", tmp_path], "not both")):
        assert_one_line_error(ev(vault, "snap", *args, "--no-caches", check=False), needle)
    # Interpreters that answer the probe with JSON of the wrong shape (a sitecustomize or .pth that prints,
    # or a fake): one line each, never an internal error.
    answers = {"half": '{"prefix": "%s"}', "wrong-types": '{"prefix": "%s", "base_prefix": "%s", "sites": 5}',
               "a-list": "[1, 2]", "deep": "[" * 100_000 + "]" * 100_000}
    for name, answer in answers.items():
        fake = tmp_path / f"fake-{name}"
        (fake / "bin").mkdir(parents=True)
        exe = fake / "bin" / "python3"
        exe.write_text(f"#!/bin/sh\ncat <<'EOF'\n{answer.replace('%s', str(fake))}\nEOF\n")
        exe.chmod(0o755)
        assert_one_line_error(ev(vault, "snap", "--python", exe, "--no-caches", check=False),
                              "does not answer like a CPython")
        venv = tmp_path / f"venv-{name}"  # the same answer from a venv's interpreter
        (venv / "bin").mkdir(parents=True)
        (venv / "pyvenv.cfg").write_text(f"home = {fake / 'bin'}\n")
        vexe = venv / "bin" / "python"
        vexe.write_text(f"#!/bin/sh\ncat <<'EOF'\n{answer.replace('%s', str(venv))}\nEOF\n")
        vexe.chmod(0o755)
        assert_one_line_error(ev(vault, "snap", "--venv", venv, "--no-caches", check=False),
                              "does not answer like a CPython")


# -- Debian's /usr/bin/python3 -----------------------------------------------------------------------------


def test_debian_python_with_apt_packages_and_user_site(tmp_path):
    assert DEBIAN_PYTHON.exists()
    owned = Path("/usr/lib/python3/dist-packages/distro/py.typed")  # python3-distro, a RECORD with sha256
    owner = subprocess.run(["dpkg", "-S", str(owned)], capture_output=True, text=True)
    assert owner.returncode == 0 and owner.stdout.startswith("python3-distro:"), owner
    wheels = _wheels(tmp_path / "wheels")
    env = isolated_env({"PYTHONUSERBASE": str(tmp_path / "user"), "HOME": str(tmp_path / "home"),
                        "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels), "PIP_BREAK_SYSTEM_PACKAGES": "1"})
    (tmp_path / "home").mkdir()
    vault = tmp_path / "vault"
    ev_vars = ev_env(vault, PYTHONUSERBASE=env["PYTHONUSERBASE"], HOME=env["HOME"], UV_CACHE_DIR=str(tmp_path / "uv-cache"))
    run = lambda *a, **kw: ev(vault, *a, env=ev_vars, **kw)  # noqa: E731
    run_json = lambda *a, **kw: json.loads(run(*a, "--json", **kw).stdout)  # noqa: E731
    system_dirs = [Path("/usr/lib/python3/dist-packages"), Path("/usr/local/lib/python3.11/dist-packages"),
                   Path("/usr/local/bin")]
    before = {d: _tree_state(d) for d in system_dirs if d.exists()}
    run("snap", "--python", DEBIAN_PYTHON, "--no-caches")  # no user site yet: it is seen once it exists
    _pip(DEBIAN_PYTHON, env, "install", "--user", "usersite==1.0", "alpha==1.0")
    assert _names(run_json("status", "--python", DEBIAN_PYTHON, check=False)["packages"]["added"]) == {"usersite", "alpha"}

    first = run_json("snap", "--python", DEBIAN_PYTHON, "--no-caches")
    second = run_json("snap", "--venv", "/usr", "--no-caches")  # the prefix of an interpreter: the same environment
    assert second["venv"] == first["venv"] == "/" and second["fingerprint"] == first["fingerprint"]
    snap = run_json("show", second["id"])
    pk = _packages(snap)
    for name in ("six", "idna", "distro"):
        assert pk[name]["installer"] == "debian" and pk[name]["site"] == "usr/lib/python3/dist-packages", pk[name]
    assert pk["usersite"]["site"] == f"{str(tmp_path)[1:]}/user/lib/python3.11/site-packages"
    assert pk["alpha"]["installer"] == "pip" and not pk["distro"]["modified"]
    assert "unchanged" in run("status", "--python", DEBIAN_PYTHON).stdout

    original = owned.read_bytes()
    stat = owned.stat()
    try:
        owned.write_bytes(original + b"# edited\n")
        _pip(DEBIAN_PYTHON, env, "uninstall", "-y", "usersite")
        _pip(DEBIAN_PYTHON, env, "install", "--user", "alpha==2.0")
        changes = run_json("status", "--python", DEBIAN_PYTHON, check=False)["packages"]
        assert _names(changes["removed"]) == {"usersite"} and _names(changes["changed"]) == {"alpha", "distro"}
        diff = run_json("diff", second["id"], "current")["packages"]  # the snapshot's interpreter, found again
        assert _names(diff["changed"]) == {"alpha", "distro"}
        # A restore killed once its journal is written: the journal lies in the vault's state, never at
        # /.envvault-restore.json (the root / need not be writable); status finds it; the rerun completes.
        killed = ev(vault, "restore", second["id"], env=dict(ev_vars, ENVVAULT_TEST_CRASH_AT="journal"), check=False)
        assert killed.returncode == -9, killed.stderr
        assert not os.path.lexists("/.envvault-restore.json")
        journals = list((vault / "state").glob("journal-*.json"))
        assert len(journals) == 1 and json.loads(journals[0].read_text())["snapshot"] == second["id"], journals
        warned = run("status", "--python", DEBIAN_PYTHON, "--json", check=False)
        assert json.loads(warned.stdout)["interrupted_restore"] == second["id"], warned.stderr
        assert "was interrupted" in warned.stderr
        restored = run("restore", second["id"], "--json", check=False)
        doc = json.loads(restored.stdout)
        assert restored.returncode == 1, restored.stderr
        assert any("apt-get install --reinstall python3-distro" in w for w in doc["warnings"]), doc["warnings"]
        assert owned.read_bytes() == original + b"# edited\n"  # reported, not touched
        assert not list((vault / "state").glob("journal-*.json")) and not os.path.lexists("/.envvault-restore.json")
    finally:
        owned.write_bytes(original)
        os.utime(owned, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert "unchanged" in run("status", "--python", DEBIAN_PYTHON).stdout
    check = subprocess.run([str(DEBIAN_PYTHON), "-c", "import alpha, usersite; print(alpha.VERSION)"],
                           capture_output=True, text=True, env=env, cwd="/")
    assert check.returncode == 0 and check.stdout.strip() == "1.0", check

    # --into copying everything cannot hold Debian's egg-info packages (no RECORD: no files stored): one line
    # naming them and the option, nothing made (its dry run says the same).
    half = tmp_path / "half"
    for extra in ((), ("--dry-run",)):
        refused = run("restore", second["id"], "--into", half, *extra, check=False)
        assert refused.returncode == 3, refused
        assert_one_line_error(refused, "system-managed", "--system-site-packages")
        assert not half.exists()
    egg = [p for p in pk.values() if p["installer"] == "debian" and p.get("record", "ok") != "ok"]
    assert egg and all(f"{p['name']} {p['version']}" in refused.stderr for p in egg[:8]), (egg, refused.stderr)

    # --into with the system's packages left to the base interpreter.
    new = tmp_path / "moved"
    into = run_json("restore", second["id"], "--into", new, "--system-site-packages")
    assert into["verified"], into
    check = subprocess.run([str(new / "bin" / "python"), "-c", "import alpha, usersite, six, idna; print(alpha.VERSION)"],
                           capture_output=True, text=True, env=env, cwd="/")
    assert check.returncode == 0 and check.stdout.strip() == "1.0", check
    run("export", second["id"], "-o", tmp_path / "export" / "pylock.toml")
    assert {d: _tree_state(d) for d in system_dirs if d.exists()} == before  # the system was not written


def test_python_on_list_cache_and_torch_hook_commands(pyenv_copy, tmp_path):
    """--python where --venv is: list filters to that installation, the cache commands fingerprint it, the
    torch stamping hook refuses it in one line (a venv only)."""
    python, env, tmp = pyenv_copy
    vault = tmp_path / "vault"
    venv_env = ev_env(vault, **{k: env[k] for k in ("PYTHONUSERBASE", "HOME", "ENVVAULT_DPKG_ADMINDIR")})
    run = lambda *a, **kw: ev(vault, *a, env=venv_env, **kw)  # noqa: E731
    run_json = lambda *a, **kw: json.loads(run(*a, "--json", **kw).stdout)  # noqa: E731
    mine = run_json("snap", "--python", python, "--lock-only", "--no-caches")
    other = run_json("snap", "--python", DEBIAN_PYTHON, "--lock-only", "--no-caches")
    assert mine["venv"] == str(tmp) and other["venv"] == "/"
    assert [r["id"] for r in run_json("list", "--python", python)["snapshots"]] == [mine["id"]]
    assert [r["id"] for r in run_json("list", "--python", DEBIAN_PYTHON)["snapshots"]] == [other["id"]]
    assert len(run_json("list", "--all")["snapshots"]) == 2

    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "k.bin").write_bytes(b"kernel" * 100)
    cached = run_json("cache", "snap", "--python", python, "--no-discover", "--cache-dir", kernels)
    assert [c["root"] for c in cached["caches"]] == [str(kernels)], cached
    assert run_json("show", cached["id"])["venv"] == str(tmp)
    where = run_json("cache", "list", "--where", "--python", python)
    assert [c["root"] for c in where["caches"]] == [str(kernels)] and "locations" in where
    dry = run("cache", "restore", "latest", "--python", python, "--archived-roots", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert_one_line_error(run("cache", "snap", "--python", python, "--venv", tmp, check=False), "not both")

    for command in ("install-hook", "uninstall-hook"):
        assert_one_line_error(run("torch", command, "--python", python, check=False), "system Python", "--venv")
        assert_one_line_error(run("torch", command, "--venv", tmp / "py", check=False), "system Python")
    assert not list((tmp / "py" / "lib" / "python3.12" / "site-packages").glob("*envvault*"))


def test_two_interpreters_sharing_root_keep_their_own_baseline(pyenv_copy, tmp_path):
    """Debian's python3 and the pyenv copy, both with a user base outside the temp folder, share the root /:
    status of one never compares with the other's snapshot."""
    python, env, tmp = pyenv_copy
    vault = tmp_path / "vault"
    userbase = f"/nonexistent-envvault-{os.getpid()}"  # enabled, never created: the root of both is /
    venv_env = ev_env(vault, PYTHONUSERBASE=userbase, HOME=env["HOME"],
                      ENVVAULT_DPKG_ADMINDIR=env["ENVVAULT_DPKG_ADMINDIR"])
    run = lambda *a, **kw: ev(vault, *a, env=venv_env, **kw)  # noqa: E731
    deb = json.loads(run("snap", "--python", DEBIAN_PYTHON, "--lock-only", "--no-caches", "--json").stdout)
    assert deb["venv"] == "/"
    status = run("status", "--python", python, "--json", check=False)
    assert_one_line_error(status, "no snapshot of /")
    for args in (["restore", "latest", "--dry-run"], ["diff", "latest", "current"], ["export", "latest", "-o",
                 tmp_path / "p.toml", "--no-wheels"], ["status", "--against", "latest"]):  # never Debian's
        proc = run(*args, "--python", python, check=False)
        assert_one_line_error(proc, "no snapshot of /")
        assert proc.returncode == 4, args
    mine = json.loads(run("snap", "--python", python, "--lock-only", "--no-caches", "--json").stdout)
    assert mine["venv"] == "/"
    for exe, sid in ((python, mine["id"]), (DEBIAN_PYTHON, deb["id"])):
        doc = json.loads(run("status", "--python", exe, "--json").stdout)
        assert doc["snapshot"] == sid and doc["empty"], doc
        # list --python lists that interpreter's snapshots only (it listed both: helper 31)
        listed = [s["id"] for s in json.loads(run("list", "--python", exe, "--json").stdout)["snapshots"]]
        assert listed == [sid], (exe, listed)
    # gc --keep-last 1 keeps each interpreter's own latest (it dropped Debian's only snapshot, helper-14)
    run("gc", "--keep-last", "1")
    for exe, sid in ((python, mine["id"]), (DEBIAN_PYTHON, deb["id"])):
        doc = json.loads(run("status", "--python", exe, "--json").stdout)
        assert doc["snapshot"] == sid and doc["empty"], doc
    assert not os.path.exists(userbase)


def test_a_file_a_system_package_shares_with_a_pip_one_is_restored(tmp_path):
    """In a system environment, a file listed by a "debian" distribution and by a pip-installed one is written
    back by an in-place restore even when the debian one comes first in the snapshot (its write is the pip
    package's: held only if every distribution listing it is the system's); the files only the debian one
    lists are held, with a warning naming it."""
    prefix = tmp_path / "py"
    subprocess.run(["cp", "-a", str(cpython("3.12").parent.parent), str(prefix)], check=True)
    python = prefix / "bin" / "python3.12"
    wheels = tmp_path / "wheels"
    build_wheel(wheels, "aaasys", "1.0", {"aaasys/__init__.py": b"S = 1\n", "sharedpkg/common.txt": b"same\n"})
    build_wheel(wheels, "zzzpip", "1.0", {"zzzpip/__init__.py": b"P = 1\n", "sharedpkg/common.txt": b"same\n"})
    (tmp_path / "home").mkdir()
    (tmp_path / "dpkg").mkdir()  # no dpkg list: only INSTALLER makes aaasys the system's
    env = isolated_env({"PYTHONUSERBASE": str(tmp_path / "user"), "HOME": str(tmp_path / "home"),
                        "ENVVAULT_DPKG_ADMINDIR": str(tmp_path / "dpkg"), "PIP_NO_INDEX": "1",
                        "PIP_FIND_LINKS": str(wheels)})
    _pip(python, env, "install", "aaasys==1.0", "zzzpip==1.0")
    site = prefix / "lib" / "python3.12" / "site-packages"
    di = site / "aaasys-1.0.dist-info"
    installer = b"debian\n"
    (di / "INSTALLER").write_bytes(installer)  # and RECORD's row for it updated: the snapshot sees no edited file
    rows = (di / "RECORD").read_text().splitlines()
    assert any(r.startswith("aaasys-1.0.dist-info/INSTALLER,sha256=") for r in rows), rows
    (di / "RECORD").write_text("".join(
        f"aaasys-1.0.dist-info/INSTALLER,{record_hash(installer)},{len(installer)}\n"
        if r.startswith("aaasys-1.0.dist-info/INSTALLER,") else f"{r}\n" for r in rows))

    vault = tmp_path / "vault"
    run_env = ev_env(vault, UV_CACHE_DIR=str(tmp_path / "uv-cache"),
                     **{k: env[k] for k in ("PYTHONUSERBASE", "HOME", "ENVVAULT_DPKG_ADMINDIR")})
    run = lambda *a, **kw: ev(vault, *a, env=run_env, **kw)  # noqa: E731
    snap = json.loads(run("snap", "--python", python, "--no-caches", "--json").stdout)
    shown = json.loads(run("show", snap["id"], "--json").stdout)
    order = [p["name"] for p in shown["packages"]]
    assert order.index("aaasys") < order.index("zzzpip"), order  # the debian one's write of the file comes first
    pk = _packages(shown)
    assert pk["aaasys"]["installer"] == "debian" and pk["zzzpip"]["installer"] == "pip"
    assert not pk["aaasys"]["modified"] and not pk["zzzpip"]["modified"]

    # No distribution lists the shared file now but zzzpip (pip): aaasys is gone, the file deleted.
    shutil.rmtree(site / "aaasys")
    shutil.rmtree(di)
    shared = site / "sharedpkg" / "common.txt"
    shared.unlink()
    restored = run("restore", snap["id"], "--python", python, "--json", check=False)
    doc = json.loads(restored.stdout)
    assert restored.returncode == 1 and not doc["verified"], restored.stderr  # aaasys is still gone
    assert shared.read_bytes() == b"same\n"
    assert not (site / "aaasys").exists() and not di.exists()
    left = doc["remaining"]["packages"]  # zzzpip whole again; aaasys, held, the one difference
    assert _names(left["added"]) == {"aaasys"} and not left["changed"] and not left["removed"], left
    # Held: every file aaasys alone lists (its RECORD less bytecode and the shared file), named in one warning.
    alone = [r for r in rows if not r.startswith("sharedpkg/") and "__pycache__" not in r]
    held = [w for w in doc["warnings"] if "the system package of aaasys" in w]
    assert len(held) == 1 and held[0].startswith(f"{len(alone)} file(s) of the system package of aaasys are "
                                                 "managed by the system package manager"), doc["warnings"]


# -- every other pyenv CPython: the cycle's core on a copy of each -----------------------------------------


@pytest.mark.parametrize("minor", ["3.8", "3.9", "3.10", "3.11", "3.13"])
def test_each_pyenv_cpython_copy_snaps_restores_and_moves(minor, tmp_path):
    """A copy of each other pyenv CPython as a system environment (3.12 has the whole cycle above): pip
    installs into its prefix and a user site, snap twice, break (upgrade, add, uninstall from the user site),
    status names it, restore in place verifies, --into gives a venv that imports the packages, export
    lists them; the original build is never touched and nothing is written outside the temp folder."""
    original = cpython(minor).parent.parent
    before_original = _tree_state(original)
    prefix = tmp_path / "py"
    subprocess.run(["cp", "-a", str(original), str(prefix)], check=True)
    python = prefix / "bin" / f"python{minor}"
    ran = subprocess.run([str(python), "-I", "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True)
    assert ran.returncode == 0 and ran.stdout.strip() == str(prefix), ran
    wheels = _wheels(tmp_path / "wheels")
    (tmp_path / "home").mkdir()
    env = isolated_env({"PYTHONUSERBASE": str(tmp_path / "user"), "HOME": str(tmp_path / "home"),
                        "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)})
    _pip(python, env, "install", "alpha==1.0")
    _pip(python, env, "install", "--user", "usersite==1.0")
    home_before = _tree_state(tmp_path / "home")

    vault = tmp_path / "vault"
    run_env = ev_env(vault, UV_CACHE_DIR=str(tmp_path / "uv-cache"), PYTHONUSERBASE=env["PYTHONUSERBASE"],
                     HOME=env["HOME"])
    run = lambda *a, **kw: ev(vault, *a, env=run_env, **kw)  # noqa: E731
    run_json = lambda *a, **kw: json.loads(run(*a, "--json", **kw).stdout)  # noqa: E731
    first = run_json("snap", "--python", python, "--no-caches")
    second = run_json("snap", "--python", python, "--no-caches")
    assert second["fingerprint"] == first["fingerprint"] and first["venv"] == str(tmp_path)
    shown = run_json("show", first["id"])
    assert shown["python"]["environment"] == "system" and shown["python"]["version"].startswith(minor + ".")
    pk = _packages(shown)
    assert pk["alpha"]["installer"] == "pip" and pk["usersite"]["site"].startswith("user/")
    assert run_json("status", "--python", python)["empty"]

    _pip(python, env, "install", "alpha==2.0", "beta==1.0")
    _pip(python, env, "uninstall", "-y", "usersite")
    status = run("status", "--python", python, "--json", "--exit-code", check=False)
    assert status.returncode == 1, status.stderr
    changes = json.loads(status.stdout)["packages"]
    assert (_names(changes["added"]), _names(changes["removed"]), _names(changes["changed"])) == (
        {"beta"}, {"usersite"}, {"alpha"})

    restored = run_json("restore", first["id"], "--python", python)
    assert restored["verified"], restored
    check = subprocess.run([str(python), "-c", "import alpha, usersite; print(alpha.VERSION)"], capture_output=True,
                           text=True, env=env, cwd="/")
    assert check.returncode == 0 and check.stdout.strip() == "1.0", check
    assert run_json("status", "--python", python)["empty"]

    into = run_json("restore", first["id"], "--into", tmp_path / "moved")
    assert into["verified"], into
    moved = subprocess.run([str(tmp_path / "moved" / "bin" / "python"), "-c", "import alpha, usersite"],
                           capture_output=True, text=True, env=env, cwd="/")
    assert moved.returncode == 0, moved
    out = tmp_path / "export" / "pylock.toml"
    run("export", first["id"], "-o", out)
    assert 'name = "alpha"' in out.read_text() and 'name = "usersite"' in out.read_text()
    assert _tree_state(tmp_path / "home") == home_before
    assert _tree_state(original) == before_original


def test_a_system_restore_writes_only_where_the_interpreter_installs(tmp_path, monkeypatch):
    """The root of Debian's Python is "/": a system snapshot from someone else naming, for a pip package,
    the standard library, the interpreter, a dpkg conffile or /etc/passwd must not get them written or
    deleted. dpkg-owned files anywhere under the root are held (not only those in the site folders), and
    paths outside the install locations (sites, scripts, the data prefix of pip's schemes) are left alone;
    a pip package's own files, its scripts and its data files are still restored."""
    from types import SimpleNamespace as NS

    from envvault.restore.managed import hold_managed, install_areas
    from envvault.restore.plan import FileWrite, Plan

    admin = tmp_path / "dpkg"
    (admin / "info").mkdir(parents=True)
    (admin / "info" / "libpython3.11-minimal:amd64.list").write_text(
        "/usr/lib/python3.11\n/usr/lib/python3.11/os.py\n/usr/bin/python3.11\n/etc/python3.11/sitecustomize.py\n")
    monkeypatch.setenv("ENVVAULT_DPKG_ADMINDIR", str(admin))
    py = NS(system=True, scripts="usr/local/bin", purelib="usr/local/lib/python3.11/dist-packages",
            platlib="usr/local/lib/python3.11/dist-packages", user_site="root/.local/lib/python3.11/site-packages",
            sites=("root/.local/lib/python3.11/site-packages", "usr/local/lib/python3.11/dist-packages",
                   "usr/lib/python3/dist-packages"))
    assert set(install_areas(py)) == {"root/.local/", "root/.local/lib/python3.11/site-packages/", "usr/local/",
                                      "usr/local/bin/", "usr/local/lib/python3.11/dist-packages/",
                                      "usr/lib/python3/dist-packages/"}
    snapshot = NS(python=py, packages=(NS(name="evil", installer="pip"),))

    def w(path):
        return FileWrite(path, ("00" * 32,), 1, "x", 0o644, None, "evil")

    plan = Plan(snapshot_id="0" * 64, diff=None,
                writes=(w("usr/lib/python3.11/os.py"), w("usr/bin/python3.11"), w("etc/passwd"),
                        w("usr/local/lib/python3.11/dist-packages/evil/__init__.py"), w("usr/local/bin/evil"),
                        w("usr/local/share/evil/data.json")),
                keeps=(), removals=("etc/python3.11/sitecustomize.py", "usr/sbin/something"),
                remove_dirs=(), install=("evil 1.0",), remove=(), warnings=(), dist_infos=(), modes=())
    out = hold_managed(plan, Path("/"), NS(python=py), snapshot, current=[])
    assert [x.path for x in out.writes] == ["usr/local/lib/python3.11/dist-packages/evil/__init__.py",
                                           "usr/local/bin/evil", "usr/local/share/evil/data.json"]
    assert out.removals == ()
    text = " ".join(out.warnings)
    assert "libpython3.11-minimal" in text and "apt-get install --reinstall libpython3.11-minimal" in text
    assert "outside the interpreter's install locations" in text and "etc/passwd" in text


def test_two_interpreters_of_one_root_keep_what_each_was_restored_to(tmp_path):
    """Copies of pyenv's 3.12 and 3.10 with one user base share their root: a restore by one never hides
    what the other was restored to (one `restored-` marker per root did: status of the first then compared
    with its newest snapshot, and gc --keep-last 1 dropped what it held, helper-15); a lock-only snapshot of
    a system environment is refused in place with the --into command to run instead."""
    wheels = _wheels(tmp_path / "wheels")
    (tmp_path / "home").mkdir()
    env = isolated_env({"PYTHONUSERBASE": str(tmp_path / "user"), "HOME": str(tmp_path / "home"),
                        "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)})
    vault = tmp_path / "vault"
    run_env = ev_env(vault, UV_CACHE_DIR=str(tmp_path / "uv-cache"), PYTHONUSERBASE=env["PYTHONUSERBASE"],
                     HOME=env["HOME"])
    run = lambda *a, **kw: ev(vault, *a, env=run_env, **kw)  # noqa: E731
    run_json = lambda *a, **kw: json.loads(run(*a, "--json", **kw).stdout)  # noqa: E731
    pythons, firsts = [], []
    for minor in ("3.12", "3.10"):
        prefix = tmp_path / f"py{minor}"
        subprocess.run(["cp", "-a", str(cpython(minor).parent.parent), str(prefix)], check=True)
        python = prefix / "bin" / f"python{minor}"
        _pip(python, env, "install", "alpha==1.0")
        first = run_json("snap", "--python", python, "--no-caches")
        assert first["venv"] == str(tmp_path), first
        _pip(python, env, "install", "beta==1.0")
        run_json("snap", "--python", python, "--no-caches")
        pythons.append(python)
        firsts.append(first["id"])
    for python, sid in zip(pythons, firsts):
        assert run_json("restore", sid, "--python", python)["verified"]
    for python, sid in zip(pythons, firsts):
        status = run_json("status", "--python", python)
        assert status["snapshot"] == sid and status["empty"], status
        assert run_json("restore", "latest", "--python", python, "--dry-run")["restored"] == sid
    run("gc", "--keep-last", "1")
    for python, sid in zip(pythons, firsts):
        assert run_json("status", "--python", python)["snapshot"] == sid
    lock = run_json("snap", "--python", pythons[0], "--lock-only")["id"]
    proc = run("restore", lock[:12], "--python", pythons[0], check=False)
    assert_one_line_error(proc, "is lock-only", f"restore {lock[:12]} --into NEW_PATH")
    assert proc.returncode == 2


def test_a_guard_of_one_interpreter_inside_a_guard_of_another_of_the_same_root_guards_its_own(tmp_path):
    """Copies of pyenv's 3.12 and 3.10 share their root. A guard of 3.12 whose command runs a guard of 3.10: both
    had one guard lock (the root's), so the inner guard ran its command "as part of" the outer one, which
    snapshots 3.12 only, and a failed install into 3.10 stayed (helper 26, F1). Each interpreter of a root now
    has its own guard lock: the inner guard snapshots 3.10 and rolls its failure back."""
    import sys

    wheels = _wheels(tmp_path / "wheels")
    (tmp_path / "home").mkdir()
    pip_env = {"PYTHONUSERBASE": str(tmp_path / "user"), "HOME": str(tmp_path / "home"), "PIP_NO_INDEX": "1",
               "PIP_FIND_LINKS": str(wheels), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env = isolated_env(pip_env)
    vault = tmp_path / "vault"
    run_env = ev_env(vault, UV_CACHE_DIR=str(tmp_path / "uv-cache"), **pip_env)
    pythons = {}
    for minor in ("3.12", "3.10"):
        prefix = tmp_path / f"py{minor}"
        subprocess.run(["cp", "-a", str(cpython(minor).parent.parent), str(prefix)], check=True)
        pythons[minor] = prefix / "bin" / f"python{minor}"
        _pip(pythons[minor], env, "install", "alpha==1.0")
    inner = [sys.executable, "-m", "envvault", "guard", "--python", str(pythons["3.10"]), "--yes", "--json", "--",
             "sh", "-c", f"{pythons['3.10']} -m pip install -q beta==1.0; exit 1"]
    script = (f"import pathlib, subprocess, sys; p = subprocess.run({inner!r}, capture_output=True, text=True); "
              f"pathlib.Path({str(tmp_path / 'inner.json')!r}).write_text(p.stdout); sys.stderr.write(p.stderr); "
              f"sys.exit(p.returncode)")
    outer = ev(vault, "guard", "--python", pythons["3.12"], "--yes", "--json", "--", sys.executable, "-c", script,
               env=run_env, check=False)
    inner_doc = json.loads((tmp_path / "inner.json").read_text())
    assert inner_doc["outcome"] == "restored", outer.stderr
    assert outer.returncode == 1 and "is guarded by the envvault guard that runs this command" not in outer.stderr
    listed = subprocess.run([str(pythons["3.10"]), "-m", "pip", "list", "--format=freeze"], capture_output=True,
                            text=True, env=env, cwd="/").stdout
    assert "beta==" not in listed and "alpha==1.0" in listed, listed


def test_one_interpreter_has_one_guard_lock_however_it_is_named(tmp_path):
    """A system environment guarded as ``--python EXE`` and as ``--venv PREFIX`` (its own prefix) had two guard
    locks once the lock was made per interpreter from ``--python`` alone (helper 27): two guards of one
    interpreter no longer excluded each other. Both names now take the interpreter in use."""
    import sys
    import time as _time

    prefix = tmp_path / "py3.10"
    subprocess.run(["cp", "-a", str(cpython("3.10").parent.parent), str(prefix)], check=True)
    python = prefix / "bin" / "python3.10"
    (tmp_path / "home").mkdir()
    run_env = ev_env(tmp_path / "vault", PYTHONUSERBASE=str(tmp_path / "user"), HOME=str(tmp_path / "home"))
    started = tmp_path / "started"
    first = subprocess.Popen(
        [sys.executable, "-m", "envvault", "guard", "--python", str(python), "--yes", "--", sys.executable, "-c",
         f"import pathlib, sys; pathlib.Path({str(started)!r}).touch(); sys.stdin.readline()"],
        env=run_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = _time.monotonic() + 300
        while not started.exists():  # the first guard's command runs: its lock held
            assert first.poll() is None and _time.monotonic() < deadline, first.stderr.read()
            _time.sleep(0.05)
        second = ev(tmp_path / "vault", "guard", "--venv", prefix, "--yes", "--", "true", env=run_env, check=False)
        assert second.returncode == 3 and "another envvault guard" in second.stderr, second.stderr
        first.stdin.write("\n")
        first.stdin.flush()
        first.communicate(timeout=300)
    finally:
        first.kill()
        first.wait()


def test_a_system_python_without_torch_carries_no_inductor_cache(pyenv_copy, tmp_path):
    """``snap --python`` of an interpreter without torch archived the Inductor cache in every snapshot (147 MiB
    of precompiled headers, helper 31): the test of which caches an environment can use looked for
    site-packages under the root (``/``, or a common ancestor), found none and took every cache. It looks in
    the interpreter's own site folders now, as it does a venv's."""
    python, env, _tmp = pyenv_copy
    vault = tmp_path / "vault"
    inductor = tmp_path / "inductor"
    (inductor / "fxgraph" / "ab").mkdir(parents=True)
    (inductor / "fxgraph" / "ab" / "entry").write_bytes(b"graph")
    run_env = ev_env(vault, **{k: v for k, v in env.items() if k in ("PYTHONUSERBASE", "HOME", "ENVVAULT_DPKG_ADMINDIR")},
                     TORCHINDUCTOR_CACHE_DIR=str(inductor))
    doc = json.loads(ev(vault, "snap", "--python", python, "--json", env=run_env).stdout)
    shown = json.loads(ev(vault, "show", doc["id"], "--json", env=run_env).stdout)
    assert not [c for c in shown.get("caches") or () if c.get("kind") == "inductor"], shown.get("caches")


def test_a_system_restore_stopped_part_way_names_the_interpreter_to_finish_with(pyenv_copy, tmp_path):
    """A restore of a system environment whose commit fails part way (a file made immutable: ``chattr +i``
    stops root too) names the command that finishes it with ``--python``: its root (``/`` here) is no
    environment for ``--venv`` (helper 35); that command finishes it."""
    assert os.geteuid() == 0, "chattr +i needs root, which CI has"
    python, env, _tmp = pyenv_copy
    vault = tmp_path / "vault"
    run_env = ev_env(vault, **{k: v for k, v in env.items() if k in ("PYTHONUSERBASE", "HOME", "ENVVAULT_DPKG_ADMINDIR")})
    sid = json.loads(ev(vault, "snap", "--python", python, "--json", env=run_env).stdout)["id"]
    pip_dir = python.parent.parent / "lib" / "python3.12" / "site-packages" / "pip"
    kept = {name: (pip_dir / name).read_bytes() for name in ("__init__.py", "__main__.py")}
    for name in kept:
        with open(pip_dir / name, "ab") as f:
            f.write(b"# edited\n")
    locked = pip_dir / "__main__.py"
    subprocess.run(["chattr", "+i", str(locked)], check=True)
    try:
        proc = ev(vault, "restore", sid, "--python", python, "--no-backup", check=False, env=run_env)
        assert_one_line_error(proc, "stopped part way", f"envvault restore {sid[:12]} --python {python}` to finish it")
        assert "--venv" not in proc.stderr
    finally:
        subprocess.run(["chattr", "-i", str(locked)], check=True)
    done = json.loads(ev(vault, "restore", sid[:12], "--python", python, "--no-backup", "--json", env=run_env).stdout)
    assert done["verified"] is True
    assert {name: (pip_dir / name).read_bytes() for name in kept} == kept


def test_status_after_a_killed_system_restore_names_the_interpreter_to_finish_with(pyenv_copy, tmp_path):
    """``status`` after a system environment's restore was killed names the restore that finishes it with
    ``--python``, as the restore's own error does (helper 35: it said ``--venv /``)."""
    python, env, _tmp = pyenv_copy
    vault = tmp_path / "vault"
    run_env = ev_env(vault, **{k: v for k, v in env.items() if k in ("PYTHONUSERBASE", "HOME", "ENVVAULT_DPKG_ADMINDIR")})
    sid = json.loads(ev(vault, "snap", "--python", python, "--json", env=run_env).stdout)["id"]
    target = python.parent.parent / "lib" / "python3.12" / "site-packages" / "pip" / "__main__.py"
    kept = target.read_bytes()
    target.write_bytes(kept + b"# edited\n")
    killed = ev(vault, "restore", sid, "--python", python, "--no-backup", check=False,
                env=dict(run_env, ENVVAULT_TEST_CRASH_AT="staged"))
    assert killed.returncode == -9, killed
    status = ev(vault, "status", "--python", python, env=run_env)
    assert f"`envvault restore {sid[:12]} --python {python}` to finish it" in status.stderr, status.stderr
    ev(vault, "restore", sid[:12], "--python", python, "--no-backup", env=run_env)
    assert target.read_bytes() == kept
