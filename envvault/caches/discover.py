"""Where the compile caches of an environment live, computed the way torch and Triton compute them.

Nothing here imports torch: the rules are mirrored from the sources named below (torch 2.13, Triton 3.6),
with the process environment passed in as a mapping so a caller can ask "where would the caches be under
this environment" without changing its own.

- Inductor (``torch/_inductor/runtime/cache_dir_utils.py``, ``cache_dir`` / ``default_cache_dir``):
  ``abspath($TORCHINDUCTOR_CACHE_DIR)``, else ``tempfile.gettempdir()/torchinductor_<user>`` where the user
  name comes from ``getpass.getuser()`` (``uid_<n>`` when that fails) with ``\\/:*?"<>|`` replaced by ``_``.
  ``gettempdir`` honours ``TMPDIR``, ``TEMP``, ``TMP``, so those move the root too.
- Triton (``triton/knobs.py``, ``cache_knobs.dir``): ``$TRITON_CACHE_DIR`` as given, else
  ``$TRITON_HOME/.triton/cache``, ``TRITON_HOME`` defaulting to ``expanduser("~/")``. Once Inductor
  compiles, it points ``TRITON_CACHE_DIR`` at ``<inductor root>/triton/<device>`` for that process, so
  Inductor's own kernels live inside the Inductor root; this location holds the others.
- torch extensions (``torch/utils/cpp_extension.py``, ``_get_build_directory`` /
  ``get_default_build_root``): ``$TORCH_EXTENSIONS_DIR``, else
  ``realpath($XDG_CACHE_HOME or ~/.cache)/torch_extensions`` (torch >= 2.10 builds into a
  ``py<XY>_<accelerator>`` folder below it; the root covers every such folder).
- CUDA's JIT cache: ``$CUDA_CACHE_PATH``, else ``~/.nv/ComputeCache``.

Which environments can use which cache (:func:`usable_kinds`): an environment's snapshot archives a cache
only when a package that reads it is installed in the environment (``CACHE_USERS``).
"""

from __future__ import annotations

import os
import re
import sys
from envvault.model.records import dataclass
from pathlib import Path

TYPE_CHECKING = False  # typing is not imported at run time (envvault/runtime_types.py)
if TYPE_CHECKING:
    from typing import Literal, Mapping, Sequence

    CacheKind = Literal["inductor", "triton", "torch_extensions", "cuda", "user"]

from envvault.env.untrusted import without_cwd
from envvault.model.paths import absolute_path
from envvault.terminate import OWN_SESSION

from ..errors import EnvironmentProblem

__all__ = [
    "CacheLocation",
    "discover_caches",
    "user_dirs",
    "inductor_cache_dir",
    "triton_cache_dir",
    "torch_extensions_dir",
    "cuda_cache_dir",
    "CACHE_USERS",
    "usable_kinds",
]


# torch/_inductor/runtime/cache_dir_utils.py: default_cache_dir
_UNSAFE_IN_USER = re.compile(r'[\\/:*?"<>|]')


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheLocation:
    """One cache directory: what it is, where, whether it exists now, and which rule chose the path."""

    kind: CacheKind
    path: Path
    exists: bool
    reason: str = ""


def discover_caches(
    env: Mapping[str, str] = os.environ,
    extra: Sequence[Path] = (),
    *,
    use_torch_python: Path | None = None,
    named: Sequence[Path] = (),
) -> list[CacheLocation]:
    """Every compile cache location for a process started with ``env``, in a fixed order.

    Returns inductor, triton, torch_extensions, cuda, then one ``user`` entry per ``extra`` path (made
    absolute, ``~`` expanded). A path already listed is not listed twice; one location may lie inside
    another (a ``TRITON_CACHE_DIR`` under the Inductor root, as Inductor itself sets it). With ``use_torch_python``, that
    interpreter (a venv's python with torch) is asked for Inductor's root under the same ``env`` and its
    answer is used; raises ``EnvironmentProblem`` when it cannot answer.
    """
    if use_torch_python is not None:
        inductor = _ask_torch(use_torch_python, env)
        inductor_reason = f"reported by {use_torch_python}"
    else:
        inductor, inductor_reason = inductor_cache_dir(env)
    found = [
        ("inductor", inductor, inductor_reason),
        ("triton", *triton_cache_dir(env)),
        ("torch_extensions", *torch_extensions_dir(env)),
        ("cuda", *cuda_cache_dir(env)),
    ]
    found.extend(("user", path, reason) for path, reason in user_dirs(extra, named))
    locations: list[CacheLocation] = []
    seen: set[Path] = set()
    for kind, path, reason in found:
        if path in seen:
            continue
        seen.add(path)
        locations.append(CacheLocation(kind=kind, path=path, exists=path.is_dir(), reason=reason))
    return locations


