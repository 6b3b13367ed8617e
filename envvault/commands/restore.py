"""diff, status, restore, tag, untag, gc: parse, call the library, render.

Exit codes (beyond the error table in envvault/errors.py): ``diff``/``status --exit-code`` exit 1 when
something differs; ``restore`` exits 1 when it finished but the environment does not verify against the
snapshot (the JSON's ``remaining`` says what still differs).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from envvault.cli import PathType, cli
from envvault.commands.snapshots import json_option, open_vault, resolve_ref, venv_option
from envvault.errors import UsageError
from envvault.model.snapshot import Snapshot
from envvault.output import Progress, emit_json, human_bytes, style
from envvault.model.paths import absolute_path
from envvault.vault.store import Vault

__all__ = ["resolve_side", "resolve_snapshot"]


def resolve_side(vault: Vault, arg: str, *, venv: str | None = None,
                 other: str | None = None, other_doc=None) -> tuple[str, Snapshot | dict]:
    """One side of a diff as (label, document): ``current`` (the live environment, nothing written to the
    vault), a path to a pylock.toml, or what :func:`envvault.refs.resolve_arg` takes (a snapshot id / prefix /
    tag / ``latest``, a stamped checkpoint file or folder). ``other``: for ``current`` without ``--venv`` and
    without an active venv, the environment the other side names (see :func:`current_target`)."""
    if arg == "current":
        from envvault.snap import scan_current

        target = current_target(venv, other, other_doc)
        return f"current ({target})", scan_current(vault, target)
    label, doc, _ = _stored_side(vault, arg, venv)
    return label, doc


def _stored_side(vault: Vault, arg: str, venv: str | None = None) -> tuple[str, Snapshot | dict, str | None]:
    """A side that is not ``current``: (label, document, the environment it names or None)."""
    from envvault.refs import is_lockfile, resolve_arg

    path = Path(arg).expanduser()
    if path.is_file() and is_lockfile(path):
        from envvault.lock.pylock_doc import lockfile_document

        return str(path), lockfile_document(path), None
    ref = resolve_arg(vault, arg, venv)
    return ref.label, vault.load_snapshot(ref.sid).snapshot, ref.venv


def current_target(venv: str | None, named: str | None, snapshot=None) -> Path:
    """The environment ``current`` means: ``--venv``, else the active venv (``$VIRTUAL_ENV``), else the one
    the other side names (a snapshot's environment or a checkpoint stamp's) when it still exists, else
    ``$CONDA_PREFIX`` / a clear error (:func:`find_target`)."""
    from envvault.env.probe import chosen_python, find_target

    if venv is None and chosen_python():
        return find_target(None)  # --python
    if venv is None and not os.environ.get("VIRTUAL_ENV") and named:
        if Path(named).is_dir():  # a system snapshot's own root through its interpreter (not a venv it was put in)
            system = _system_python(snapshot) if named == getattr(snapshot, "venv", None) else None
            return find_target(None, python=system) if system else find_target(named)
        if not os.environ.get("CONDA_PREFIX"):
            raise UsageError(f"`current` would be {named}, the environment the snapshot names, but it does not "
                             "exist; pass --venv PATH or activate a virtual environment")
    return find_target(venv)


def _open_for(ctx: click.Context, *args: str) -> Vault:
    """The vault of --vault / $ENVVAULT_HOME; without either, the bucket a stamped checkpoint among ``args``
    was written to, so `envvault restore step_690.pt` on another node finds it (H6, issue 12)."""
    if not ctx.obj.get("vault_path"):
        url = next(filter(None, map(_stamp_url, args)), None)
        if url:
            ctx.obj["vault_path"] = url
            # The checkpoint chose the vault: whoever wrote it chose what is read (say so; --vault or
            # $ENVVAULT_HOME keeps a checkpoint from someone else to the vaults the user names).
            click.echo(f"using the vault the checkpoint's stamp names, {url} (pass --vault to use another)",
                       err=True)
    return open_vault(ctx)


def _stamp_url(arg: str) -> str | None:
    """The s3:// URL of the vault a stamped checkpoint file or folder names, else None."""
    from envvault.errors import EnvvaultError

    try:
        if not Path(arg).exists():
            return None
        from envvault.torch.directories import read_checkpoint
        from envvault.vault.location import vault_url

        stamp = read_checkpoint(Path(arg)).stamp
        return vault_url(stamp.vault) if stamp is not None and stamp.vault else None
    except (EnvvaultError, OSError, ValueError):  # the resolver reports an unreadable checkpoint itself
        return None


