"""Find and describe a target environment's interpreter (any CPython 3.8+), whatever runs envvault."""

from __future__ import annotations

import os
from pathlib import Path
TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Any, NamedTuple
else:
    from envvault.runtime_types import NamedTuple

from envvault.model.encoding import json_loads, not_utf8
from envvault.errors import UsageError
from envvault.model.paths import absolute_path
from envvault.terminate import OWN_SESSION

__all__ = ["Interpreter", "use_system", "system_of", "target_options", "choose_python", "chosen_python", "find_target",
           "probe", "probe_system", "system_root"]

# The system environments this process was pointed at (--python, or --venv of an interpreter's prefix):
# root -> (interpreter, its probe). A system environment is named by its interpreter, not by a folder, so
# the command line registers it once and every reader of that root (snap, status, restore) finds it here.
_SYSTEMS: dict[str, tuple[Path, Any]] = {}


def use_system(root: Path, exe: Path, interp: Any = None) -> None:
    """Remember that the environment at ``root`` is the one ``exe`` sees (``system_root``)."""
    _SYSTEMS[str(root)] = (Path(exe), interp)


def system_of(root: Path | str) -> tuple[Path, Any] | None:
    """``(interpreter, its probe or None)`` registered for ``root`` in this process, or None."""
    return _SYSTEMS.get(str(root))


def system_interpreter(root: Path | str) -> str | None:
    """The real path of the system interpreter registered for ``root`` in this process (as snapshots record
    it), None for a venv."""
    hit = _SYSTEMS.get(str(root))
    return os.path.realpath(hit[0]) if hit is not None else None


def target_options(target: Path | str) -> tuple[str, str]:
    """The options a command line names the environment ``target`` with, for a message that tells the user
    what to run: ``--python EXE`` for a system environment's root (``/`` names no environment: helper 35),
    else ``--venv TARGET``."""
    hit = _SYSTEMS.get(str(target))
    return ("--python", str(hit[0])) if hit is not None else ("--venv", str(target))


# ``--python PATH`` of the running command (``choose_python``): ``find_target`` takes it before $VIRTUAL_ENV.
_CHOSEN: list[str] = []


def choose_python(path: str | os.PathLike | None) -> None:
    """Record the command line's ``--python`` (probed later, by ``find_target``)."""
    _CHOSEN[:] = [os.fspath(path)] if path is not None else []


def chosen_python() -> str | None:
    return _CHOSEN[0] if _CHOSEN else None


# Runs inside the target interpreter: keep it Python 3.8 compatible and import nothing heavy. The facts every
# probe asks (a venv's and a system interpreter's); each probe adds its own and prints them.
_FACTS = r"""
import json, os, sys, sysconfig, platform
paths = sysconfig.get_paths()
facts = {
  "implementation": sys.implementation.name,
  "version": "%d.%d.%d" % sys.version_info[:3],
  "cache_tag": sys.implementation.cache_tag,
  "soabi": sysconfig.get_config_var("SOABI"),
  "platform": sysconfig.get_platform(),
  "machine": platform.machine(),
  "prefix": sys.prefix,
  "base_prefix": getattr(sys, "base_prefix", sys.prefix),
  "executable": sys.executable,
  "build": sys.version,
  "purelib": paths["purelib"], "platlib": paths["platlib"], "scripts": paths["scripts"],
  "data": paths["data"], "include": paths.get("include"),
}
"""
# Runs inside a venv's interpreter with -I -S: site is not imported, so no .pth file in the environment runs
# (a restored environment holds what a vault wrote). -S also skips site's venv step, so the venv's prefix and
# paths are computed here as site.venv() and sysconfig would give them: the folder above the executable's
# when pyvenv.cfg lies in either; the "venv" install scheme where the interpreter has one (3.11+), else its
# default scheme, expanded with that prefix.
_VENV = r"""
exe_dir = os.path.dirname(os.path.abspath(sys.executable))
site_prefix = os.path.dirname(exe_dir)
if any(os.path.isfile(os.path.join(d, "pyvenv.cfg")) for d in (exe_dir, site_prefix)):
  names = sysconfig.get_scheme_names()
  scheme = "venv" if "venv" in names else (
    sysconfig.get_default_scheme() if hasattr(sysconfig, "get_default_scheme") else sysconfig._get_default_scheme())
  at = {"base": site_prefix, "platbase": site_prefix, "installed_base": site_prefix,
        "installed_platbase": site_prefix}
  vpaths = sysconfig.get_paths(scheme, vars=at)
  facts.update({"prefix": site_prefix, "purelib": vpaths["purelib"], "platlib": vpaths["platlib"],
                "scripts": vpaths["scripts"], "data": vpaths["data"], "include": vpaths.get("include")})
"""
_PROBE = _FACTS + _VENV + "print(json.dumps(facts))\n"