def user_dirs(extra: Sequence[Path], named: Sequence[Path] = ()) -> list[tuple[Path, str]]:
    """The folders a caller adds to the discovered ones, absolute (``~`` expanded), each with why: those of
    ``named`` came with ``--cache-dir``, the others from the vault's or the venv's settings."""
    given = {absolute_path(p) for p in named}
    return [(path, "named with --cache-dir" if path in given else "configured")
            for path in map(absolute_path, extra)]


# The top-level packages that read each kind of cache: Inductor's cache and torch extensions are torch's;
# Triton's is read by Triton and by torch (Inductor compiles through it); the CUDA driver's JIT cache serves
# every package that hands PTX to the driver. ``user`` (``--cache-dir``, configured dirs) is always taken.
CACHE_USERS: dict[str, tuple[str, ...]] = {
    "inductor": ("torch",),
    "triton": ("torch", "triton"),
    "torch_extensions": ("torch",),
    "cuda": ("torch", "triton", "jax", "jaxlib", "cupy", "numba", "tensorflow"),
}


def usable_kinds(venv: Path) -> frozenset[str] | None:
    """The cache kinds ``venv`` can use: those with a reader (``CACHE_USERS``) installed as a package
    (``<name>/__init__.py``) in its own site-packages (a system environment's: its interpreter's site
    folders), plus ``user``. None when it cannot be told from the venv's files: no site-packages found, or
    ``include-system-site-packages = true`` (a reader may come from the base interpreter)."""
    from envvault.env.probe import read_pyvenv_cfg, system_of

    system = system_of(venv)
    if system is not None:  # ``--python``: its own site folders (the root may be ``/``, helper 31: a pyenv
        sites = [Path(p) for p in system[1].sites if Path(p).is_dir()]  # CPython without torch took Inductor's)
    elif read_pyvenv_cfg(venv).get("include-system-site-packages", "").lower() == "true":
        return None
    else:
        sites = [p for p in sorted(venv.glob("lib/python3*/site-packages")) if p.is_dir()]
    if not sites:
        return None
    names = {n for users in CACHE_USERS.values() for n in users}
    present = {n for n in names if any((site / n / "__init__.py").is_file() for site in sites)}
    return frozenset({"user"} | {kind for kind, users in CACHE_USERS.items() if present.intersection(users)})


def inductor_cache_dir(env: Mapping[str, str] = os.environ) -> tuple[Path, str]:
    """Inductor's cache root under ``env`` and the rule that chose it (torch's ``cache_dir()``, minus mkdir)."""
    value = env.get("TORCHINDUCTOR_CACHE_DIR")
    if value is not None:
        # torch takes even an empty value, which abspath turns into the current directory.
        return Path(os.path.abspath(value)), "TORCHINDUCTOR_CACHE_DIR"
    user = _UNSAFE_IN_USER.sub("_", _getuser(env))
    tmp, tmp_reason = _gettempdir(env)
    return Path(os.path.abspath(os.path.join(tmp, "torchinductor_" + user))), f"default, in the temp dir ({tmp_reason})"


def triton_cache_dir(env: Mapping[str, str] = os.environ) -> tuple[Path, str]:
    """Triton's own cache directory under ``env`` (``triton.knobs.cache.dir``) and the rule that chose it.

    An empty or blank ``TRITON_CACHE_DIR`` is treated as unset, as Triton <= 3.2 did (>= 3.3 refuses to
    compile with it, so no cache can be there).
    """
    value = env.get("TRITON_CACHE_DIR")
    if value is not None and value.strip():
        return Path(os.path.abspath(value)), "TRITON_CACHE_DIR"
    home = env.get("TRITON_HOME")
    if home is not None:
        return Path(os.path.abspath(os.path.join(home, ".triton", "cache"))), "TRITON_HOME"
    return Path(os.path.abspath(os.path.join(_home(env), ".triton", "cache"))), "default under the home directory"


