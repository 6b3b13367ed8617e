"""Zero-code stamping: a ``.pth`` hook that enables stamping in a venv when ``ENVVAULT_STAMP=1``.

``install_hook(venv)`` writes ``<site-packages>/envvault_stamp.pth``, one line that Python's ``site``
runs at every start of that venv's interpreter. It reads ``ENVVAULT_STAMP`` before importing anything, so
with the variable unset it costs one dictionary lookup; with ``ENVVAULT_STAMP=1`` it imports
:mod:`envvault.torch._autostamp`, which waits for torch to be imported and then calls ``enable()``.

The training venv need not have envvault installed. When its interpreter cannot import envvault and its
run-time dependencies, and it has the same Python ABI as the interpreter running ``install-hook``, the hook
gets ``<site-packages>/envvault_stamp.libs/``: symlinks to exactly those packages (:data:`RUNTIME_MODULES`)
where this envvault imports them from. The ``.pth`` line appends that folder to ``sys.path`` only when
stamping is on, after the venv's own packages, so the venv's versions win and nothing else becomes
importable. With another ABI, install envvault into the venv instead (``install_hook`` says so). Moving or
upgrading the envvault installation the links point to turns stamping off with a one-line message at start:
run ``install-hook`` again.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from envvault.model.records import dataclass
from pathlib import Path

from envvault.errors import EnvironmentProblem, RefusedError
from envvault.env.untrusted import without_cwd

__all__ = ["PTH_NAME", "LIBS_NAME", "RUNTIME_MODULES", "HookResult", "install_hook", "uninstall_hook",
           "runtime_path", "pth_line", "link_runtime"]

PTH_NAME = "envvault_stamp.pth"
LIBS_NAME = "envvault_stamp.libs"  # not an identifier: never importable as a module itself
# What a stamping process imports: envvault, and what the snapshot code (and `python -m envvault snap`,
# started in the background) needs.
RUNTIME_MODULES = ("envvault", "blake3", "zstandard", "pyfastcdc", "packaging", "click", "tomli_w") + (
    ("tomli",) if sys.version_info < (3, 11) else ())


@dataclass(frozen=True)
class HookResult:
    venv: Path
    pth: Path
    libs: Path | None  # None: the venv imports its own envvault
    removed: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"venv": str(self.venv), "pth": str(self.pth), "libs": str(self.libs) if self.libs else None,
                "removed": list(self.removed)}


def runtime_path() -> list[str]:
    """The directories this interpreter imports :data:`RUNTIME_MODULES` from (for a child process that
    must import envvault the same way)."""
    out: list[str] = []
    for name in RUNTIME_MODULES:
        root = _module_root(name)
        if root is not None and str(root) not in out:
            out.append(str(root))
    return out


def _module_path(name: str) -> Path | None:
    """The package directory or module file ``import name`` would load, without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return Path(spec.origin) if spec.origin and os.path.isabs(spec.origin) else None


def _module_root(name: str) -> Path | None:
    path = _module_path(name)
    return path.parent if path is not None else None


def pth_line(libs: Path | None) -> str:
    """The hook's one line. ``site`` executes lines that start with ``import``; this one checks
    ``ENVVAULT_STAMP`` first and, when stamping cannot start, says so in one line instead of a traceback."""
    code = "try:\n import sys\n"
    if libs is not None:
        code += f" sys.path.append({str(libs)!r})\n"
    code += (" import envvault.torch._autostamp\n"
             "except Exception as e:\n"
             " sys.stderr.write('envvault: checkpoint stamping is off: %s: %s\\n' % (type(e).__name__, e))\n")
    return f'import os; os.environ.get("ENVVAULT_STAMP") == "1" and exec({code!r})\n'


def _clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "ENVVAULT_STAMP", "VIRTUAL_ENV")}
    env.update(extra)
    return env


def _missing_in(python: Path, extra: dict | None = None) -> list[str]:
    """Which of :data:`RUNTIME_MODULES` ``python`` cannot find (with ``extra`` environment variables);
    ``envvault.torch._autostamp`` is listed too when ``ENVVAULT_STAMP=1`` is set and the hook did not run."""
    script = without_cwd(
              "import importlib.util as u, json, os\n"
              f"names = {list(RUNTIME_MODULES)!r}\n"
              "missing = [n for n in names if u.find_spec(n) is None]\n"
              "if os.environ.get('ENVVAULT_STAMP') == '1' and 'envvault.torch._autostamp' not in sys.modules:\n"
              "    missing.append('envvault.torch._autostamp')\n"
              "print(json.dumps(missing))\n")  # fmt: skip
    proc = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=120,
                          env=_clean_env(**(extra or {})))
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise EnvironmentProblem(f"{python} does not run ({last})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def install_hook(venv: Path) -> HookResult:
    """Install (or refresh) the hook in ``venv``. Raises :class:`RefusedError` when the venv can import
    envvault neither itself nor through links (another Python ABI), and :class:`EnvironmentProblem` when
    the finished hook does not start stamping."""
    from envvault.env.probe import probe
    from envvault.vault.fsutil import atomic_write

    interp = probe(venv)
    python = venv / "bin" / "python"
    site = interp.purelib
    pth, libs = site / PTH_NAME, site / LIBS_NAME
    _remove(pth, libs)  # an old hook must not answer the question below
    missing = _missing_in(python)
    if not missing:
        libs_used = None
    else:
        ours = (sys.implementation.name, sysconfig.get_config_var("SOABI"))
        if (interp.implementation, interp.soabi) != ours:
            raise RefusedError(
                f"{venv} cannot import envvault ({', '.join(missing)} missing) and its Python {interp.version} "
                f"({interp.soabi}) cannot load this envvault's compiled dependencies ({ours[1]}); install envvault "
                f"into it: {python} -m pip install envvault")
        link_runtime(libs)
        libs_used = libs
    atomic_write(pth, pth_line(libs_used).encode(), mode=0o644)
    check = _missing_in(python, {"ENVVAULT_STAMP": "1"})
    if check:
        _remove(pth, libs)
        raise EnvironmentProblem(f"the stamping hook in {venv} cannot import {', '.join(check)}; hook removed")
    return HookResult(venv, pth, libs_used)


def link_runtime(libs: Path) -> Path:
    """Make ``libs`` a directory of symlinks to envvault and :data:`RUNTIME_MODULES` as this interpreter
    imports them (replacing what was there): on ``sys.path`` of an interpreter with the same ABI, it makes
    envvault importable and nothing else."""
    tmp = libs.with_name(f".{libs.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for name in RUNTIME_MODULES:
            path = _module_path(name)
            if path is None:
                raise EnvironmentProblem(f"this envvault cannot import {name} itself; reinstall envvault")
            (tmp / path.name).symlink_to(path.resolve())
        if libs.is_dir() and not libs.is_symlink():
            shutil.rmtree(libs)
        os.replace(tmp, libs)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return libs


def _remove(pth: Path, libs: Path) -> list[str]:
    removed = []
    if pth.exists():
        pth.unlink()
        removed.append(str(pth))
    if libs.is_dir() and not libs.is_symlink():
        shutil.rmtree(libs)
        removed.append(str(libs))
    return removed


def uninstall_hook(venv: Path) -> HookResult:
    """Remove the hook from ``venv`` (nothing to do is not an error); ``removed`` lists what went."""
    from envvault.env.probe import probe

    site = probe(venv).purelib
    pth, libs = site / PTH_NAME, site / LIBS_NAME
    return HookResult(venv, pth, None, tuple(_remove(pth, libs)))