def resolve_snapshot(vault: Vault, arg: str, venv: str | None = None):
    """A snapshot for restore (:class:`envvault.refs.Ref`): id / prefix / tag / ``latest`` (of ``--venv``,
    else the active environment), or a stamped checkpoint file or folder."""
    from envvault.refs import resolve_arg

    return resolve_arg(vault, arg, venv)


def _render_diff(result) -> None:
    from envvault.commands.diff_text import render_text

    text = render_text(result)
    if text:
        click.echo(text)
    else:
        click.echo(f"no differences between {result.old_label} and {result.new_label}")


@cli.command()
@click.argument("old")
@click.argument("new")
@venv_option
@json_option
@click.option("--exit-code", is_flag=True, help="Exit 1 when anything differs.")
@click.pass_context
def diff(ctx, old, new, venv, as_json, exit_code):
    """Show what changed from OLD to NEW.

    Each side is a snapshot id, unique prefix, tag or `latest`; a stamped checkpoint file or folder;
    `current` (the live environment, read without writing to the vault: --venv, else the active venv, else
    the environment the other side names); or a path to a pylock.toml.

    \b
    Examples:
      envvault diff latest current
      envvault diff before-sglang after-sglang --json
      envvault diff 3fa9c2 pylock.toml --exit-code
    """
    from envvault.diff import diff_snapshots

    vault = _open_for(ctx, old, new)
    stored = {arg: _stored_side(vault, arg, venv) for arg in (old, new) if arg != "current"}
    named = next((s[2] for s in stored.values() if s[2]), None)  # for `current`: the environment named
    named_doc = next((s[1] for s in stored.values() if s[2]), None)  # a system environment's interpreter
    old_label, old_doc = stored[old][:2] if old in stored else resolve_side(vault, old, venv=venv, other=named, other_doc=named_doc)
    new_label, new_doc = stored[new][:2] if new in stored else resolve_side(vault, new, venv=venv, other=named, other_doc=named_doc)
    result = diff_snapshots(old_doc, new_doc, vault=vault, old_label=old_label, new_label=new_label)
    if as_json:
        emit_json(result.to_json())
    else:
        _render_diff(result)
    if exit_code and not result.empty:
        sys.exit(1)


@cli.command()
@venv_option
@click.option("--against", "against", default=None, help="Compare with this snapshot (default: the latest of the environment).")
@json_option
@click.option("--exit-code", is_flag=True, help="Exit 1 when the environment differs from the snapshot.")
@click.pass_context
def status(ctx, venv, against, as_json, exit_code):
    """What changed in the environment since its latest snapshot (or the snapshot last restored onto it):
    installs, removals, upgrades, other builds, files edited in place. Host and environment variables are
    left to `diff latest current`.

    \b
    Examples:
      envvault status
      envvault status --venv ~/venvs/train --json
    """
    from envvault.diff import contents_note, diff_snapshots
    from envvault.snap.scan import save_checked, scan_current, statcache_for
    from envvault.snap.verdict import record_verdict, unchanged_text, verdict_stamp
    from envvault.env.probe import find_target, target_options
    from envvault.restore.baseline import baseline_snapshot
    from envvault.journal import interrupted_restore, journal_file, wait_for_restore

    vault = open_vault(ctx)
    stamp = None  # the vault's side of a verdict (snap/verdict.py), taken before the baseline is chosen
    if against:  # without --venv and an active venv: the environment the snapshot names (latest's: its own)
        from envvault.refs import resolve_named

        ref = resolve_named(vault, against, venv)
        sid = ref.sid
        target = current_target(venv, ref.venv, vault.load_snapshot(sid).snapshot)
        wait_for_restore(vault, target)  # one running now: its end, not the tree part way through it
    else:
        target = find_target(venv)
        wait_for_restore(vault, target)  # (before the baseline: the one it restores becomes it)
        stamp = verdict_stamp(vault, target)
        sid = baseline_snapshot(vault, target)
    snap = vault.load_snapshot(sid).snapshot
    broken = interrupted_restore(journal_file(vault, target))
    if broken:
        click.echo(f"warning: a restore of {broken[:12]} onto {target} was interrupted; run "
                   f"`{vault.command('restore', broken[:12], *target_options(target))}` to finish it", err=True)
    cache = statcache_for(vault, target)
    now = scan_current(vault, target, facts=False, cache=cache, save_cache=False)
    result = diff_snapshots(snap, now, vault=vault, old_label=sid[:12], new_label="current", scope="environment")
    note = contents_note(vault, sid, snap, changed=not result.empty)
    save_checked(cache)
    if stamp is not None and result.empty and not broken:  # the next status may answer from this one
        record_verdict(vault, cache, target=target, sid=sid, note=note, stamp=stamp)
    if as_json:
        emit_json({"venv": str(target), "snapshot": sid, "interrupted_restore": broken,
                   "contents_recorded": not snap.lock_only, **result.to_json()})
    elif result.empty:
        click.echo(unchanged_text(target, sid, note))
    else:
        click.echo(f"{target}: changed since snapshot {style(sid[:12], 'yellow')}" + (f" ({note})" if note else ""))
        _render_diff(result)
    if exit_code and not result.empty:
        sys.exit(1)


