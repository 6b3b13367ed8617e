"""The guarded run: snapshot, ask the tool for its plan, get consent, run, snapshot, diff, roll back.

``guard(...)`` decides and acts; it talks to people only through a ``GuardUI`` the caller passes (the CLI's
prints and prompts), and returns a ``GuardResult``. The pre-command work overlaps: the tool's dry run
runs in a child process while the snapshot before is taken.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from envvault.model.records import replace
from envvault.model.records import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, Protocol

from envvault.env.probe import chosen_python, find_target, target_options
from envvault.model.paths import absolute_path
from envvault.errors import EnvvaultError, RefusedError, StorageError, UsageError
from envvault.guard.command import (Command, locate_target, parse_command, uv_project, uv_project_root,
                                    uv_workspace_members)
from envvault.guard.plan import Change, Installed, Plan, start_dry_run
from envvault.model.provenance import ProvenanceEntry
from envvault.model.snapshot import Snapshot
from envvault.vault.fsutil import read_regular
from envvault.model.encoding import json_loads

if TYPE_CHECKING:
    from envvault.diff import DiffResult
    from envvault.guard.protect import Protection
    from envvault.vault.store import Vault

# Only what is needed to start the dry run is imported up front; the rest loads while it runs.

__all__ = ["GuardOptions", "GuardUI", "GuardResult", "guard", "run_command", "GUARD_ACTIVE"]

TRIGGER = "guard"
# Set for the guarded command, so a nested shell hook stays out; its value, ``<guard lock>:<guard's pid>``, lets a
# nested `envvault guard` of that environment run its command as part of the outer one (``_inside_guard_of``).
GUARD_ACTIVE = "ENVVAULT_GUARD_ACTIVE"
_PROJECT_FILES = ("pyproject.toml", "uv.lock")


@dataclass(frozen=True, slots=True, kw_only=True)
class GuardOptions:
    protect: tuple[str, ...] = ()
    unprotect: tuple[str, ...] = ()
    yes: bool = False  # consent to every protected change up front
    restore: bool = True  # roll back a failed or refused run (--no-restore keeps the wreck)
    interactive: bool = False  # a person can answer prompts (stdin is a TTY)
    venv: Path | None = None
    quiet_command: bool = False  # send the command's stdout to stderr (for --json)


class GuardUI(Protocol):
    def note(self, text: str) -> None: ...

    def show_plan(self, plan: Plan, protected: list[tuple[Change, str]], target: Path, before: str) -> None: ...

    def confirm(self, question: str, default: bool) -> bool: ...

    def show_diff(self, diff: DiffResult, before: str, after: str) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class GuardResult:
    """What happened. ``outcome``: "passthrough" (not an install: run as is), "ran", "refused" (protected
    change without consent: not run, or rolled back), "declined" (the user said no before it ran),
    "restored" (failed or unwanted: rolled back), "failed" (failed, nothing to roll back or --no-restore)."""

    command: tuple[str, ...]
    outcome: str
    exit_code: int
    command_exit: int | None = None
    target: str | None = None
    vault: str | None = None  # its location, for the commands a message names (``location.command_for``)
    before: str | None = None
    after: str | None = None
    restored_to: str | None = None
    plan: Plan | None = None
    protected: tuple[str, ...] = ()  # protected names the plan (or, without a plan, the result) touches
    diff: DiffResult | None = None
    reason: str | None = None
    restore_error: EnvvaultError | None = None
    warnings: tuple[str, ...] = ()
    timings: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "command": list(self.command),
            "outcome": self.outcome,
            "exit_code": self.exit_code,
            "command_exit": self.command_exit,
            "venv": self.target,
            "vault": self.vault,
            "before": self.before,
            "after": self.after,
            "restored_to": self.restored_to,
            "plan": self.plan.to_json() if self.plan is not None else None,
            "protected": list(self.protected),
            "diff": self.diff.to_json() if self.diff is not None else None,
            "reason": self.reason,
            "restore_error": str(self.restore_error) if self.restore_error else None,
            "warnings": list(self.warnings),
            "timings": {k: round(v, 4) for k, v in self.timings.items()},
        }


def run_command(argv: tuple[str, ...], env: Mapping[str, str], *, stdout_to_stderr: bool = False) -> tuple[int, float]:
    """Run ``argv`` with the terminal, return (exit code as a shell reports it, wall-clock start time).

    While it runs, Ctrl-C reaches only the child (it shares the terminal's process group), and a SIGTERM sent
    to guard (a scheduler's cancel, ``docker stop`` of a container whose first process guard is) is passed on
    to the child; either way guard stays alive to snapshot and roll back whatever the stopped command left.
    """
    started = time.time()
    try:
        proc = subprocess.Popen(list(argv), env=dict(env), stdout=sys.stderr if stdout_to_stderr else None)
    except FileNotFoundError:
        return 127, started
    except PermissionError:
        return 126, started
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    old_term = signal.getsignal(signal.SIGTERM)
    if old_term is not signal.SIG_IGN:  # started with SIGTERM ignored: it stays so, for the command too
        signal.signal(signal.SIGTERM, lambda _s, _f: proc.send_signal(signal.SIGTERM))
    try:
        rc = proc.wait()
    finally:
        signal.signal(signal.SIGINT, old)
        if old_term is not signal.SIG_IGN:
            signal.signal(signal.SIGTERM, old_term)
    return (128 - rc if rc < 0 else rc), started


def _installed(doc: Snapshot, prefix: Path, provenance: Mapping[str, ProvenanceEntry]) -> dict[str, Installed]:
    from packaging.utils import canonicalize_name

    sites = _sites(doc, prefix)
    dist_infos: dict[tuple[str, str], Path] = {}
    for site in sites:
        try:
            names = os.listdir(site)
        except OSError:
            continue
        for entry in names:
            if entry.endswith(".dist-info") and "-" in entry:
                stem, version = entry[: -len(".dist-info")].rsplit("-", 1)
                dist_infos[(canonicalize_name(stem), version)] = site / entry
    out = {}
    for p in doc.packages:
        prov = provenance.get(p.name)  # pip's report, as guard/provenance.py records it
        known = {prov.sha256} if prov is not None and prov.sha256 and prov.build_id == p.build_id else set()
        out[p.name] = Installed(name=p.name, version=p.version, build_id=p.build_id,
                                dist_info=dist_infos.get((p.name, p.version)), known_sha256=frozenset(known))
    return out


def _sites(doc: Snapshot, prefix: Path) -> list[Path]:
    py = doc.python
    return list(dict.fromkeys(prefix / d for d in (py.purelib, py.platlib) if d))


def _pointer(vault: Vault, lock: str) -> Path:
    """``state/<guard lock's name>.json``: the last guard snapshot of that environment (of a system one, of
    that interpreter)."""
    return vault.state_path(f"{lock}.json")


def _previous_provenance(vault: Vault, target: Path, lock: str) -> dict[str, ProvenanceEntry]:
    """The provenance of the last guard snapshot of ``target`` (named by a pointer under ``state/``, so no
    other snapshot is read); without the pointer, of the newest snapshot of ``target`` that has one."""
    try:
        sid = json_loads(read_regular(_pointer(vault, lock), 1 << 20, "guard pointer"))["last"]
        prov = vault.load_snapshot(sid).snapshot.provenance
        return dict(prov) if prov is not None else {}
    except (OSError, ValueError, KeyError, TypeError, EnvvaultError):
        pass
    for ref in vault.snapshots():
        if ref.snapshot.venv == str(target) and ref.snapshot.provenance is not None:
            return dict(ref.snapshot.provenance)
    return {}


def _remember(vault: Vault, lock: str, sid: str) -> None:
    from envvault.vault.fsutil import atomic_write

    try:
        atomic_write(_pointer(vault, lock), json.dumps({"last": sid}).encode(), tmp_dir=vault.state.tmp_dir,
                     durable=False)
    except EnvvaultError:
        pass  # only a cache: the next guard falls back to reading the snapshots


def _touched(diff: DiffResult, protection: Protection) -> list[str]:
    """Protected names the run removed or changed (adding a new distribution is not protected)."""
    names = [p.name for p in diff.removed] + [c.name for c in diff.changed]
    return sorted({n for n in names if protection.match(n)})


def _target_for(cmd: Command, options: GuardOptions, env: Mapping[str, str], cwd: Path) -> Path | None:
    if options.venv is None and chosen_python():  # --python: the system environment it sees
        return find_target(None)
    derived = locate_target(cmd, env, cwd) if cmd.known else None
    if options.venv is not None:
        chosen = find_target(options.venv)
        if derived is not None and absolute_path(derived) != chosen:
            raise UsageError(f"`{cmd.display}` would change {derived}, not --venv {chosen}; "
                             "run it with that environment's pip or drop --venv")
        return chosen
    if derived is not None:
        return find_target(derived) if derived.exists() else None
    if cmd.tool in ("pip", "uv-project"):
        return None  # pip from outside any environment, or no uv project: nothing of ours to guard
    fallback = env.get("VIRTUAL_ENV") or env.get("CONDA_PREFIX")
    return find_target(fallback) if fallback else None


def guard(
    argv: list[str] | tuple[str, ...],
    options: GuardOptions,
    ui: GuardUI,
    *,
    vault_path: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> GuardResult:
    """Run ``argv`` under guard: snapshot, plan, consent, run, snapshot, diff, roll back when it failed or
    changed a protected package without consent. Never raises for the command's own failure: its exit
    code is in the result."""
    t0 = time.monotonic()
    env = dict(os.environ if env is None else env)
    if cwd is None:
        try:
            cwd = Path(os.getcwd())
        except OSError:  # (the shell hook runs guard for every install, wherever the user is)
            raise UsageError("the working folder no longer exists; cd to a folder that does and run the "
                             "command again") from None
    cwd = Path(cwd)
    cmd = parse_command(argv)
    if cmd.elsewhere and chosen_python() and "--user" in cmd.args:
        # --python: the user site is part of the system environment guarded (docs/format.md, "Environment kinds")
        bare = parse_command([a for a in argv if a != "--user"])
        if not bare.elsewhere:
            cmd = replace(bare, argv=tuple(argv))
    if not argv:
        raise UsageError("no command given: envvault guard -- pip install ...")
    child_env = dict(env, **{GUARD_ACTIVE: "1"})
    if cmd.known and not cmd.mutating:
        if cmd.elsewhere:
            ui.note(f"`{cmd.display}` installs outside the environment; running it unguarded")
        rc, _ = run_command(cmd.argv, child_env, stdout_to_stderr=options.quiet_command)
        return GuardResult(command=cmd.argv, outcome="passthrough", exit_code=rc, command_exit=rc)
    target = _target_for(cmd, options, env, cwd)
    if target is None:
        if cmd.known:
            ui.note(f"`{cmd.display}` does not act on a virtual environment here; running it unguarded")
            rc, _ = run_command(cmd.argv, child_env, stdout_to_stderr=options.quiet_command)
            return GuardResult(command=cmd.argv, outcome="passthrough", exit_code=rc, command_exit=rc)
        raise UsageError("no environment to guard: pass --venv PATH or activate a virtual environment")

    from envvault.vault.store import Vault

    vault = Vault.open(vault_path, create=True)
    lock = _guard_lock(target)
    if _inside_guard_of(env.get(GUARD_ACTIVE), lock, vault):
        # Run by a command that a guard of this environment runs (a Makefile's `envvault guard -- pip ...` under
        # an outer guard): that guard's snapshots and rollback cover it; a second guard would be refused.
        ignored = [flag for flag, given in (("--protect", options.protect), ("--unprotect", options.unprotect),
                                            ("--no-restore", not options.restore)) if given]
        ui.note(f"{target} is guarded by the envvault guard that runs this command; running `{cmd.display}` as "
                "part of it" + (f" ({', '.join(ignored)} not applied: that guard's settings judge its whole command)"
                                if ignored else ""))
        rc, _ = run_command(cmd.argv, env, stdout_to_stderr=options.quiet_command)
        return GuardResult(command=cmd.argv, outcome="passthrough", exit_code=rc, command_exit=rc)
    child_env[GUARD_ACTIVE] = f"{lock}:{os.getpid()}"  # (the shell hook only asks whether it is set)
    with one_guard_at_a_time(vault, target, lock) as pin:
        return _guard_target(vault, target, cmd, options, ui, env, cwd, child_env, t0, lock, pin)


def _inside_guard_of(active: str | None, lock: str, vault: Vault) -> bool:
    """Whether this process was started, through any number of processes, by the guard named in
    ``$ENVVAULT_GUARD_ACTIVE`` (``<guard lock>:<its pid>``), and that guard guards this environment now (the
    lock is ``lock``, held, and names that pid). An inherited variable alone proves nothing: a shell or server
    started inside a guarded command keeps it after that guard ended, while another guard may run."""
    name, _, pid = (active or "").rpartition(":")
    if name != lock or not pid.isdigit() or not _is_ancestor(int(pid)) or not vault.state.held_elsewhere(lock):
        return False
    from envvault.vault.gc import read_guard_note

    return read_guard_note(vault.state.note_of_lock(lock))[0] == int(pid)  # the guard holding it wrote its pid


def _is_ancestor(pid: int) -> bool:
    """Whether process ``pid`` is this process's parent, its parent's parent, and so on (Linux ``/proc``;
    where it cannot be read, False)."""
    here = os.getppid()
    for _ in range(256):
        if here == pid:
            return True
        if here <= 1:
            return False
        try:
            with open(f"/proc/{here}/stat", "rb") as f:
                stat = f.read(4096)
            here = int(stat[stat.rindex(b")") + 2:].split()[1])  # "pid (comm) state ppid ..."
        except (OSError, ValueError, IndexError):
            return False
    return False


@contextmanager
def one_guard_at_a_time(vault: Vault, target: Path, lock: str) -> Iterator[Callable[[str], None]]:
    """Hold guard's lock of ``target``, ``lock`` (``_guard_lock``), from its first snapshot to its rollback, its
    pid written into it (``vault.gc.guard_note``); a RefusedError when another guard of it runs: its rollback
    would undo this one's command, which it would report as its own (helper 23: a second guard's successful
    ``pip install`` was undone by the first's). Yields ``pin(sid)``, called as the "before" snapshot commits
    (under the vault lock): its id goes into the lock file and, in a vault of lock objects, into a lease that
    every node's gc reads (``vault.gc.guard_lease``), both kept until this guard ends."""
    from envvault.vault.gc import guard_lease, guard_note

    deadline = time.monotonic() + 0.25  # a gc's probe of the lock (``vault.gc.guarded_snapshots``) is brief
    while True:
        with vault.state.lock(lock, exclusive=True, wait=False) as held:
            if held:
                vault.state.note_in_lock(lock, guard_note(os.getpid()))  # (not the last guard's pid and id)
                with ExitStack() as leases:
                    def pin(sid: str) -> None:
                        vault.state.note_in_lock(lock, guard_note(os.getpid(), sid))
                        try:
                            leases.enter_context(guard_lease(vault, sid, str(target)))
                        except StorageError as err:
                            raise StorageError(f"{err}; guard stopped before running the command (its lease on "
                                               f"snapshot {sid[:12]} could not be written)") from None

                    yield pin
                return
        if time.monotonic() > deadline:
            raise RefusedError(f"another envvault guard of {target} is running; run this command once it has "
                               "finished")
        time.sleep(0.02)


def _guard_lock(target: Path | str) -> str:
    """The name of ``target``'s guard lock, ``guard-<key>[-<ikey>]`` (of a system environment, however it was
    named, ``--python`` or ``--venv`` its prefix: of the interpreter in use, as its restore marker)."""
    from envvault.env.probe import system_interpreter
    from envvault.safepaths import environment_key
    from envvault.vault.gc import GUARD_LOCK

    return GUARD_LOCK + environment_key(target, system_interpreter(target))


def _guard_target(vault: Vault, target: Path, cmd: Command, options: GuardOptions, ui: GuardUI,
                  env: dict, cwd: Path, child_env: dict, t0: float, lock: str,
                  pin: Callable[[str], None]) -> GuardResult:
    """``guard``'s work on ``target``, under ``one_guard_at_a_time``."""
    from envvault.journal import wait_for_restore

    wait_for_restore(vault, target)  # its snapshots are of the tree a running restore leaves, not part way
    # The dry run works in the background while the snapshot is taken.
    dry = start_dry_run(cmd, env, cwd) if cmd.known else None
    timings: dict[str, float] = {"dry_run_started": time.monotonic() - t0}
    warnings: list[str] = []
    try:
        from envvault.diff import diff_snapshots
        from envvault.guard.protect import load_protection
        from envvault.guard.provenance import carry, current_builds, pip_indexes, report_provenance
        from envvault.snap import take_snapshot

        protection = load_protection(vault.settings(), target, options.protect, options.unprotect)
        t = time.monotonic()
        if not _pointer(vault, lock).exists():
            from envvault.vault.heads import newest_head

            if newest_head(vault, lambda h: h.venv == str(target) and h.kind == "snapshot") is None:
                ui.note(f"snapshotting {target} first (an environment's first snapshot stores every file once)")
        prev = _previous_provenance(vault, target, lock)
        prov_before = carry(prev, current_builds(target, _sites_guess(target), prev)) if prev else {}
        record_argv = ["envvault", "guard", "--", *cmd.argv]
        # Its id is pinned under the vault lock that commits it: gc keeps it while this guard runs
        # (``vault.gc.guarded_snapshots``), also when the guarded command runs that gc, or another node does.
        before = take_snapshot(vault, target, message=f"before: {cmd.display}", trigger=TRIGGER, argv=record_argv,
                               on_commit=pin,
                               extra={"guard": {"phase": "before", "command": list(cmd.argv)},
                                      **({"provenance": prov_before} if prov_before else {})})
        timings["snapshot_before"] = time.monotonic() - t
        t = time.monotonic()
        installed = _installed(before.snapshot, target, prov_before)
        if dry is None:
            plan = Plan(source=None, error="not a pip or uv command")
        else:
            plan = dry.finish(installed, verify=lambda name: protection.match(name) is not None)
        timings["plan_wait"] = time.monotonic() - t
    finally:
        if dry is not None:
            dry.kill()
    if plan.environment and os.path.realpath(Path(cwd, plan.environment)) != os.path.realpath(target):
        raise UsageError(f"{cmd.argv[0]} says it would use {plan.environment}, but guard snapshotted {target}; "
                         "pass --venv with the environment it should guard")
    protected = [(c, pat) for c in plan.changes if c.touches_build and (pat := protection.match(c.name))]
    ui.show_plan(plan, protected, target, before.id)
    base = dict(command=cmd.argv, target=str(target), vault=vault.location, before=before.id, plan=plan,
                protected=tuple(sorted({c.name for c, _ in protected})))

    consented: set[str] = set()
    if protected:
        names = ", ".join(sorted({c.name for c, _ in protected}))
        if options.yes:
            consented = {c.name for c, _ in protected}
        elif options.interactive:
            timings["pre_command"] = time.monotonic() - t0
            if not ui.confirm(f"{names} would change. Go ahead?", False):
                return GuardResult(outcome="declined", exit_code=3, reason=f"you declined the change to {names}",
                                   timings=timings, **base,
                                   warnings=tuple(_retain(vault, target, protection, before.snapshot)))
            consented = {c.name for c, _ in protected}
        else:
            timings["pre_command"] = time.monotonic() - t0
            return GuardResult(outcome="refused", exit_code=3, timings=timings, **base,
                               warnings=tuple(_retain(vault, target, protection, before.snapshot)),
                               reason=f"{names} would change and there is no terminal to ask; "
                                      "rerun with --yes to allow it")

    project_files = _read_project_files(cmd, cwd, target)
    sites = _sites(before.snapshot, target)
    # (Not in a system environment: apt may add there meanwhile, and a rollback there keeps dpkg's files.)
    tops = {} if before.snapshot.python.system else _top_entries(sites)
    shared = _shared_folders(tops)  # (listed before the command: what was there then is never removed)
    timings.setdefault("pre_command", time.monotonic() - t0)
    rc, started = run_command(cmd.argv, child_env, stdout_to_stderr=options.quiet_command)
    timings["command"] = time.time() - started
    timings["command_started_at"] = started

    t = time.monotonic()
    fresh = report_provenance(plan.installs, pip_indexes(cmd, env, target)) if cmd.tool == "pip" else {}
    merged = {**prov_before, **fresh}
    prov_after = carry(merged, current_builds(target, sites, merged)) if merged else {}
    after = take_snapshot(vault, target, message=f"after: {cmd.display} (exit {rc})", trigger=TRIGGER,
                          argv=record_argv,
                          extra={"guard": {"phase": "after", "command": list(cmd.argv), "exit_code": rc,
                                           "before": before.id},
                                 **({"provenance": prov_after} if prov_after else {})})
    timings["snapshot_after"] = time.monotonic() - t
    _remember(vault, lock, after.id)
    diff = diff_snapshots(before.snapshot, after.snapshot, vault=vault, old_label=before.id[:12], new_label=after.id[:12],
                          scope="environment")
    ui.show_diff(diff, before.id, after.id)
    base.update(after=after.id, diff=diff, command_exit=rc)

    unexpected = [n for n in _touched(diff, protection) if n not in consented and not options.yes]
    reason, outcome, exit_code = None, ("ran" if rc == 0 else "failed"), rc
    undo = False
    if diff.environment_empty:
        pass
    elif rc != 0:
        undo, reason = True, f"`{cmd.display}` exited {rc}"
    elif unexpected:
        names = ", ".join(unexpected)
        what = "the plan did not show it" if plan.known else "there was no plan to show first"
        if options.interactive:
            undo = not ui.confirm(f"{names} changed ({what}). Keep this change?", False)
            reason = f"you chose to undo the change to {names}" if undo else None
        else:
            undo, exit_code, outcome = True, 3, "refused"
            reason = f"{names} changed ({what}) and there is no terminal to ask; rerun with --yes to allow it"
    elif consented and options.interactive and not options.yes and _touched(diff, protection):
        undo = not ui.confirm("Keep this change?", True)
        reason = "you chose to undo it" if undo else None

    restore_error = None
    if rc != 0 and options.restore and diff.environment_empty:
        # No package changed, but a pip killed mid-install may have written one's files without its dist-info
        warnings += _remove_new_tops(tops, target, started)
        warnings += _remove_strays([], target, started, sites, shared)
    if undo and options.restore:
        t = time.monotonic()
        try:
            from envvault.restore.dispatch import restore_snapshot

            try:
                restored = restore_snapshot(vault, before.id, target, backup=False, caches=False)
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the state before is not back (helper 34)
                ui.note(f"the rollback was interrupted: {target} is as the command left it, or part way back; "
                        f"`{vault.command('restore', before.id[:12], *target_options(target))}` brings back the "
                        "state before the command")
                raise
            from envvault.snap.verdict import record_undone

            record_undone(vault, after.id)  # a state the rollback undid, as a restore's backup is
            unwritten = _write_project_files(project_files)
            if unwritten:
                warnings.append(f"could not put back {', '.join(unwritten)} as they were before the command")
            put_back = _put_back_paths(vault, before.snapshot, diff)
            left = _remove_pip_stashes(put_back, target, started)
            if left:
                warnings.append(f"removed what the command's pip had moved aside and left behind: {', '.join(left)}")
            warnings += _remove_new_tops(tops, target, started)
            if tops:  # (as for the new top-level names: not in a system environment)
                warnings += _remove_strays(put_back, target, started, sites, shared)
            if not restored.verified:
                warnings.append(f"after the rollback {target} still differs from snapshot {before.id[:12]}; "
                                f"`{vault.command('status', '--against', before.id[:12])}` shows how")
            outcome = "restored" if outcome != "refused" else outcome
            base["restored_to"] = before.id
        except EnvvaultError as err:
            restore_error = err
        timings["restore"] = time.monotonic() - t
    elif undo:
        warnings.append(f"--no-restore: the environment stays as the command left it; "
                        f"`{vault.command('restore', before.id[:12])}` brings back the state before")

    if not undo and not diff.environment_empty:
        edited = [str(path) for path, data in project_files.items() if _project_file(path) != data]
        if edited:  # the undo hint (`restore BEFORE`) puts back the venv only
            warnings.append(f"`{vault.command('restore', before.id[:12])}` puts back the environment only: "
                            f"{', '.join(edited)} keep what `{cmd.display}` changed (the next `uv sync` or `uv run` "
                            "would install it again); revert them too to undo it")
    warnings += _retain(vault, target, protection, before.snapshot)
    return GuardResult(outcome=outcome, exit_code=exit_code, reason=reason, restore_error=restore_error,
                       warnings=tuple(warnings), timings=timings, **base)


_PIP_LEADING = "-~.=%0123456789"  # pip's AdjacentTempDirectory.LEADING_CHARS
# The kernel stamps ctime from a clock that lags time.time() by up to a tick (ext4: a folder renamed 0.02 ms
# after the command started had a ctime before it): one second earlier still counts as made by the command.
_CTIME_SLACK = 1.0


def is_pip_stash(stash: str, name: str) -> bool:
    """Whether ``stash`` is a name pip gives a folder ``name`` it moves aside while it uninstalls it (its
    ``AdjacentTempDirectory``, in the same folder): ``~``, then characters of ``_PIP_LEADING``, then the end
    of ``name``, as long as ``name`` (``torch`` -> ``~orch``, ``~-rch``) or, once those are taken, ``~`` and
    such characters before the whole name."""
    if not stash.startswith("~") or len(stash) < len(name):
        return False
    lead = lambda part: all(c in _PIP_LEADING for c in part)  # noqa: E731
    if len(stash) == len(name):
        return any(stash[i:] == name[i:] and lead(stash[1:i]) for i in range(1, len(name)))
    return stash.endswith(name) and lead(stash[1:len(stash) - len(name)])


def _put_back_paths(vault: Vault, before: Snapshot, diff: DiffResult) -> list[str]:
    """The file paths (relative to the environment) of the packages a rollback put back: those the command
    removed or changed, as the snapshot before it lists them (each manifest read once)."""
    names = {p.name for p in diff.removed} | {c.name for c in diff.changed}
    paths: list[str] = []
    for pkg in before.packages:
        if pkg.name in names:
            try:
                paths.extend(f.path for f in vault.load_manifest(pkg.manifest).files)
            except EnvvaultError:
                continue
    return paths


def _remove_pip_stashes(paths: list[str], target: Path, started: float) -> list[str]:
    """After a rollback: the folders a pip killed mid-uninstall left beside the folders it was removing
    (``torch`` -> ``~orch``, ``nvidia/cublas`` -> ``nvidia/~ublas``) removed, never followed through a
    symlink: only those with pip's name for a folder of a package the command removed or changed (``paths``, its
    files: ``_put_back_paths``), made since it started (their ctime, ``_CTIME_SLACK``). Their paths under
    ``target``."""
    import shutil

    owned: dict[str, set[str]] = {}  # a folder (relative to target) -> names of the folders in it they own
    for path in paths:
        parts = path.split("/")[:-1]
        for depth in range(1, len(parts)):
            owned.setdefault("/".join(parts[:depth]), set()).add(parts[depth])
    removed = []
    for folder, dirs in sorted(owned.items()):
        try:
            with os.scandir(target / folder) as it:
                found = [e for e in it if e.name.startswith("~")]
        except OSError:
            continue
        for e in found:
            try:
                made = e.stat(follow_symlinks=False).st_ctime
                if made < started - _CTIME_SLACK or not any(is_pip_stash(e.name, d) for d in dirs):
                    continue
                if e.is_dir(follow_symlinks=False):
                    shutil.rmtree(e.path)
                else:
                    os.unlink(e.path)
                removed.append(f"{folder}/{e.name}")
            except OSError:
                continue
    return removed


def _top_entries(sites: list[Path]) -> dict[Path, set[str]]:
    """The names in each site folder before the command (one that cannot be listed is left out)."""
    tops = {}
    for site in sites:
        try:
            tops[site] = set(os.listdir(site))
        except OSError:
            continue
    return tops


_SHARED_LIMIT = 20_000  # entries listed in one shared folder before guard gives up on it (left as it is)


def _shared_folders(tops: dict[Path, set[str]]) -> dict[str, set[str] | None]:
    """The folders at the top of a site folder that packages share, each with what it holds before the
    command (its entries' paths under it, folders included; a symlink listed, never followed): no
    ``__init__.py`` at their top (a namespace such as ``nvidia/``, whose CUDA 13 wheels all write into
    ``nvidia/cu13/lib``, or a ``numpy.libs``); never a dist-info folder, a ``~`` name, ``__pycache__`` or a
    symlink. A pip killed installing a new ``nvidia-*`` package leaves its files there, not at the top. A
    folder of more than ``_SHARED_LIMIT`` entries, or one that cannot be listed whole, maps to None: left as it
    is, and ``_remove_strays`` says so."""
    shared = {}
    for site, names in tops.items():
        for name in sorted(names):
            if name.startswith("~") or name == "__pycache__" or name.endswith((".dist-info", ".egg-info", ".data")):
                continue
            path = os.path.join(site, name)
            if not os.path.isdir(path) or os.path.islink(path) or os.path.lexists(os.path.join(path, "__init__.py")):
                continue
            listed: set[str] = set()
            errors: list[OSError] = []
            for root, dirs, files in os.walk(path, onerror=errors.append):
                rel = os.path.relpath(root, path)
                listed.update(n if rel == "." else os.path.join(rel, n) for n in dirs + files)
                if len(listed) > _SHARED_LIMIT:
                    break
            shared[path] = listed if not errors and len(listed) <= _SHARED_LIMIT else None
    return shared


def _remove_new_tops(tops: dict[Path, set[str]], target: Path, started: float) -> list[str]:
    """After a failed command (rolled back, or one that changed no package): what it made at the top of a site
    folder that is still there, none of it owned by a package of the state put back (a rollback makes nothing
    there the state before did not have): the files a pip killed mid-install had written (``pandas/`` without
    its dist-info, which imports broken: helpers 36, 37). Only names not listed before the command ran
    (``tops``) and made since it started (their ctime, ``_CTIME_SLACK``), never followed through a symlink;
    never a ``~`` name: pip's copy of a package it uninstalls, which only ``_remove_pip_stashes`` removes, and
    only for a package the command changed (another pip's is that pip's way back); never ``__pycache__``
    (bytecode Python wrote while the command imported, as ``_remove_strays`` keeps it).
    The warning naming them (their paths under ``target``), or none."""
    import shutil

    removed = []
    for site, before in tops.items():
        try:
            with os.scandir(site) as it:
                found = [e for e in it if e.name not in before and not e.name.startswith("~") and e.name != "__pycache__"]
        except OSError:
            continue
        for e in sorted(found, key=lambda e: e.name):
            try:
                if e.stat(follow_symlinks=False).st_ctime < started - _CTIME_SLACK:
                    continue
                if e.is_dir(follow_symlinks=False):
                    shutil.rmtree(e.path)
                else:
                    os.unlink(e.path)
                removed.append(os.path.relpath(e.path, target))
            except OSError:
                continue
    if not removed:
        return []
    return [f"removed what the command left in site-packages that no package owns: {', '.join(removed)}"]


def _remove_strays(paths: list[str], target: Path, started: float, sites: list[Path],
                   shared: dict[str, set[str] | None] | None = None) -> list[str]:
    """After a failed command: the files in the folders of the packages a rollback put back (``paths``, their
    files: ``_put_back_paths``) and in the folders packages share (``shared``: ``_shared_folders``, with
    what each held before the command, which stays) that no installed distribution's RECORD lists and that
    were made since the command started (ctime, ``_CTIME_SLACK``): what a pip killed mid-upgrade had written
    of the new version beside the old files the rollback put back, or a pip killed installing a new
    ``nvidia-*`` package into ``nvidia/cu13/lib``. Then the folders among them left empty and made since.
    Only folders something was made in since are looked into (a file made there moves its folder's ctime),
    and RECORDs are read only when a file is found. Bytecode stays (Python passes over a ``.pyc`` whose
    source is gone), and so does every ``~`` name (pip's copies of what it uninstalls); a symlink is removed,
    never followed. A shared folder that was not listed whole (None) is not looked into, and a warning says
    so. The warnings naming how many, and where, and what was not looked into."""
    from envvault.model.identity import is_bytecode

    unlisted = sorted(f for f, listed in (shared or {}).items() if listed is None)
    shared = {f: listed for f, listed in (shared or {}).items() if listed is not None}
    folders: set[str] = set(shared)  # each folder to look into, absolute
    prefixes = [os.path.relpath(site, target).replace(os.sep, "/") + "/" for site in sites]
    for path in paths:
        for site, prefix in zip(sites, prefixes):
            rest = path[len(prefix):] if path.startswith(prefix) else None
            if rest and "/" in rest and not rest.startswith(("..", "~")):
                folders.add(os.path.join(site, rest.split("/", 1)[0]))
    skipped = [os.path.relpath(f, target) for f in unlisted if f not in folders]
    note = [f"did not look for what the command left in {', '.join(skipped)}: more than {_SHARED_LIMIT:,} entries "
            "before it ran, or some could not be listed"] if skipped else []
    since = started - _CTIME_SLACK
    found, made_dirs = [], []  # (folder, file) made since the command started; folders, deepest first
    for folder in sorted(folders):
        if os.path.islink(folder):  # os.walk would follow it, maybe out of the environment
            continue
        before = shared.get(folder, ())
        for root, dirs, files in os.walk(folder, topdown=False):
            inside = os.path.relpath(root, folder)
            if any(part.startswith("~") for part in inside.split(os.sep)):
                continue  # pip's copy of what it uninstalls: ``_remove_pip_stashes``'s (another pip's stays)
            try:
                if os.lstat(root).st_ctime < since:
                    continue  # nothing made in it since the command started
            except OSError:
                continue
            for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
                path = os.path.normpath(os.path.join(root, name))
                if name.startswith("~") or is_bytecode(path) or os.path.relpath(path, folder) in before:
                    continue
                try:
                    if os.lstat(path).st_ctime >= since:
                        found.append((folder, path))
                except OSError:
                    continue
            if root != folder and inside not in before:
                made_dirs.append(root)
    removed: set[str] = set()  # the folders looked into that files were removed from
    count = 0
    if found:
        from envvault.env.dists import scan_dists

        owned = {os.path.normpath(os.path.join(d.site, e.path)) for d in scan_dists(sites) for e in d.record or ()}
        for folder, path in found:
            if path in owned:
                continue
            try:
                os.unlink(path)
            except OSError:
                continue
            count += 1
            removed.add(folder)
    for root in made_dirs:
        try:
            os.rmdir(root)  # only when empty (its ctime was looked at: made in since the command started)
        except OSError:
            pass
    if not count:
        return note
    where = ", ".join(sorted(os.path.relpath(f, target) for f in removed))
    return [f"removed {count} file(s) the command left in the folders of the packages put back or shared by "
            f"packages that no package owns ({where})", *note]


def _sites_guess(prefix: Path) -> list[Path]:
    """site-packages folders of a POSIX venv, found without starting its interpreter."""
    return sorted(prefix.glob("lib*/python3*/site-packages"))


def _read_project_files(cmd: Command, cwd: Path, target: Path | None = None) -> dict[Path, bytes | None]:
    """``uv add/remove/sync`` edit pyproject.toml and uv.lock: keep their bytes to put back on rollback (the
    workspace root's, and every member's pyproject.toml: ``uv add`` edits the member's own). A command guard
    does not know (a script, ``sh -c 'uv add ... && ...'``) run on a uv project's ``.venv`` (``target``) may
    do the same: the project's own two files are kept too (helper 29: a wrapped ``uv add`` left them changed)."""
    if cmd.tool != "uv-project":
        if cmd.known or target is None or target.name != ".venv":
            return {}
        root = target.parent
        if not ((root / "uv.lock").is_file() and (root / "pyproject.toml").is_file()):
            return {}
        return _kept_project_files([root / name for name in _PROJECT_FILES])
    root, member = uv_project_root(cmd, cwd), uv_project(cmd, cwd)
    if root is None:
        return {}
    paths = [root / name for name in _PROJECT_FILES]
    # uv add/remove edit the member's own (its folder, or the one --package names from anywhere)
    for folder in dict.fromkeys([*([member] if member is not None else []), *uv_workspace_members(root)]):
        if folder != root:
            paths.append(folder / "pyproject.toml")
    return _kept_project_files(paths)


def _kept_project_files(paths: list[Path]) -> dict[Path, bytes | None]:
    out: dict[Path, bytes | None] = {}
    for path in paths:
        data = _project_file(path)
        if data is not _UNREADABLE:  # one that cannot be read is left as it is, on rollback too
            out[path] = data
    return out


_UNREADABLE = object()
_PROJECT_FILE_MAX = 64 << 20  # a pyproject.toml or uv.lock guard keeps, at most


def _project_file(path: Path):
    """The bytes of a project file (a regular file, bounded), None when there is none, ``_UNREADABLE``
    when it cannot be read (a symlink, a FIFO, no permission, too large)."""
    from envvault.vault.fsutil import read_regular

    try:
        return read_regular(path, _PROJECT_FILE_MAX, str(path))
    except FileNotFoundError:
        return None
    except (OSError, EnvvaultError):
        return _UNREADABLE


def _write_project_files(files: dict[Path, bytes | None]) -> list[str]:
    """The project files put back as they were (one the command made removed); those that could not be."""
    from envvault.vault.fsutil import atomic_write

    failed = []
    for path, data in files.items():
        if _project_file(path) == data:
            continue
        try:
            if data is None:
                path.unlink()
            else:
                atomic_write(path, data, mode=0o644)
        except (OSError, EnvvaultError):
            failed.append(str(path))
    return failed


def _retain(vault: Vault, target: Path, protection: Protection, before: Snapshot) -> list[str]:
    from envvault.guard.retention import apply_retention

    try:  # a system environment's snapshots are counted per interpreter
        apply_retention(vault, target, keep=protection.keep, interpreter=before.system_interpreter)
    except EnvvaultError as err:
        return [f"retention skipped: {err}"]
    return []