class Interpreter(NamedTuple):
    """What a snapshot records about the target's Python; paths are absolute. A typed, immutable record (a
    ``NamedTuple``, not a dataclass: the quick ``status`` builds one from the stat cache's memo, and
    ``dataclasses`` with what it imports is 5-7 ms of a 0.13 s command; ``_replace`` gives a changed copy)."""

    prefix: Path
    executable: Path
    implementation: str
    version: str
    abi: str
    soabi: str | None
    platform: str
    base_prefix: str
    purelib: Path
    platlib: Path
    scripts: Path
    pyvenv_cfg: dict
    # A system environment's (docs/format.md, "Environment kinds"); a venv keeps the defaults.
    environment: str = "venv"
    sys_prefix: Path | None = None
    sites: tuple[Path, ...] = ()  # the site directories that exist, in the interpreter's order
    user_site: Path | None = None  # when the user site is enabled, existing or not
    build: str | None = None  # sys.version
    interpreter: str | None = None  # the executable's real path

    @property
    def minor(self) -> str:
        return ".".join(self.version.split(".")[:2])

    def to_cache(self) -> dict:
        d = {k: str(v) if isinstance(v, Path) else v for k, v in self._asdict().items()}
        d["sites"] = [str(p) for p in self.sites]
        d.pop("prefix")
        return d

    @classmethod
    def from_cache(cls, prefix: Path, d: dict) -> "Interpreter":
        paths = ("executable", "purelib", "platlib", "scripts", "sys_prefix", "user_site")
        kw = {k: Path(v) if k in paths and v is not None else v for k, v in d.items()}
        kw["sites"] = tuple(Path(p) for p in kw.get("sites", ()))
        return cls(prefix=prefix, **kw)

    def to_dict(self) -> dict:
        rel = lambda p: _rel(p, self.prefix)  # noqa: E731
        d = {
            "implementation": self.implementation,
            "version": self.version,
            "abi": self.abi,
            "soabi": self.soabi,
            "platform": self.platform,
            "base_prefix": self.base_prefix,
            "executable": rel(self.executable),
            "purelib": rel(self.purelib),
            "platlib": rel(self.platlib),
            "scripts": rel(self.scripts),
            "pyvenv_cfg": self.pyvenv_cfg,
        }
        if self.environment != "venv":  # venv snapshots keep exactly their old keys
            d.update({
                "environment": self.environment,
                "prefix": rel(self.sys_prefix or self.prefix),
                "sites": [rel(p) for p in self.sites],
                "user_site": rel(self.user_site) if self.user_site else None,
                "build": self.build,
                "interpreter": self.interpreter,
            })
        return d


def _rel(path: Path, prefix: Path) -> str:
    try:
        return Path(path).relative_to(prefix).as_posix()
    except ValueError:
        return str(path)


def find_target(venv: str | os.PathLike | None, python: str | os.PathLike | None = None) -> Path:
    """The environment to act on: ``--python`` (a system environment: its root, see ``system_root``), else
    ``--venv``, else ``$VIRTUAL_ENV`` (then ``$CONDA_PREFIX``), else a clear error. A folder with
    ``pyvenv.cfg`` and ``bin/python`` is a venv; an interpreter's own prefix (its standard library under
    ``lib/python3*``, no ``pyvenv.cfg``) is taken as ``--python PREFIX/bin/python3``."""
    if python is None:
        python = chosen_python()
    if python is not None:
        if venv is not None:
            raise UsageError("pass either --venv or --python, not both")
        return system_root(python)
    if venv is None:
        venv = os.environ.get("VIRTUAL_ENV") or os.environ.get("CONDA_PREFIX")
        if not venv:
            raise UsageError("no environment given: pass --venv PATH, --python PATH or activate a virtual environment")
    path = absolute_path(venv)
    if not_utf8(path):
        raise UsageError(f"{os.fsencode(path)!r} is not a UTF-8 path, which a snapshot cannot record; move the "
                         "environment to a path of UTF-8 letters")
    if not os.path.isdir(path):  # (any OSError, a name too long included: not a directory)
        raise UsageError(f"{path} is not a directory; pass --venv with the path of a virtual environment")
    if system_of(path) is not None:  # a root found by --python earlier in this process
        return path
    python_exe = python_of(path)
    if python_exe is None:
        if (path / "pyvenv.cfg").is_file():  # a venv whose interpreter is gone or a link that leads nowhere
            raise UsageError(f"{path} is a venv whose bin/python does not run (missing, or a link to nothing or to "
                             "itself); recreate it (python -m venv --upgrade, or uv venv) and run again")
        raise UsageError(f"{path} is not a Python environment (no bin/python and no pyvenv.cfg)")
    if not (path / "pyvenv.cfg").is_file():
        if any(path.glob("lib/python3*/os.py")) and not (path / "conda-meta").is_dir():
            return system_root(python_exe, expect_prefix=path)
        raise UsageError(_not_a_venv(path, python_exe))
    return path


