"""Ask pip or uv what a command would change, before it runs, and say it in envvault's words.

``start_dry_run`` launches the tool's own dry run (``pip install --dry-run --report``, ``uv pip install
--dry-run``, ``uv sync --dry-run``) in the background, so the caller can snapshot meanwhile;
``DryRun.finish`` reads its answer and compares it with what is installed. pip's uninstall has no dry
run: its plan is the installed distributions it names. ``uv add``/``uv remove`` have none either: guard
judges those by the snapshot taken after them.
"""

from __future__ import annotations

import os
import re
import signal
import shutil
import subprocess
import tempfile
import time
from envvault.model.records import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from envvault.guard.command import Command
from envvault.model.encoding import json_loads
from envvault.terminate import OWN_SESSION

if TYPE_CHECKING:
    from packaging.utils import NormalizedName

# packaging, the RECORD reader and threads are imported where used: starting the dry run early is what
# keeps guard's overhead small (bench/bench_guard.py).

__all__ = ["Change", "PlannedDist", "Plan", "DryRun", "start_dry_run", "classify", "Installed"]

# How one distribution changes. "reinstall" is the same version string again: ``same_build`` says
# whether the bytes are the same build (True), another build (then the kind is "swap"), or unknown (None).
KINDS = ("add", "remove", "upgrade", "downgrade", "swap", "reinstall")


@dataclass(frozen=True, slots=True, kw_only=True)
class Installed:
    """What is installed now under one name (from the snapshot taken before)."""

    name: NormalizedName
    version: str
    build_id: str
    dist_info: Path | None = None  # absolute, when known
    known_sha256: frozenset[str] = frozenset()  # wheel hashes known to have produced this build


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedDist:
    """A distribution the tool says it would install."""

    name: NormalizedName
    version: str | None
    url: str | None = None
    sha256: str | None = None
    requested: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    name: NormalizedName
    kind: str
    old: str | None = None
    new: str | None = None
    same_build: bool | None = None
    url: str | None = None
    sha256: str | None = None

    @property
    def touches_build(self) -> bool:
        """True unless it only adds a new distribution or reinstalls the very same build."""
        return self.kind != "add" and not (self.kind == "reinstall" and self.same_build is True)

    def to_json(self) -> dict:
        d = {"name": self.name, "kind": self.kind, "old": self.old, "new": self.new}
        if self.kind in ("swap", "reinstall"):
            d["same_build"] = self.same_build
        if self.url:
            d["url"] = self.url
        if self.sha256:
            d["sha256"] = self.sha256
        return d


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """What the tool would do. ``source`` names where the plan came from; ``error`` says why there is none."""

    source: str | None
    changes: tuple[Change, ...] = ()
    installs: tuple[PlannedDist, ...] = ()
    error: str | None = None
    environment: str | None = None  # the environment the tool said it would use, when it said so
    seconds: float = 0.0

    @property
    def known(self) -> bool:
        return self.error is None and self.source is not None

    def to_json(self) -> dict:
        return {"source": self.source, "known": self.known, "error": self.error, "environment": self.environment,
                "changes": [c.to_json() for c in self.changes], "seconds": round(self.seconds, 3)}


def _version(text: str | None):
    from packaging.version import InvalidVersion, Version

    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def classify(old: Installed | None, new: PlannedDist | None, *, verify: bool = True) -> Change:
    """One change from what is installed (``old``) and what the tool would put in its place (``new``)."""
    if new is None:
        assert old is not None
        return Change(name=old.name, kind="remove", old=old.version)
    if old is None:
        return Change(name=new.name, kind="add", new=new.version, url=new.url, sha256=new.sha256)
    base = dict(name=new.name, old=old.version, new=new.version, url=new.url, sha256=new.sha256)
    if new.version == old.version:
        same = None
        if verify and old.dist_info is not None:
            from envvault.guard.builds import same_build

            same = same_build(old.dist_info, url=new.url, sha256=new.sha256, known_sha256=set(old.known_sha256))
        return Change(kind="swap" if same is False else "reinstall", same_build=same, **base)
    ov, nv = _version(old.version), _version(new.version)
    if ov is None or nv is None or new.version is None:
        return Change(kind="swap", same_build=False, **base)
    if ov.public == nv.public:
        # Same release, another local label (2.11.0+cu128 -> 2.11.0): another build, the torch swap.
        return Change(kind="swap", same_build=False, **base)
    return Change(kind="upgrade" if nv > ov else "downgrade", **base)


# -- running the tool's dry run -------------------------------------------------------------------