def _system_python(snapshot) -> str | None:
    """The interpreter a system environment's snapshot recorded (docs/format.md, "Environment kinds"), when
    it still exists: the snapshot's ``venv`` is then that interpreter's root, not a venv. None otherwise."""
    python = getattr(snapshot, "python", None)
    if python is not None and python.system and python.interpreter and Path(python.interpreter).is_file():
        return python.interpreter
    return None


def _restore_target(vault: Vault, sid: str, venv: str | None, named: str | None = None,
                    scoped: bool = False) -> Path:
    """--venv (or --python), else the environment the argument names (``latest``'s environment, ``scoped``;
    a checkpoint stamp's, else the snapshot's; a system environment's through its recorded interpreter) when
    it exists, else the active venv. ``latest`` of an environment since deleted is rebuilt with --into only."""
    from envvault.env.probe import chosen_python, find_target

    if venv is not None and not os.path.lexists(absolute_path(venv)):
        gone = str(absolute_path(venv))
        raise UsageError(f"{gone} does not exist; pass --venv with an environment's path, or to build it there "
                         f"as the snapshot has it: `{vault.command('restore', sid[:12], '--into', gone)}`")
    if venv is not None or chosen_python():
        return find_target(venv)
    snapshot = vault.load_snapshot(sid).snapshot
    recorded = snapshot.venv
    system = _system_python(snapshot)
    if system and recorded and (named in (None, recorded)):
        return find_target(None, python=system)
    if scoped and named:  # the environment `latest` was taken for, never the one the snapshot was made of
        if not Path(named).is_dir():
            raise UsageError(f"{named}, the environment `latest` is taken for, does not exist; rebuild it with "
                             f"`{vault.command('restore', sid[:12], '--into', named)}`")
        return find_target(named)
    for candidate in (named, recorded):
        if candidate and Path(candidate).is_dir():
            return find_target(candidate)
    if os.environ.get("VIRTUAL_ENV"):
        return find_target(None)
    raise UsageError(f"the snapshot's environment {recorded} does not exist; pass --venv PATH or --into NEW_PATH")


@cli.command()
@click.argument("snapshot_id")
@venv_option
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
@click.option("--into", "into", type=PathType(file_okay=False), help="Build a new venv at this path instead.")
@click.option("--no-backup", is_flag=True, help="Do not snapshot the environment before changing it.")
@click.option("--no-caches", is_flag=True, help="Do not restore compile caches stored with the snapshot.")
@click.option("--system-site-packages", "share_system", is_flag=True,
              help="--into of a system Python's snapshot: leave its system-managed (apt) packages to the base "
                   "interpreter (include-system-site-packages) instead of copying them.")
