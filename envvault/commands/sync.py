"""sync: copy one vault's snapshots into another (a local folder or s3://BUCKET/PREFIX), incrementally."""

from __future__ import annotations

import click

from envvault.cli import cli
from envvault.output import emit_json, human_bytes
from envvault.vault.store import Vault


@cli.command("sync")
@click.argument("src")
@click.argument("dst")
@click.option("--dry-run", is_flag=True, help="Say what would be copied; copy nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def sync(src: str, dst: str, dry_run: bool, as_json: bool) -> None:
    """Copy into vault DST what vault SRC holds that DST lacks: packs, index files, snapshots, tags.

    Each side is a vault folder or s3://BUCKET/PREFIX. Only missing objects travel (names are content
    hashes); DST is made when absent. A sync cut off at any point leaves DST valid: run it again.

    \b
    Examples:
      envvault sync ~/.local/share/envvault s3://team-vault/envs     # push
      envvault sync s3://team-vault/envs ~/.local/share/envvault     # pull
    """
    from envvault.vault.sync import sync_vaults

    from envvault.errors import NotFoundError

    source = Vault.open(src)
    try:
        target = Vault.open(dst, create=not dry_run)
    except NotFoundError:  # a dry run into a vault not made yet: everything would travel
        target = None
    for v in (source, target):
        if v is not None:
            v.warn = lambda message: click.echo(f"envvault: warning: {message}", err=True)
    result = sync_vaults(source, target, dry_run=dry_run, dst_location=dst)
    for w in result.warnings:
        click.echo(f"envvault: warning: {w}", err=True)
    if as_json:
        emit_json(result.to_json())
        return
    verb = "would copy" if dry_run else "copied"
    click.echo(f"{verb} {result.snapshots} snapshot(s), {result.packs} pack(s) ({human_bytes(result.pack_bytes)}), "
               f"{result.index_files} index file(s), {result.tags} tag(s) from {source.location} to "
               f"{result.dst}; {result.already} snapshot(s) were there already")