def system_root(python: str | os.PathLike, expect_prefix: Path | None = None) -> Path:
    """Probe the interpreter ``python`` (isolated, ``probe_system``), remember it for this process
    (``use_system``) and return its environment's root."""
    exe = absolute_path(python)
    if not exe.is_file() or not os.access(exe, os.X_OK):
        raise UsageError(f"--python {exe}: not an executable file")
    interp = probe_system(exe)
    if expect_prefix is not None and Path(interp.sys_prefix).resolve() != expect_prefix.resolve():
        raise UsageError(f"{expect_prefix} is not a virtual environment (no pyvenv.cfg), and its {exe.name} runs "
                         f"with prefix {interp.sys_prefix}; pass --python with the interpreter you mean")
    use_system(interp.prefix, exe, interp)
    return interp.prefix


def _not_a_venv(path: Path, python: Path) -> str:
    """Why a folder with a bin/python but no pyvenv.cfg is refused, and what to do instead.

    Without pyvenv.cfg the interpreter does not take the folder as its prefix: either the folder is a conda
    environment (an interpreter's own installation with conda's metadata, which envvault does not snapshot
    yet; /usr or a pyenv version is a system environment, ``system_root``), or its bin/python belongs to
    another installation and would report that one's packages.
    """
    conda = " (a conda environment)" if (path / "conda-meta").is_dir() else ""
    if any(path.glob("lib/python3*/os.py")):
        return (f"{path} is not a virtual environment (no pyvenv.cfg) but an interpreter's own prefix{conda}; "
                f"conda environments are not supported yet: create a venv with "
                f"`{python} -m venv DIR` and pass --venv DIR")
    return (f"{path} is not a virtual environment: it has no pyvenv.cfg{conda}, so its bin/python "
            f"({python.resolve()}) runs another installation, not this folder; pass a venv (python -m venv, "
            f"virtualenv, uv venv) or put back its pyvenv.cfg")


VENV_PYTHONS = ("python3", "python")  # the names an environment's interpreter is run by, the first that runs it


def python_of(prefix: Path) -> Path | None:
    """The interpreter that ``probe`` runs for the environment at ``prefix``: its ``bin/python3``, else its
    ``bin/python`` (one that exists, a link followed); None when it has neither."""
    for name in VENV_PYTHONS:
        cand = prefix / "bin" / name
        if cand.exists():
            return cand
    return None


def read_pyvenv_cfg(prefix: Path) -> dict:
    """``pyvenv.cfg`` as ``{key: value}`` (both stripped; the last of a repeated key wins, as in ``site``);
    empty when it cannot be read. The one reader of that file (snapshots, cache fingerprints, usable caches)."""
    from envvault.errors import CorruptError
    from envvault.vault.fsutil import read_regular

    out: dict[str, str] = {}
    try:  # a FIFO or a device named pyvenv.cfg is never waited on; a file of a megabyte is not a venv's
        text = read_regular(prefix / "pyvenv.cfg", 1 << 20, "pyvenv.cfg", follow=True).decode("utf-8", "replace")
    except (OSError, CorruptError):
        return out
    for line in text.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def probe(prefix: Path) -> Interpreter:
    """Ask the environment's own interpreter; clear error when it does not run."""
    import subprocess

    exe = python_of(prefix)
    if exe is None:
        raise UsageError(f"{prefix} is not a Python environment (no bin/python)")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    try:
        out = subprocess.run(
            [str(exe), "-I", "-S", "-c", _PROBE], capture_output=True, text=True, timeout=60, env=env, **OWN_SESSION
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise UsageError(f"cannot run {exe}: {err}; is the environment's base interpreter still installed?") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"{exe} does not run ({last}); is the environment's base interpreter still installed?")
    try:
        return _venv_interpreter(prefix, exe, json_loads(out.stdout))
    except UsageError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, OSError):
        raise UsageError(f"{exe} does not answer like a CPython 3 interpreter (does its sitecustomize or a .pth "
                         "file print?)") from None