@json_option
@click.pass_context
def restore(ctx, snapshot_id, venv, dry_run, into, no_backup, no_caches, share_system, as_json):
    """Put an environment back exactly as a snapshot recorded it, offline, from the vault.

    SNAPSHOT_ID is an id, unique prefix, tag, `latest`, or a stamped checkpoint file or folder.
    In place (default: --venv; for `latest`, the environment it is taken for; else the checkpoint's or
    snapshot's own environment, else the active venv):
    distributions the snapshot lacks are removed, changed ones (other version, other build, edited files)
    are rewritten, the rest is left untouched. The current state is snapshotted first, so `envvault restore <backup id>` undoes it.

    \b
    Examples:
      envvault restore latest --dry-run
      envvault restore before-sglang
      envvault restore 3fa9c2 --into ~/venvs/train-copy
    """
    from envvault.restore.dispatch import restore_snapshot

    if share_system:
        if not into:
            raise UsageError("--system-site-packages goes with --into NEW_PATH")
        from envvault.restore.managed import share_system_packages

        share_system_packages(True)
    vault = _open_for(ctx, snapshot_id)
    ref = resolve_snapshot(vault, snapshot_id, venv)
    sid = ref.sid
    into = str(absolute_path(into)) if into else None
    target = Path(into) if into else _restore_target(vault, sid, venv, ref.venv, ref.scoped)
    stats = vault.load_snapshot(sid).snapshot.stats
    total = (stats.bytes if stats is not None else 0) or 1
    bar = Progress("restore", total, enabled=not as_json)
    try:
        result = restore_snapshot(vault, sid, target, backup=not no_backup, dry_run=dry_run,
                                  into=Path(into) if into else None, progress=bar, caches=not no_caches)
    finally:
        bar.close()
    doc = result.to_json()
    if as_json:
        emit_json(doc)
    else:
        _render_restore(result, doc, vault)
    if not dry_run and not result.verified:
        sys.exit(1)


def _render_restore(result, doc: dict, vault: Vault) -> None:
    short = result.restored[:12]
    plan = doc.get("plan") or {}
    if result.mode == "into":
        verb = "would build" if result.dry_run else "built"
        click.echo(f"{verb} {result.target} from snapshot {style(short, 'yellow')}: python {plan.get('python')}, "
                   f"{len(plan.get('install') or ())} packages")
    else:
        diff_json = plan.get("diff") or {}
        if result.dry_run:
            click.echo(f"restore {style(short, 'yellow')} onto {result.target} would:")
        lines = _diff_lines(diff_json)
        for line in lines:
            click.echo(line)
        if result.dry_run and result.mode == "lock":
            for src in plan.get("sources") or ():
                origin = src.get("from") or {}
                where = (f"the stored copy in snapshot {origin['snapshot'][:12]}" if "snapshot" in origin
                         else origin.get("url", "?"))
                click.echo(f"install {src['name']} {src['version']} from {where}")
        elif result.dry_run:
            click.echo(f"write {plan.get('write_files', 0)} files ({human_bytes(plan.get('write_bytes', 0))}), "
                       + (f"set the mode of {plan['mode_files']}, " if plan.get("mode_files") else "")
                       + f"remove {result.removed_files} files, leave everything else untouched")
        elif result.changed == 0 and result.verified and not result.settings_set:
            click.echo(f"{result.target} already matches snapshot {style(short, 'yellow')}; nothing to do")
        else:
            click.echo(f"restored {style(short, 'yellow')} onto {result.target}: {result.changed} package(s) changed, "
                       f"{result.written_files} files written ({human_bytes(result.written_bytes)}), "
                       + (f"{result.modes_set} modes set, " if result.modes_set else "")
                       + f"{result.removed_files} removed in {result.seconds:.2f}s")
            for setting in result.settings_set:
                click.echo(f"pyvenv.cfg: {setting}, as the snapshot has it")
            if result.backup_refused:
                n = len(result.backup_refused)
                click.echo(f"backup {style(result.backup[:12], 'yellow')} (it cannot undo this restore: it holds {n} "
                           f"symlink(s) leading out of the environment, which a restore refuses to make: "
                           f"{result.backup_refused[0]}{f' and {n - 1} more' if n > 1 else ''})")
            elif result.backup:
                click.echo(f"backup {style(result.backup[:12], 'yellow')} "
                           f"(undo with: {vault.command('restore', result.backup[:12])})")
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)
    caches = result.caches or {}
    for c in caches.get("caches", ()):
        verb = "would write" if result.dry_run else "wrote"
        if c.get("written_files") or c.get("kept_files"):
            click.echo(f"cache {c['kind']} {c['root']}: {verb} {c.get('written_files', 0)} files "
                       f"({human_bytes(c.get('written_bytes', 0))}), kept {c.get('kept_files', 0)}")
    # The cache restore's warnings gather each cache's mismatches and warnings and a line per skipped cache
    # (caches/restore.py): printed once, as `cache restore` prints them.
    for w in caches.get("warnings", ()):
        click.echo(f"warning: {w}", err=True)
    if not result.dry_run:
        if result.verified:
            click.echo(style("verified", "green") + ": the environment matches the snapshot")
        else:
            click.echo(style("NOT verified", "red") + ": still differs from the snapshot:", err=True)
            for line in _diff_lines(result.remaining or {}):
                click.echo(line, err=True)


