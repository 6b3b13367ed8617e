"""cache snap / list / restore / diff: parse, call the library, render."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from envvault.cli import PathType, cli, python_option
from envvault.commands import plain
from envvault.output import emit_json, human_bytes, style

json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
_venv_only = click.option(
    "--venv", type=PathType(file_okay=False),
    help="The environment that uses the caches, for their fingerprint (default: $VIRTUAL_ENV).",
)  # fmt: skip


def venv_option(f):
    """``--venv`` and ``--python`` (a system Python's installation: ``find_target`` takes it)."""
    return _venv_only(python_option()(f))


def _vault(ctx: click.Context, create: bool = False):
    from envvault.vault.store import Vault

    return Vault.open(ctx.obj.get("vault_path"), create=create)


def _built_by(fp: dict | None) -> str:
    if not fp:
        return "builder unknown"
    torch = (fp.get("torch") or {}).get("version")
    triton = (fp.get("triton") or {}).get("version")
    gpus = sorted({g.get("name") for g in fp.get("gpus") or () if g.get("name")})
    words = [f"torch {torch}" if torch else "torch ?"]
    if triton:
        words.append(f"triton {triton}")
    words.append(", ".join(gpus) if gpus else "no GPU" if fp.get("gpus") == [] else "")
    if fp.get("python"):
        words.append(f"py{fp['python']}")
    return " ".join(w for w in words if w)


def _entries(counts: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "empty"


@cli.group("cache")
def cache() -> None:
    """Archive and restore torch.compile, Triton, torch-extension and CUDA JIT caches.

    \b
    Examples:
      envvault cache snap -m "warm flex cache"
      envvault cache list
      envvault cache restore latest --venv ~/venvs/train
      envvault cache diff 3fa9c2 latest
    """


@cache.command("snap")
@venv_option
@click.option("-m", "--message", default="", help="A note stored with the snapshot.")
@click.option("--cache-dir", "cache_dirs", multiple=True, type=PathType(file_okay=False),
              help="Another cache directory to archive (repeatable).")
@click.option("--no-discover", is_flag=True,
              help="Archive only the --cache-dir directories, not the ones torch and Triton would use.")
@click.option("--remember", type=click.Choice(["vault", "venv"]),
              help="Also keep the --cache-dir directories in the vault's (or the venv's) settings for later snaps.")
@click.option("--ask-torch", is_flag=True,
              help="Ask the venv's torch where Inductor's cache is (imports part of torch; slower, exact).")
@json_option
@click.pass_context
def cache_snap(ctx, venv, message, cache_dirs, no_discover, remember, ask_torch, as_json):
    """Archive the compile caches alone (no packages) into the vault.

    Takes the caches a process started now would use: $TORCHINDUCTOR_CACHE_DIR (else the temp dir's
    torchinductor_<user>), Triton's, torch extensions', CUDA's JIT cache, plus --cache-dir and the
    configured directories. locks/ and files being written (*.tmp) are left out.

    \b
    Examples:
      envvault cache snap -m "after warmup"
      TORCHINDUCTOR_CACHE_DIR=/data/ic envvault cache snap --venv ~/venvs/train
      envvault cache snap --no-discover --cache-dir ~/my-kernels --remember vault
    """
    from envvault.caches.snap import take_cache_snapshot

    target = plain.cache_target(venv)
    vault = _vault(ctx, create=True)
    dirs = [Path(d) for d in cache_dirs]
    if remember and dirs:
        from envvault.caches.config import remember_dirs

        remember_dirs(vault, dirs, where=remember, venv=target)
    python = None
    if ask_torch:
        from envvault.errors import UsageError

        if target is None:
            raise UsageError("--ask-torch needs --venv PATH or an active virtual environment")
        from envvault.env.probe import system_of

        system = system_of(target)
        python = system[0] if system is not None else target / "bin" / "python"
    result = take_cache_snapshot(vault, venv=target, extra_dirs=dirs, discover=not no_discover, message=message,
                                 use_torch_python=python)
    if as_json:
        emit_json(result.to_json())
        return
    d = result.to_json()
    click.echo(f"cache snapshot {style(d['short_id'], 'yellow')}: {len(d['caches'])} cache(s), "
               f"{human_bytes(d['new_bytes'])} new in the vault, {d['seconds']:.2f}s")
    for c in d["caches"]:
        click.echo(f"  {c['kind']:<16} {c['root']}  {c['files']} files ({human_bytes(c['bytes'])})  "
                   f"{_entries(c.get('entries') or {})}  [{_built_by(c.get('fingerprint'))}]")
    plain.warn(d["warnings"])


@cache.command("list")
@click.argument("snapshot_id", required=False)
@click.option("--where", is_flag=True, help="Also list where the caches are now and which rule chose each place.")
@venv_option
@json_option
@click.pass_context
def cache_list(ctx, snapshot_id, where, venv, as_json):
    """List archived caches (newest first), or the caches of one snapshot.

    \b
    Examples:
      envvault cache list
      envvault cache list --where
      envvault cache list 3fa9c2 --json
    """
    from envvault.caches.config import configured_dirs

    vault = _vault(ctx)
    doc: dict = {}
    if where:
        from envvault.caches.discover import discover_caches, usable_kinds
        from envvault.caches.roots import locations_to_snap

        target = plain.cache_target(venv)
        extra = configured_dirs(vault.settings(), target)
        found = discover_caches(os.environ, extra)
        # what `envvault snap` of that environment would take: only the caches it can use
        taken = locations_to_snap(os.environ, extra, kinds=usable_kinds(target) if target else None)
        found += [loc for loc in taken if all(loc.path != f.path for f in found)]
        doc["locations"] = [{"kind": loc.kind, "path": str(loc.path), "exists": loc.exists, "reason": loc.reason,
                             "archived_by_snap": any(t.path == loc.path for t in taken)} for loc in found]
    snaps = [vault.load_snapshot(plain.resolve_caches(vault, snapshot_id))] if snapshot_id else vault.snapshots()
    rows = []
    for s in snaps:
        for entry in s.snapshot.caches or ():
            c = entry.to_dict()
            rows.append({"snapshot": s.id, "short_id": s.id[:12], "created": s.snapshot.created,
                         "message": s.snapshot.message, **{k: c.get(k) for k in (
                             "kind", "root", "manifest", "files", "bytes", "entries", "fingerprint", "warnings")}})
    doc["caches"] = rows
    if as_json:
        emit_json(doc)
        return
    for loc in doc.get("locations", ()):
        state = "archived by snap" if loc["archived_by_snap"] else ("exists" if loc["exists"] else "absent")
        click.echo(f"{loc['kind']:<16} {loc['path']}  ({state}; {loc['reason']})")
    if where and rows:
        click.echo("")
    if not rows and not where:
        click.echo("no archived caches; run `envvault cache snap` (or `envvault snap`)", err=True)
    for r in rows:
        click.echo(f"{style(r['short_id'], 'yellow')}  {(r['created'] or '')[:19].replace('T', ' ')}  {r['kind']:<16} "
                   f"{r['root']}  {r['files']} files ({human_bytes(r['bytes'] or 0)})  "
                   f"{_entries(r.get('entries') or {})}  [{_built_by(r.get('fingerprint'))}]")
        if snapshot_id:
            plain.warn(r.get("warnings") or ())


@cache.command("restore")
@click.argument("snapshot_id", default="latest")
@venv_option
@click.option("--kind", "kinds", multiple=True, help="Only caches of this kind (inductor, triton, ...; repeatable).")
@click.option("--root", "roots", multiple=True, help="Only the cache archived from this directory (repeatable).")
@click.option("--to", "to", type=PathType(file_okay=False), help="Restore the (one) selected cache here instead.")
@click.option("--merge/--replace", "merge", default=True, show_default=True,
              help="merge: add what is missing, never overwrite; replace: make the directory hold exactly the archive.")
@click.option("--archived-roots", is_flag=True,
              help="Restore to the directories the caches were archived from even where this environment would "
                   "not look for caches (trusts the snapshot).")
@click.option("--dry-run", is_flag=True, help="Say what would be written; change nothing.")
@json_option
@click.pass_context
def cache_restore(ctx, snapshot_id, venv, kinds, roots, to, merge, archived_roots, dry_run, as_json):
    """Put archived caches back where they were (or --to a directory), staged then renamed into place.

    A cache goes back where it was archived from when that is one of this environment's cache directories
    (where torch, Triton and CUDA look now, or a configured one); otherwise pass --to or --archived-roots.
    The caches' fingerprints are compared with the environment (--venv or $VIRTUAL_ENV): a torch, Triton,
    CUDA, GPU or Python that differs from the one that built a cache makes torch ignore it, and each such
    component is named in a warning.

    \b
    Examples:
      envvault cache restore                      # newest snapshot with caches, merge
      envvault cache restore 3fa9c2 --venv ~/venvs/train --replace
      envvault cache restore latest --kind inductor --to /data/inductor-cache --dry-run
    """
    plain.cache_restore(ctx.obj.get("vault_path"), snapshot_id, venv, kinds, roots, to, merge, archived_roots,
                        dry_run, as_json)


@cache.command("diff")
@click.argument("a")
@click.argument("b")
@click.option("--all", "show_all", is_flag=True, help="List every differing entry (default: the first 10 of each).")
@json_option
@click.pass_context
def cache_diff(ctx, a, b, show_all, as_json):
    """Show the caches of two snapshots side by side: fingerprints, then entries only in A, only in B, changed.

    \b
    Examples:
      envvault cache diff 3fa9c2 latest
      envvault cache diff before-upgrade after-upgrade --json
    """
    from envvault.caches.diff import diff_caches

    vault = _vault(ctx)
    sa, sb = plain.resolve_caches(vault, a), plain.resolve_caches(vault, b)  # ``latest``: the newest with caches
    result = diff_caches(vault, vault.load_snapshot(sa).snapshot, vault.load_snapshot(sb).snapshot,
                         label_a=sa[:12], label_b=sb[:12])
    if as_json:
        emit_json({"a_id": sa, "b_id": sb, **result.to_json()})
        return
    if not result.pairs:
        click.echo("neither snapshot holds caches")
        return
    limit = None if show_all else 10
    for p in result.pairs:
        click.echo(style(f"{p.kind} cache", "bold") + f"  A: {p.root_a or '-'}  B: {p.root_b or '-'}")
        width = max([len(r.label) for r in p.fingerprint] + [7])
        click.echo(f"  {'':<{width}}  {'A ' + result.a:<40}  B {result.b}")
        for r in p.fingerprint:
            mark = style(" *", "red") if r.differs else ""
            click.echo(f"  {r.label:<{width}}  {str(r.a or '-'):<40}  {r.b or '-'}{mark}")
        click.echo(f"  {'entries':<{width}}  {_entries(p.entries_a):<40}  {_entries(p.entries_b)}")
        click.echo(f"  {len(p.only_a)} only in A, {len(p.only_b)} only in B, {len(p.changed)} changed, {p.same} the same")
        for label, keys in (("only in A", p.only_a), ("only in B", p.only_b), ("changed", p.changed)):
            for k in keys[:limit]:
                click.echo(f"    {label}: {k}")
            if limit is not None and len(keys) > limit:
                click.echo(f"    ... and {len(keys) - limit} more {label} (--all)")
    if result.empty:
        click.echo("the caches are the same")
    sys.stdout.flush()