def _venv_interpreter(prefix: Path, exe: Path, info: dict) -> Interpreter:
    """The venv's ``Interpreter`` from the probe's answer (any error in it: the caller's one line)."""
    if Path(info["prefix"]).resolve() != prefix.resolve():
        raise UsageError(f"{exe} runs with prefix {info['prefix']}, not {prefix}: not a working virtual "
                         "environment (check its pyvenv.cfg, or recreate it)")
    impl = info["implementation"]
    major, minor = info["version"].split(".")[:2]
    abi = f"cp{major}{minor}" if impl == "cpython" else info["cache_tag"]
    return Interpreter(
        prefix=prefix,
        executable=Path(info["executable"]),
        implementation=impl,
        version=info["version"],
        abi=abi,
        soabi=info["soabi"],
        platform=info["platform"],
        base_prefix=info["base_prefix"],
        purelib=Path(info["purelib"]),
        platlib=Path(info["platlib"]),
        scripts=Path(info["scripts"]),
        pyvenv_cfg=read_pyvenv_cfg(prefix),
    )


# Runs inside a system interpreter with -I -S: no site import (so no .pth file runs), no user or current
# folder on sys.path. site's functions are still there to ask (-S: importing site does not run main()).
_SYSTEM_PROBE = _FACTS + r"""
import site
user_on = not os.environ.get("PYTHONNOUSERSITE") and (
    not hasattr(os, "getuid") or (os.getuid() == os.geteuid() and os.getgid() == os.getegid()))
facts.update({
  "sites": list(site.getsitepackages()) if hasattr(site, "getsitepackages") else [],
  "user_site": site.getusersitepackages() if user_on else None,
  "user_base": site.getuserbase() if user_on else None,
})
print(json.dumps(facts))
"""


def probe_system(exe: Path) -> Interpreter:
    """Ask the interpreter ``exe`` about the installation it runs (docs/format.md, "Environment kinds"),
    isolated: ``-I -S``, relative ``sys.path`` entries dropped (``untrusted.without_cwd``), run from ``/`` with
    the ``PYTHON*`` variables that change what it imports removed. A venv's interpreter is refused (pass its
    folder with --venv)."""
    import subprocess

    from envvault.env.untrusted import without_cwd

    for cfg in (exe.parent / "pyvenv.cfg", exe.parent.parent / "pyvenv.cfg"):  # where site.venv() looks
        if cfg.is_file():
            raise UsageError(f"{exe} belongs to the virtual environment {cfg.parent}: pass --venv {cfg.parent}")
    keep = ("PYTHONUSERBASE", "PYTHONNOUSERSITE")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") or k in keep}
    try:
        out = subprocess.run([str(exe), "-I", "-S", "-c", without_cwd(_SYSTEM_PROBE)], capture_output=True,
                             text=True, timeout=60, env=env, cwd="/", **OWN_SESSION)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise UsageError(f"cannot run {exe}: {err}") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"{exe} does not run as a Python 3 interpreter ({last[:200]})")
    try:
        return _system_interpreter(exe, json_loads(out.stdout))
    except UsageError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, OSError):
        raise UsageError(f"{exe} does not answer like a CPython 3 interpreter") from None


def _system_interpreter(exe: Path, info: dict) -> Interpreter:
    """The system installation's ``Interpreter`` from the probe's answer (any error: the caller's line)."""
    prefix = Path(info["prefix"])
    if Path(info["base_prefix"]) != prefix:
        raise UsageError(f"{exe} belongs to the virtual environment {prefix}: pass --venv {prefix}")
    user_site = Path(info["user_site"]) if info.get("user_site") else None
    sites: list[Path] = []
    for p in ([str(user_site)] if user_site else []) + info["sites"] + [info["purelib"], info["platlib"]]:
        path = Path(os.path.normpath(p))
        if path not in sites:  # candidates: the reader keeps those that exist when it reads
            sites.append(path)
    scripts = Path(info["scripts"])
    anchors = [prefix, scripts, Path(info["purelib"]), Path(info["platlib"]), *map(Path, info["sites"])]
    if user_site:
        anchors += [user_site, Path(info["user_base"] or user_site)]
    root = Path(os.path.commonpath([os.path.normpath(str(p)) for p in anchors]))
    impl = info["implementation"]
    major, minor = info["version"].split(".")[:2]
    return Interpreter(
        prefix=root,
        executable=exe,
        implementation=impl,
        version=info["version"],
        abi=f"cp{major}{minor}" if impl == "cpython" else info["cache_tag"],
        soabi=info["soabi"],
        platform=info["platform"],
        base_prefix=info["base_prefix"],
        purelib=Path(info["purelib"]),
        platlib=Path(info["platlib"]),
        scripts=scripts,
        pyvenv_cfg={},
        environment="system",
        sys_prefix=prefix,
        sites=tuple(sites),
        user_site=user_site,
        build=info["build"],
        interpreter=os.path.realpath(exe),
    )
