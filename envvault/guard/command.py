"""What a command line will do to an environment: which tool, which action, which environment.

Pure parsing of argv plus a few lookups on PATH and the file system; nothing here runs the command.
"""

from __future__ import annotations

import os
import shutil
from envvault.model.records import replace
from envvault.model.records import dataclass
from pathlib import Path
from envvault.model.paths import absolute_path
from typing import Mapping

__all__ = ["Command", "parse_command", "locate_target", "uv_project", "uv_project_root", "uv_workspace_members"]

# Tools: "pip" (pip, pip3, python -m pip), "uv-pip" (uv pip ...), "uv-project" (uv add/remove/sync), None.
# Actions that change an environment; everything else a tool does is passed through untouched.
_PIP_MUTATING = {"install", "uninstall"}
_UV_PIP_MUTATING = {"install", "uninstall", "sync"}
_UV_PROJECT_MUTATING = {"add", "remove", "sync"}

# pip's general options that take a value (pip --help, "General Options"), so the subcommand is found.
_PIP_GLOBAL_VALUE = {
    "--python", "--log", "--log-file", "--proxy", "--retries", "--timeout", "--exists-action",
    "--trusted-host", "--cert", "--client-cert", "--cache-dir", "--use-feature", "--use-deprecated",
    "--keyring-provider", "--local-log",
}
# uv's global options that take a value and may come before the subcommand.
_UV_GLOBAL_VALUE = {"--directory", "--project", "--cache-dir", "--config-file", "--color", "--python", "-p"}
# Options that send pip's or uv's changes somewhere other than the environment itself.
_ELSEWHERE = {"--target", "-t", "--prefix", "--root", "--user", "--system"}
_PYTHON_NAMES = ("python", "python3")
# ``sudo`` options without a value that may come before a guarded pip (``sudo -E pip install ...``); any other
# sudo option makes the command one envvault does not parse (run unguarded).
_SUDO_FLAGS = {"-E", "-H", "-n", "-S", "-k", "--preserve-env", "--set-home", "--non-interactive", "--stdin"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Command:
    """A parsed command line. ``mutating`` is True when it would install, remove or sync packages of an
    environment (and is not a dry run, nor aimed at ``--target``/``--user``/``--system``)."""

    argv: tuple[str, ...]
    tool: str | None  # "pip", "uv-pip", "uv-project" or None (anything else)
    action: str | None  # "install", "uninstall", "sync", "add", "remove", or another subcommand
    mutating: bool
    args: tuple[str, ...] = ()  # the subcommand's own arguments (after ``install`` etc.)
    python: str | None = None  # an explicit ``--python`` / ``-p`` value
    elsewhere: bool = False  # installs into --target/--prefix/--root/--user/--system, not the environment
    project: str | None = None  # ``uv --project`` / ``--directory`` for uv project commands
    sudo: tuple[str, ...] = ()  # ``sudo`` and its flags before the tool (``argv`` holds them too)

    @property
    def known(self) -> bool:
        """True for pip and uv commands envvault understands (mutating or not)."""
        return self.tool is not None

    @property
    def display(self) -> str:
        return " ".join(self.argv)


def _option_value(args: list[str], i: int) -> tuple[str | None, int]:
    """The value of the option at ``args[i]`` (``--opt value`` or ``--opt=value``) and the next index."""
    arg = args[i]
    if arg.startswith("--") and "=" in arg:
        return arg.split("=", 1)[1], i + 1
    if i + 1 < len(args):
        return args[i + 1], i + 2
    return None, i + 1


def _split_subcommand(args: list[str], value_opts: set[str]) -> tuple[str | None, list[str], dict[str, str]]:
    """Skip leading options; return (subcommand, its arguments, the leading options that took values)."""
    opts: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            return arg, args[i + 1 :], opts
        name = arg.split("=", 1)[0]
        if name in value_opts:
            value, i = _option_value(args, i)
            if value is not None:
                opts[name] = value
            continue
        i += 1
    return (args[i], args[i + 1 :], opts) if i < len(args) else (None, [], opts)


def _has_option(args: list[str], names: set[str]) -> bool:
    for arg in args:
        if arg == "--":
            return False
        if arg.split("=", 1)[0] in names:
            return True
    return False


def _find_option(args: list[str], names: set[str]) -> str | None:
    found = None
    i = 0
    while i < len(args):
        if args[i] == "--":
            break
        if args[i].split("=", 1)[0] in names:
            found, i = _option_value(args, i)
            continue
        i += 1
    return found


def _is_python(word: str) -> bool:
    base = os.path.basename(word)
    if base in _PYTHON_NAMES:
        return True
    return base.startswith("python3.") and base[len("python3.") :].isdigit()


def _is_pip(word: str) -> bool:
    base = os.path.basename(word)
    return base in ("pip", "pip3") or (base.startswith("pip3.") and base[len("pip3.") :].isdigit())


def parse_command(argv: list[str] | tuple[str, ...]) -> Command:
    """Recognise ``pip``, ``pip3``, ``python -m pip``, ``uv pip``, ``uv add``, ``uv remove`` and ``uv sync``,
    also after ``sudo`` (with flags of ``_SUDO_FLAGS`` only): ``sudo`` stays in ``argv`` (what runs), the rest
    is parsed as the tool's."""
    argv = tuple(argv)
    if not argv:
        return Command(argv=argv, tool=None, action=None, mutating=False)
    if os.path.basename(argv[0]) == "sudo":
        n = 1
        while n < len(argv) and argv[n] in _SUDO_FLAGS:
            n += 1
        inner = parse_command(argv[n:]) if n < len(argv) and os.path.basename(argv[n]) != "sudo" else None
        if inner is None or inner.tool != "pip":  # sudo uv, sudo apt-get, sudo -u other: not envvault's to parse
            return Command(argv=argv, tool=None, action=None, mutating=False)
        return replace(inner, argv=argv, sudo=argv[:n])
    head = argv[0]
    rest: list[str]
    if _is_pip(head):
        rest = list(argv[1:])
    elif _is_python(head) and len(argv) >= 3 and argv[1] == "-m" and argv[2] == "pip":
        rest = list(argv[3:])
    elif _is_python(head) and len(argv) >= 2 and argv[1] == "-mpip":
        rest = list(argv[2:])
    elif os.path.basename(head) == "uv":
        return _parse_uv(argv)
    else:
        return Command(argv=argv, tool=None, action=None, mutating=False)
    action, args, opts = _split_subcommand(rest, _PIP_GLOBAL_VALUE)
    python = opts.get("--python")
    elsewhere = _has_option(args, _ELSEWHERE)
    dry = _has_option(args, {"--dry-run"})
    mutating = action in _PIP_MUTATING and not dry and not elsewhere
    return Command(argv=argv, tool="pip", action=action, mutating=mutating, args=tuple(args), python=python,
                   elsewhere=elsewhere)


def _parse_uv(argv: tuple[str, ...]) -> Command:
    top, args, opts = _split_subcommand(list(argv[1:]), _UV_GLOBAL_VALUE)
    project = opts.get("--project") or opts.get("--directory")
    if top == "pip":
        action, sub_args, sub_opts = _split_subcommand(args, _UV_GLOBAL_VALUE)
        python = _find_option(sub_args, {"--python", "-p"}) or sub_opts.get("--python") or sub_opts.get("-p") \
            or opts.get("--python") or opts.get("-p")
        elsewhere = _has_option(sub_args, _ELSEWHERE)
        dry = _has_option(sub_args, {"--dry-run"})
        mutating = action in _UV_PIP_MUTATING and not dry and not elsewhere
        return Command(argv=argv, tool="uv-pip", action=action, mutating=mutating, args=tuple(sub_args),
                       python=python, elsewhere=elsewhere)
    if top in _UV_PROJECT_MUTATING:
        dry = _has_option(args, {"--dry-run"})
        # --frozen/--no-sync on add/remove only edit pyproject.toml and uv.lock, never the environment.
        no_sync = top != "sync" and _has_option(args, {"--no-sync", "--frozen"})
        project = _find_option(args, {"--project", "--directory"}) or project
        python = _find_option(args, {"--python", "-p"}) or opts.get("--python") or opts.get("-p")
        return Command(argv=argv, tool="uv-project", action=top, mutating=not dry and not no_sync,
                       args=tuple(args), python=python, project=project)
    return Command(argv=argv, tool="uv-project" if top else None, action=top, mutating=False, args=tuple(args))


# -- which environment will change -------------------------------------------------------------


def _is_env(path: Path) -> bool:
    return (path / "pyvenv.cfg").is_file() or (path / "conda-meta").is_dir()


def _env_of_executable(exe: str, env: Mapping[str, str]) -> Path | None:
    """The environment an executable (``pip``, ``python``) belongs to, found through PATH like the shell."""
    found = exe if os.sep in exe else shutil.which(exe, path=env.get("PATH"))
    if not found:
        return None
    path = Path(os.path.abspath(found))
    # A venv's bin/python is a symlink to the base interpreter: the venv is the folder above bin/.
    prefix = path.parent.parent
    return prefix if _is_env(prefix) else None


def _env_of_python_option(value: str, cwd: Path) -> Path | None:
    path = absolute_path(cwd / value)
    if path.is_dir():
        return path if _is_env(path) else None
    if path.exists():
        prefix = path.parent.parent
        return prefix if _is_env(prefix) else None
    return None  # a version request such as "3.11": uv decides; the caller falls back


def uv_project(cmd: Command, cwd: Path) -> Path | None:
    """The folder of the project a ``uv add/remove/sync`` edits: the nearest ``pyproject.toml`` from
    ``--project``/``--directory`` or ``cwd`` upward (a workspace member's own)."""
    start = absolute_path(cwd / cmd.project) if cmd.project else cwd
    return next((d for d in (start, *start.parents) if (d / "pyproject.toml").is_file()), None)


def uv_project_root(cmd: Command, cwd: Path) -> Path | None:
    """The uv project (workspace root) a ``uv add/remove/sync`` works on: ``uv_project``, then its workspace
    root when it is a member."""
    project = uv_project(cmd, cwd)
    if project is None:
        return None
    for parent in project.parents:
        pp = parent / "pyproject.toml"
        try:
            if pp.is_file() and "[tool.uv.workspace]" in pp.read_text(encoding="utf-8", errors="replace"):
                return parent
        except OSError:
            continue
    return project


_MEMBERS_MAX = 1000  # workspace members whose pyproject.toml guard keeps, at most
_GLOB_DIRS_MAX = 20000  # folders one workspace's member globs may list, at most


def uv_workspace_members(root: Path) -> list[Path]:
    """The folders of the members of the uv workspace at ``root`` that have a ``pyproject.toml``: its
    ``[tool.uv.workspace]`` ``members`` globs less its ``exclude`` ones, as uv reads them. The file is the
    user's working folder's, so it is read bounded, and its globs are matched by ``_glob_dirs`` (never
    through a symlink, never outside the root, a bounded walk); at most ``_MEMBERS_MAX`` members. An
    unreadable or invalid file, or a glob that cannot be matched, gives none: guard goes on without them."""
    from envvault.errors import EnvvaultError
    from envvault.model.encoding import toml_loads
    from envvault.vault.fsutil import read_regular

    try:
        doc = toml_loads(read_regular(root / "pyproject.toml", 1 << 20, "pyproject.toml").decode("utf-8"))
        table = doc["tool"]["uv"]["workspace"]
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError, EnvvaultError):
        return []
    budget = [_GLOB_DIRS_MAX]

    def matched(key: str) -> list[Path]:
        got = table.get(key) if isinstance(table, dict) else None
        out: list[Path] = []
        for g in got if isinstance(got, list) else ():
            if isinstance(g, str):
                out += _glob_dirs(root, g, budget)
        return out

    excluded = set(matched("exclude"))
    found: list[Path] = []
    for p in matched("members"):
        if p != root and p not in excluded and p not in found and (p / "pyproject.toml").is_file():
            found.append(p)
            if len(found) >= _MEMBERS_MAX:
                break
    return found


