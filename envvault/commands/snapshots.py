"""snap, list, show, export, verify: parse, call the library, render."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from envvault.cli import PathType, cli, python_option as cli_python_option
from envvault.commands import plain
from envvault.env.probe import find_target
from envvault.model.snapshot import Host
from envvault.output import emit_json, human_bytes, printable, style
from envvault.vault.store import Vault

if TYPE_CHECKING:  # list's rows; status and restore, which import this module, never need them
    from envvault.model.heads import SnapshotHead

json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
_venv_only = click.option(
    "--venv", type=PathType(file_okay=False), help="The environment (default: $VIRTUAL_ENV)."
)


python_option = cli_python_option()


def venv_option(f):
    """``--venv`` and ``--python`` (docs/cli.md; the latter reaches ``find_target`` through ``choose_python``)."""
    return _venv_only(python_option(f))


def open_vault(ctx: click.Context, create: bool = False) -> Vault:
    """The vault of ``--vault``; documents it skips (a malformed snapshot, a bad tag) are warned about on stderr."""
    return plain.open_vault(ctx.obj.get("vault_path"), create=create)


def snapshot_row(sid: str, head: SnapshotHead) -> dict:
    return {"id": sid, "short_id": sid[:12], **head.to_dict()}


@cli.command()
@venv_option
@click.option("-m", "--message", default="", help="A note stored with the snapshot.")
@click.option("--lock-only", is_flag=True, help="Record the exact lockfile and hashes only; store no files.")
@click.option("--no-caches", is_flag=True, help="Do not archive torch.compile / Triton caches.")
@click.option("--cache-dir", "cache_dirs", multiple=True, type=PathType(file_okay=False),
              help="Another cache directory to archive (repeatable).")
@json_option
@click.pass_context
def snap(ctx, venv, message, lock_only, no_caches, cache_dirs, as_json):
    """Freeze an environment: exact lockfile plus every installed file, into the vault.

    \b
    Examples:
      envvault snap -m "before installing sglang"
      envvault snap --venv ~/venvs/train --lock-only
    """
    plain.snap(ctx.obj.get("vault_path"), venv, message, lock_only, no_caches, cache_dirs, as_json)


@cli.command("list")
@venv_option
@click.option("--all", "show_all", is_flag=True, help="Snapshots of every environment (default: --venv or $VIRTUAL_ENV, else all).")
@json_option
@click.pass_context
def list_(ctx, venv, show_all, as_json):
    """List snapshots, newest first.

    \b
    Examples:
      envvault list
      envvault list --venv ~/venvs/train --json
    """
    from envvault.vault.heads import snapshot_heads

    vault = open_vault(ctx)
    snaps = snapshot_heads(vault)
    from envvault.env.probe import chosen_python, system_interpreter

    if not show_all and (venv or chosen_python() or _active_venv()):  # --python: that system environment's
        target = find_target(venv)
        who = system_interpreter(target)  # interpreters sharing a root each list their own (helper 31)
        snaps = [(sid, h) for sid, h in snaps if h.venv == str(target) and (who is None or h.interpreter == who)]
    tags_by_id: dict[str, list[str]] = {}
    for name, sid in vault.tags().items():
        tags_by_id.setdefault(sid, []).append(name)
    rows = []
    for sid, head in snaps:
        row = snapshot_row(sid, head)
        row["tags"] = sorted(tags_by_id.get(sid, []))
        rows.append(row)
    if as_json:
        emit_json({"snapshots": rows})
        return
    if not rows:
        scope = () if show_all else ("--python", chosen_python()) if chosen_python() else ("--venv", venv) if venv else ()
        click.echo(f"no snapshots yet; run `{vault.command('snap', *scope)}`", err=True)
        return
    for r in rows:
        tags = f" [{', '.join(r['tags'])}]" if r["tags"] else ""
        torch = f" torch {r['torch']}" if r["torch"] else ""
        lock = " lock-only" if r["lock_only"] else ""
        py = f"py{r['python']}" if r["python"] else "caches"
        click.echo(
            f"{style(r['short_id'], 'yellow')}  {r['created'][:19].replace('T', ' ')}  {py:<9}  "
            f"{r['packages']:>4} pkgs{torch}{lock}  +{human_bytes(r['new_bytes'] or 0)}  {printable(r['message'])}{tags}"
        )


def _active_venv() -> bool:
    import os

    from envvault.env.probe import chosen_python
    return bool(os.environ.get("VIRTUAL_ENV") or chosen_python())


@cli.command()
@click.argument("snapshot_id")
@json_option
@click.pass_context
def show(ctx, snapshot_id, as_json):
    """Show one snapshot: interpreter, host, packages.

    \b
    Examples:
      envvault show latest
      envvault show 3fa9c2 --json
    """
    vault = open_vault(ctx)
    ref = vault.load_snapshot(resolve_ref(vault, snapshot_id))
    snap = ref.snapshot
    if as_json:
        emit_json({"id": ref.id, **snap.to_dict()})
        return
    py = snap.python
    host = snap.host or Host()
    click.echo(f"snapshot {style(ref.id, 'yellow')}")
    # A snapshot may be anyone's: its texts are printed with control characters escaped (a terminal obeys them).
    click.echo(printable(f"created  {snap.created}  ({snap.trigger})  {snap.message}"))
    click.echo(printable(f"venv     {snap.venv}"))
    if py.version:
        click.echo(f"python   {py.implementation} {py.version} {py.abi} {py.platform}")
    else:
        click.echo("python   (a cache-only snapshot)")
    gpus = ", ".join(g.name for g in host.gpus or ()) or "no GPU seen"
    click.echo(printable(f"host     {host.hostname} {host.os} {host.arch} glibc {host.glibc}; {gpus}"
                         + (f"; driver {host.driver}" if host.driver else "")))
    if snap.env:
        click.echo(printable("env      " + " ".join(f"{k}={v}" for k, v in snap.env.items())))
    click.echo(f"packages {len(snap.packages)}" + (" (lock only)" if snap.lock_only else ""))
    for p in snap.packages:
        extra = ""
        info = p.build_info or {}
        if info:
            extra = "  " + " ".join(f"{k}={v}" for k, v in info.items() if v not in (None, False))
        mod = style(f"  {len(p.modified)} file(s) edited in place", "red") if p.modified else ""
        click.echo(f"  {printable(f'{p.name:<32} {p.version:<22} build {p.build_id[:12]}{extra}')}{mod}")
    for c in snap.caches or ():
        click.echo(printable(f"cache    {c.kind or None} {c.root or None}: "
                             f"{c.files if 'files' not in c.absent else None} files, {human_bytes(c.bytes)}"))
    for w in snap.warnings:
        click.echo(printable(f"warning  {w}"))


def resolve_ref(vault: Vault, ref: str, venv: str | None = None) -> str:
    """Resolve an id/prefix/tag/latest (``refs.resolve_name``: ``latest`` of the environment in scope, ``venv``
    the command's ``--venv``). Other areas (checkpoints, pylock paths) extend diff/restore."""
    from envvault.refs import resolve_name

    return resolve_name(vault, ref, venv)


@cli.command()
@click.argument("snapshot_id")
@click.option("-o", "--output", type=PathType(dir_okay=False), help="Where to write (default: pylock.toml or requirements.txt).")
@click.option("--format", "fmt", type=click.Choice(["pylock", "requirements"]), default="pylock", show_default=True)
@click.option("--no-wheels", is_flag=True, help="pylock only: do not rebuild wheels from the vault.")
@venv_option
@json_option
@click.pass_context
def export(ctx, snapshot_id, output, fmt, no_wheels, venv, as_json):
    """Export a snapshot as a PEP 751 pylock.toml (with rebuilt wheels) or requirements.txt.

    `latest` is that of --venv (else the active venv), as for restore and diff.

    \b
    Examples:
      envvault export latest -o pylock.toml      # then: uv pip sync --offline pylock.toml
      envvault export 3fa9c2 --format requirements -o requirements.txt
    """
    from envvault.lock.export import export_snapshot
    from envvault.refs import environment_snapshot

    vault = open_vault(ctx)
    sid = resolve_ref(vault, snapshot_id, venv)
    environment_snapshot(vault, sid, snapshot_id)
    out = Path(output or ("pylock.toml" if fmt == "pylock" else "requirements.txt")).absolute()
    result = export_snapshot(vault, sid, out, fmt=fmt, wheels=not no_wheels)
    if as_json:
        emit_json(result)
        return
    click.echo(f"wrote {result['path']} ({result['packages']} packages" +
               (f", {result['wheels']} wheels in {result['wheel_dir']})" if result.get("wheels") else ")"))
    for w in result.get("warnings", ()):
        click.echo(f"warning: {w}", err=True)


@cli.command()
@click.option("--snapshot", "snapshot_ids", multiple=True, help="Verify only these snapshots (default: all).")
@click.option("--read-data", is_flag=True, help="Also read every pack frame the snapshots use and re-hash every object.")
@json_option
@click.pass_context
def verify(ctx, snapshot_ids, read_data, as_json):
    """Check that every snapshot, manifest and referenced object is there (and, with --read-data, intact);
    exit 5 if anything is damaged or missing.

    \b
    Examples:
      envvault verify
      envvault verify --read-data --json
    """
    from envvault.vault.verify import verify_vault

    vault = open_vault(ctx)
    ids = [resolve_ref(vault, s) for s in snapshot_ids] or None
    report = verify_vault(vault, ids, read_data=read_data)
    if as_json:
        emit_json(report)
    else:
        click.echo(
            f"checked {report['snapshots']} snapshots, {report['objects']} objects "
            + (f"(read and re-hashed {human_bytes(report['bytes'])})" if read_data else "(structure; --read-data re-hashes the data)")
            + ": " + (style("ok", "green") if report["ok"] else style("DAMAGED", "red"))
        )
        for p in report["problems"]:
            broken = ", ".join(s[:12] for s in p["snapshots"]) or "none"
            click.echo(f"  {p['object'][:12]} {p['problem']}; breaks snapshots: {broken}")
    if not report["ok"]:
        sys.exit(5)