def _insert(argv: tuple[str, ...], extra: list[str]) -> list[str]:
    """Append options, but before a ``--`` separator when there is one."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i] + extra + argv[i:]
    return argv + extra


@dataclass
class DryRun:
    """A dry run in flight (or none, for commands without one). Call ``finish`` once."""

    cmd: Command
    proc: subprocess.Popen | None = None
    workdir: Path | None = None
    started: float = field(default_factory=time.monotonic)
    reason: str | None = None  # why there is no dry run

    def kill(self) -> None:
        """End the dry run and whatever it started (a build backend): its process group, which it leads (a
        session of its own, ``OWN_SESSION``, where Ctrl-C does not reach: helper 37)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                self.proc.kill()
            self.proc.wait()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def finish(self, installed: Mapping[str, Installed], *, verify: Callable[[str], bool] = lambda name: True) -> Plan:
        """Wait for the dry run and turn its answer into a ``Plan`` against ``installed``. A same-version
        reinstall is checked for being the same build only where ``verify(name)`` (it may read the wheel's
        RECORD over the network: worth it for protected packages)."""
        try:
            return self._finish(installed, verify)
        finally:
            self.kill()

    def _finish(self, installed: Mapping[str, Installed], verify: Callable[[str], bool]) -> Plan:
        cmd = self.cmd
        if cmd.tool == "pip" and cmd.action == "uninstall":
            return _pip_uninstall_plan(cmd, installed)
        if self.proc is None:
            return Plan(source=None, error=self.reason or "no dry run for this command")
        rc = self.proc.wait()
        seconds = time.monotonic() - self.started
        assert self.workdir is not None
        out = (self.workdir / "stdout").read_text(errors="replace")
        err = (self.workdir / "stderr").read_text(errors="replace")
        if rc != 0:
            last = [ln for ln in (err or out).strip().splitlines() if ln.strip()]
            return Plan(source=None, seconds=seconds,
                        error=f"the dry run exited {rc}: {last[-1].strip() if last else 'no output'}")
        if cmd.tool == "pip":
            try:
                report = json_loads((self.workdir / "report.json").read_text())
            except (OSError, ValueError) as e:
                return Plan(source=None, seconds=seconds, error=f"pip wrote no readable report ({e})")
            plan = _pip_install_plan(report, installed, verify)
        else:
            plan = _uv_plan(err + "\n" + out, installed, verify)
        return Plan(source=plan.source, changes=plan.changes, installs=plan.installs, environment=plan.environment,
                    seconds=seconds)


def start_dry_run(cmd: Command, env: Mapping[str, str], cwd: Path) -> DryRun:
    """Launch the tool's dry run for ``cmd`` in the background (``cmd`` must be mutating)."""
    if cmd.tool == "pip" and cmd.action == "install":
        extra = ["--dry-run", "--report", "{report}", "--progress-bar", "off"]
    elif cmd.tool == "uv-pip" and cmd.action in ("install", "uninstall", "sync"):
        extra = ["--dry-run"]
    elif cmd.tool == "uv-project" and cmd.action == "sync":
        extra = ["--dry-run"]
    elif cmd.tool == "pip" and cmd.action == "uninstall":
        return DryRun(cmd)  # planned from its arguments in finish()
    else:
        reason = f"{cmd.argv[0]} {cmd.action} has no dry run" if cmd.known else "not a pip or uv command"
        return DryRun(cmd, reason=reason)
    workdir = Path(tempfile.mkdtemp(prefix="envvault-guard-"))
    # The dry run of `sudo pip ...` runs without sudo: it only reads the environment.
    argv = [a.replace("{report}", str(workdir / "report.json")) for a in _insert(cmd.argv[len(cmd.sudo):], extra)]
    # Never prompt (keyring, proxies) and never colour: the answer is parsed.
    run_env = dict(env, PIP_NO_INPUT="1", NO_COLOR="1", UV_NO_PROGRESS="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    try:
        with open(workdir / "stdout", "wb") as out, open(workdir / "stderr", "wb") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=run_env, cwd=cwd,
                                    **OWN_SESSION)
    except OSError as e:
        shutil.rmtree(workdir, ignore_errors=True)
        return DryRun(cmd, reason=f"cannot run {argv[0]}: {e.strerror or e}")
    return DryRun(cmd, proc=proc, workdir=workdir)


# -- reading the answers --------------------------------------------------------------------------


def _classify_all(pairs: list[tuple[Installed | None, PlannedDist | None]],
                  verify: Callable[[str], bool]) -> list[Change]:
    """``classify`` each pair; the build checks that may touch the network run side by side."""
    def one(pair):
        old, new = pair
        name = (new or old).name
        return classify(old, new, verify=verify(name) and (new is None or bool(new.url)))

    slow = sum(1 for old, new in pairs if old and new and old.version == new.version and new.url)
    if slow < 2:
        return [one(p) for p in pairs]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(8, slow)) as pool:
        return list(pool.map(one, pairs))