def _diff_lines(diff_json: dict) -> list[str]:
    """Text for a diff given as JSON (what plans and results carry)."""
    from envvault.commands.diff_text import render_text
    from envvault.diff import DiffResult, PackageChange, PackageRef

    if not diff_json:
        return []
    pk = diff_json.get("packages") or {}
    changed = []
    for c in pk.get("changed") or ():
        facts = c.get("build_facts") or {}
        changed.append(PackageChange(
            c["name"], c["old_version"], c["new_version"], c.get("kind", "build"), c.get("build_changed", False),
            c.get("old_build_id"), c.get("new_build_id"),
            {k: v[0] for k, v in facts.items()}, {k: v[1] for k, v in facts.items()},
            tuple(c.get("modified_files") or ()), tuple(c.get("missing_files") or ()),
            tuple(c.get("mode_files") or ()), tuple(c.get("put_back_files") or ()),
        ))
    result = DiffResult(
        diff_json.get("old", "old"), diff_json.get("new", "new"),
        tuple(PackageRef(p["name"], p["version"], p.get("build_id")) for p in pk.get("added") or ()),
        tuple(PackageRef(p["name"], p["version"], p.get("build_id")) for p in pk.get("removed") or ()),
        tuple(changed),
        {k: (v["old"], v["new"]) for k, v in (diff_json.get("python") or {}).items()},
    )
    text = render_text(result)
    return text.splitlines() if text else []


@cli.command()
@click.argument("snapshot_id")
@click.argument("name")
@click.pass_context
def tag(ctx, snapshot_id, name):
    """Name a snapshot (gc keeps tagged snapshots). Moves the tag if it exists.

    \b
    Examples:
      envvault tag latest known-good
    """
    vault = open_vault(ctx)
    sid = resolve_ref(vault, snapshot_id)
    with vault.lock():  # not while a gc runs: it reads the tags once, at its start, and may be dropping sid
        vault.snapshot_still_there(sid)
        was = vault.tags().get(name)
        vault.set_tag(name, sid)
    moved = f" (moved from {was[:12]})" if was not in (None, sid) else ""
    click.echo(f"tagged {style(sid[:12], 'yellow')} as {name}{moved}")


@cli.command()
@click.argument("name")
@click.pass_context
def untag(ctx, name):
    """Remove a tag (the snapshot stays).

    \b
    Examples:
      envvault untag known-good
    """
    vault = open_vault(ctx)
    vault.remove_tag(name)
    click.echo(f"removed tag {name}")


@cli.command()
@click.option("--keep-last", type=click.IntRange(min=0), default=None,
              help="Keep only the newest N snapshots of each environment (tagged ones always stay).")
@click.option("--dry-run", is_flag=True, help="Say what would be deleted; delete nothing.")
@json_option
@click.pass_context
def gc(ctx, keep_last, dry_run, as_json):
    """Delete snapshots beyond --keep-last and every object no kept snapshot needs.

    Safe while snaps run: it waits for them (they hold the vault lock shared, gc takes it exclusive). The
    snapshot a guard running on this machine would roll back to stays, as tagged ones do.

    \b
    Examples:
      envvault gc --keep-last 10 --dry-run
      envvault gc
    """
    from envvault.restore.baseline import environment_latests
    from envvault.vault.gc import collect_garbage

    vault = open_vault(ctx)
    result = collect_garbage(vault, keep_last=keep_last, dry_run=dry_run,
                             latests=lambda: environment_latests(vault))
    if as_json:
        emit_json(result.to_json())
        return
    click.echo(f"{'would remove' if dry_run else 'removed'} {len(result.removed_snapshots)} snapshot(s), "
               f"{result.removed_packs} pack(s), {'would rewrite' if dry_run else 'rewrote'} "
               f"{result.rewritten_packs}; {'would free' if dry_run else 'freed'} {human_bytes(result.freed_bytes)}; "
               f"{'would keep' if dry_run else 'kept'} {len(result.kept_snapshots)} snapshot(s)")
    if result.kept_for_guards:
        click.echo(f"{'would keep' if dry_run else 'kept'} {len(result.kept_for_guards)} snapshot(s) that a guard "
                   "running now may roll back to "
                   f"({', '.join(s[:12] for s in result.kept_for_guards)})", err=True)
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)