def torch_extensions_dir(env: Mapping[str, str] = os.environ) -> tuple[Path, str]:
    """The root torch builds C++/CUDA extensions under (``torch.utils.cpp_extension``), and why."""
    value = env.get("TORCH_EXTENSIONS_DIR")
    if value is not None:
        return Path(os.path.abspath(value)), "TORCH_EXTENSIONS_DIR"
    if sys.platform == "darwin":
        base, reason = os.path.join(_home(env), "Library", "Caches"), "default (macOS)"
    elif "XDG_CACHE_HOME" in env:
        base, reason = env["XDG_CACHE_HOME"], "XDG_CACHE_HOME"
    else:
        base, reason = os.path.join(_home(env), ".cache"), "default under the home directory"
    return Path(os.path.realpath(os.path.join(base, "torch_extensions"))), reason


def cuda_cache_dir(env: Mapping[str, str] = os.environ) -> tuple[Path, str]:
    """The CUDA driver's JIT cache (``CUDA_CACHE_PATH``, else ``~/.nv/ComputeCache``), and why."""
    value = env.get("CUDA_CACHE_PATH")
    if value:
        return Path(os.path.abspath(value)), "CUDA_CACHE_PATH"
    return Path(os.path.abspath(os.path.join(_home(env), ".nv", "ComputeCache"))), "default under the home directory"


def _getuser(env: Mapping[str, str]) -> str:
    # getpass.getuser(), reading env instead of os.environ; torch falls back to uid_<n> when it fails.
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        if env.get(name):
            return env[name]
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError, OSError):
        getuid = getattr(os, "getuid", None)
        return f"uid_{getuid()}" if callable(getuid) else "unknown_user"


def _gettempdir(env: Mapping[str, str]) -> tuple[str, str]:
    # tempfile._candidate_tempdir_list + _get_default_tempdir, reading env instead of os.environ:
    # the first candidate where a file can be created wins. POSIX only (Windows adds other defaults).
    candidates = [(env[name], f"${name}") for name in ("TMPDIR", "TEMP", "TMP") if env.get(name)]
    candidates += [(p, p) for p in ("/tmp", "/var/tmp", "/usr/tmp")]
    try:
        candidates.append((os.getcwd(), "the current directory"))
    except OSError:
        pass  # a working folder deleted since: no candidate (helper 31: every snap there failed, naming no file)
    for directory, label in candidates:
        try:
            directory = os.path.abspath(directory)  # (a relative $TMPDIR asks for the working folder too)
        except OSError:
            continue
        # tempfile's own probe (an O_EXCL create), without importing tempfile: a snap of unchanged caches
        # must not pay for it.
        probe = os.path.join(directory, f".envvault-probe-{os.getpid()}-{os.urandom(4).hex()}")
        try:
            fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            continue
        os.close(fd)
        os.unlink(probe)
        return directory, label
    raise EnvironmentProblem("no usable temporary directory: set TMPDIR to a writable directory")


def _home(env: Mapping[str, str]) -> str:
    # os.path.expanduser("~"), reading HOME from env.
    home = env.get("HOME")
    if home is None:
        try:
            import pwd

            home = pwd.getpwuid(os.getuid()).pw_dir
        except (ImportError, KeyError, OSError):
            home = os.path.expanduser("~")
    return home.rstrip("/") or "/"


# Runs torch's own cache_dir() in the target interpreter. Importing torch (or torch._inductor) runs
# torch._dynamo.package, which creates the root, and takes seconds; so the parent packages are bare
# module objects over torch's real folders and only cache_dir_utils.py (which needs torch._environment
# alone) executes. makedirs is disabled because asking must not create the root.
_ASK = """
import importlib.util, os, sys, types
root = os.path.dirname(importlib.util.find_spec("torch").origin)
for name, rel in (("torch", ""), ("torch._inductor", "_inductor"), ("torch._inductor.runtime", "_inductor/runtime")):
    pkg = types.ModuleType(name)
    pkg.__path__ = [os.path.join(root, rel)]
    sys.modules[name] = pkg
from torch._inductor.runtime.cache_dir_utils import cache_dir
os.makedirs = lambda *args, **kwargs: None
print(cache_dir())
"""


def _ask_torch(python: Path, env: Mapping[str, str]) -> Path:
    import subprocess  # only here: a snap of unchanged caches must not pay for the import

    try:
        done = subprocess.run(
            [str(python), "-c", without_cwd(_ASK)], env=dict(env), capture_output=True, text=True, timeout=120,
            **OWN_SESSION,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvironmentProblem(f"could not run {python} to ask for Inductor's cache dir: {exc}") from exc
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise EnvironmentProblem(f"{python} could not report Inductor's cache dir: {last}")
    return Path(lines[-1])