def _pip_install_plan(report: dict, installed: Mapping[str, Installed], verify: Callable[[str], bool]) -> Plan:
    from packaging.utils import canonicalize_name

    installs, pairs = [], []
    for item in report.get("install") or ():
        meta = item.get("metadata") or {}
        if not meta.get("name"):
            continue
        info = item.get("download_info") or {}
        archive = info.get("archive_info") or {}
        sha = (archive.get("hashes") or {}).get("sha256")
        if not sha and (archive.get("hash") or "").startswith("sha256="):
            sha = archive["hash"].split("=", 1)[1]
        planned = PlannedDist(name=canonicalize_name(meta["name"]), version=meta.get("version"),
                              url=info.get("url"), sha256=sha, requested=bool(item.get("requested")))
        installs.append(planned)
        pairs.append((installed.get(planned.name), planned))
    changes = sorted(_classify_all(pairs, verify), key=lambda c: c.name)
    return Plan(source="pip install --dry-run --report", changes=tuple(changes), installs=tuple(installs))


def _requirement_names(args: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """Names given to ``pip uninstall`` (positional and ``-r`` files); second item: unreadable files."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    names, problems, i = [], [], 0
    while i < len(args):
        arg, path = args[i], None
        if arg in ("-r", "--requirement"):
            path = args[i + 1] if i + 1 < len(args) else ""
            i += 1
        elif arg.startswith("--requirement="):
            path = arg.split("=", 1)[1]
        elif arg.startswith("-r") and not arg.startswith("--"):
            path = arg[2:]
        elif not arg.startswith("-"):
            names.append(arg)
        if path is not None:
            try:
                lines = Path(path).read_text(encoding="utf-8").splitlines()
            except (OSError, UnicodeDecodeError):  # not UTF-8 (pip reads it with the locale's): unreadable
                problems.append(path)
                lines = []
            for line in lines:
                line = line.split("#", 1)[0].strip()
                if line and not line.startswith("-"):
                    names.append(line)
        i += 1
    out = []
    for text in names:
        try:
            out.append(canonicalize_name(Requirement(text).name))
        except InvalidRequirement:
            out.append(canonicalize_name(text))
    return out, problems


def _pip_uninstall_plan(cmd: Command, installed: Mapping[str, Installed]) -> Plan:
    names, problems = _requirement_names(cmd.args)
    if problems:
        return Plan(source=None, error=f"cannot read {', '.join(problems)}")
    changes = [classify(installed[n], None) for n in sorted(set(names)) if n in installed]
    return Plan(source="pip uninstall arguments", changes=tuple(changes))


_UV_LINE = re.compile(r"^ ([-+~]) (\S+?)(?:==(\S+)| @ (\S+))(?: \(from (\S+)\))?\s*$")
_UV_ENV = re.compile(
    r"^(?:Using .* environment at|Would use project environment at|Would create project environment at): (.+?)\s*$")


def _url_version(url: str | None) -> str | None:
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    if url and url.split("#")[0].endswith(".whl"):
        try:
            return str(parse_wheel_filename(url.split("#")[0].rsplit("/", 1)[-1])[1])
        except InvalidWheelFilename:
            return None
    return None


def _uv_plan(text: str, installed: Mapping[str, Installed], verify: Callable[[str], bool]) -> Plan:
    from packaging.utils import canonicalize_name

    removed: dict[str, str | None] = {}
    added: dict[str, PlannedDist] = {}
    environment = None
    for line in text.splitlines():
        m = _UV_ENV.match(line.strip())
        if m:
            environment = m.group(1)
            continue
        m = _UV_LINE.match(line.rstrip())
        if not m:
            continue
        sign, name, version, url, origin = m.groups()
        name = canonicalize_name(name)
        url = url or origin
        if sign == "-":
            removed[name] = version
        else:
            added[name] = PlannedDist(name=name, version=version or _url_version(url), url=url)
    pairs, installs = [], []
    for name in sorted(set(removed) | set(added)):
        new = added.get(name)
        old = None
        if name in removed:
            old = installed.get(name) or Installed(name=name, version=removed[name] or "?", build_id="")
        if new is not None:
            installs.append(new)
        pairs.append((old, new))
    # uv names no URL for registry wheels: a same-version reinstall of one stays "build unknown".
    changes = _classify_all(pairs, verify)
    return Plan(source="uv --dry-run", changes=tuple(changes), installs=tuple(installs), environment=environment)
