"""Find and describe a target environment's interpreter (any CPython 3.8+), whatever runs envvault."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from envvault.errors import UsageError

__all__ = ["Interpreter", "find_target", "probe"]

# Runs inside the target interpreter: keep it Python 3.8 compatible and import nothing heavy.
_PROBE = r"""
import json, sys, sysconfig, platform
paths = sysconfig.get_paths()
print(json.dumps({
  "implementation": sys.implementation.name,
  "version": "%d.%d.%d" % sys.version_info[:3],
  "cache_tag": sys.implementation.cache_tag,
  "soabi": sysconfig.get_config_var("SOABI"),
  "platform": sysconfig.get_platform(),
  "machine": platform.machine(),
  "prefix": sys.prefix,
  "base_prefix": getattr(sys, "base_prefix", sys.prefix),
  "executable": sys.executable,
  "purelib": paths["purelib"], "platlib": paths["platlib"], "scripts": paths["scripts"],
  "data": paths["data"], "include": paths.get("include"),
}))
"""


@dataclass(frozen=True)
class Interpreter:
    """What a snapshot records about the target's Python; paths are absolute."""

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

    @property
    def minor(self) -> str:
        return ".".join(self.version.split(".")[:2])

    def to_cache(self) -> dict:
        d = {k: str(v) if isinstance(v, Path) else v for k, v in self.__dict__.items()}
        d.pop("prefix")
        return d

    @classmethod
    def from_cache(cls, prefix: Path, d: dict) -> "Interpreter":
        paths = ("executable", "purelib", "platlib", "scripts")
        return cls(prefix=prefix, **{k: Path(v) if k in paths else v for k, v in d.items()})

    def to_dict(self) -> dict:
        rel = lambda p: _rel(p, self.prefix)  # noqa: E731
        return {
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


def _rel(path: Path, prefix: Path) -> str:
    try:
        return Path(path).relative_to(prefix).as_posix()
    except ValueError:
        return str(path)


def find_target(venv: str | os.PathLike | None) -> Path:
    """The environment to act on: ``--venv``, else ``$VIRTUAL_ENV`` (then ``$CONDA_PREFIX``), else a clear
    error. Only a virtual environment (a folder with ``pyvenv.cfg`` and ``bin/python``) is taken."""
    if venv is None:
        venv = os.environ.get("VIRTUAL_ENV") or os.environ.get("CONDA_PREFIX")
        if not venv:
            raise UsageError("no environment given: pass --venv PATH or activate a virtual environment")
    path = Path(venv).expanduser().absolute()
    if not path.is_dir():
        raise UsageError(f"{path} is not a directory; pass --venv with the path of a virtual environment")
    python = _python_of(path)
    if python is None:
        raise UsageError(f"{path} is not a Python environment (no bin/python and no pyvenv.cfg)")
    if not (path / "pyvenv.cfg").is_file():
        raise UsageError(_not_a_venv(path, python))
    return path


def _not_a_venv(path: Path, python: Path) -> str:
    """Why a folder with a bin/python but no pyvenv.cfg is refused, and what to do instead.

    Without pyvenv.cfg the interpreter does not take the folder as its prefix: either the folder is an
    interpreter's own installation (it holds the standard library: /usr, a pyenv version, a conda
    environment), which envvault does not snapshot yet, or its bin/python belongs to another
    installation and would report that one's packages.
    """
    conda = " (a conda environment)" if (path / "conda-meta").is_dir() else ""
    if any(path.glob("lib/python3*/os.py")):
        return (f"{path} is not a virtual environment (no pyvenv.cfg) but an interpreter's own prefix{conda}; "
                f"snapshots of an interpreter's own prefix are not supported yet: create a venv with "
                f"`{python} -m venv DIR` and pass --venv DIR")
    return (f"{path} is not a virtual environment: it has no pyvenv.cfg{conda}, so its bin/python "
            f"({python.resolve()}) runs another installation, not this folder; pass a venv (python -m venv, "
            f"virtualenv, uv venv) or put back its pyvenv.cfg")


def _python_of(prefix: Path) -> Path | None:
    for name in ("python3", "python"):
        cand = prefix / "bin" / name
        if cand.exists():
            return cand
    return None


def read_pyvenv_cfg(prefix: Path) -> dict:
    """``pyvenv.cfg`` as ``{key: value}`` (both stripped; the last of a repeated key wins, as in ``site``);
    empty when it cannot be read. The one reader of that file (snapshots, cache fingerprints, usable caches)."""
    out: dict[str, str] = {}
    try:
        text = (prefix / "pyvenv.cfg").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def probe(prefix: Path) -> Interpreter:
    """Ask the environment's own interpreter; clear error when it does not run."""
    import subprocess

    exe = _python_of(prefix)
    if exe is None:
        raise UsageError(f"{prefix} is not a Python environment (no bin/python)")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    try:
        out = subprocess.run(
            [str(exe), "-I", "-c", _PROBE], capture_output=True, text=True, timeout=60, env=env
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise UsageError(f"cannot run {exe}: {err}; is the environment's base interpreter still installed?") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"{exe} does not run ({last}); is the environment's base interpreter still installed?")
    info = json.loads(out.stdout)
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