def _glob_dirs(root: Path, pattern: str, budget: list[int]) -> list[Path]:
    """The folders under ``root`` that the glob ``pattern`` names (``*``, ``?``, ``[...]`` within a name,
    ``**`` for any depth), found with ``os.scandir`` without following a symlink; a pattern that is
    absolute or has ``..`` names none; listing stops once ``budget[0]`` folders were listed."""
    import fnmatch

    parts = [c for c in pattern.split("/") if c not in ("", ".")]
    if pattern.startswith("/") or ".." in parts:
        return []
    out: list[Path] = []
    todo = [(str(root), 0)]
    seen: set[tuple[str, int]] = set()
    while todo:
        folder, k = todo.pop()
        if (folder, k) in seen:
            continue
        seen.add((folder, k))
        if k == len(parts):
            out.append(Path(folder))
            continue
        if parts[k] == "**":
            todo.append((folder, k + 1))  # no folder at all
        if budget[0] <= 0:
            break
        budget[0] -= 1
        try:
            with os.scandir(folder) as it:
                subs = [e.name for e in it if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
        for name in sorted(subs, reverse=True):
            if parts[k] == "**":
                todo.append((os.path.join(folder, name), k))  # one more level of any depth
            elif fnmatch.fnmatchcase(name, parts[k]):
                todo.append((os.path.join(folder, name), k + 1))
    return out


def _uv_project_env(cmd: Command, env: Mapping[str, str], cwd: Path) -> Path | None:
    if _has_option(list(cmd.args), {"--active"}) and env.get("VIRTUAL_ENV"):
        return absolute_path(env["VIRTUAL_ENV"])
    project = uv_project_root(cmd, cwd)
    if project is None:
        return None
    custom = env.get("UV_PROJECT_ENVIRONMENT")
    return absolute_path(project / custom) if custom else project / ".venv"


def locate_target(cmd: Command, env: Mapping[str, str], cwd: Path) -> Path | None:
    """The environment ``cmd`` would change, as pip or uv would pick it; None when it cannot be told.

    pip: ``--python``, else the environment of the ``pip``/``python`` found on PATH. uv pip: ``--python``,
    else ``$VIRTUAL_ENV``, ``$CONDA_PREFIX``, or ``.venv`` in this or a parent folder. uv add/remove/sync:
    the project's ``.venv`` (or ``$UV_PROJECT_ENVIRONMENT``; ``--active`` takes ``$VIRTUAL_ENV``).
    """
    if cmd.tool == "pip":
        if cmd.python:
            return _env_of_python_option(cmd.python, cwd)
        if cmd.sudo:  # sudo's own PATH finds the tool (a system Python's): guard it with --python
            return None
        return _env_of_executable(cmd.argv[0], env)
    if cmd.tool == "uv-pip":
        if cmd.python:
            return _env_of_python_option(cmd.python, cwd)
        for key in ("VIRTUAL_ENV", "CONDA_PREFIX"):
            if env.get(key):
                return absolute_path(env[key])
        return next((d / ".venv" for d in (cwd, *cwd.parents) if _is_env(d / ".venv")), None)
    if cmd.tool == "uv-project":
        return _uv_project_env(cmd, env, cwd)
    return None
