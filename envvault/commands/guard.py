"""guard and shell-hook: parse, call the library, render."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from envvault.cli import PathType, cli, python_option as cli_python_option
from envvault.errors import RefusedError, UsageError, Terminated
from envvault.output import emit_json, style


python_option = cli_python_option(
    "Guard the installation this interpreter sees (a system Python: pip install --user, sudo pip).")

_KIND_WORDS = {
    "add": ("add", "green"),
    "remove": ("remove", "red"),
    "upgrade": ("upgrade", "yellow"),
    "downgrade": ("downgrade", "yellow"),
    "swap": ("SWAP", "red"),
    "reinstall": ("reinstall", "dim"),
}


def _say(text: str) -> None:
    click.echo(f"{style('envvault', 'bold', _colour())}: {text}", err=True)


def _colour() -> bool:
    from envvault.output import use_colour

    return use_colour(sys.stderr)


def change_line(change, pattern: str | None) -> str:
    word, tint = _KIND_WORDS[change.kind]
    c = _colour()
    if change.kind == "add":
        what = f"{change.name} {change.new}"
    elif change.kind == "remove":
        what = f"{change.name} {change.old}"
    else:
        what = f"{change.name} {change.old} -> {change.new}"
    note = ""
    if change.kind == "swap":
        note = "  another build of the same release" if change.old != change.new else "  same version, another build"
    elif change.kind == "reinstall":
        note = {True: "  same build", None: "  build not known before it runs"}.get(change.same_build, "")
    prot = f"  [{style('protected', 'red', c)}: {pattern}]" if pattern else ""
    return f"    {style(f'{word:<10}', tint, c)}{what}{note}{prot}"


class _CliUI:
    """The guard's voice on the terminal: stderr only, so the command's stdout stays its own."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def note(self, text: str) -> None:
        _say(text)

    def show_plan(self, plan, protected, target: Path, before: str) -> None:
        if self.as_json:
            return
        _say(f"snapshot {style(before[:12], 'yellow', _colour())} of {target} taken")
        if not plan.known:
            _say(f"no plan ({plan.error}); guard will judge the result")
            return
        if not plan.changes:
            _say(f"plan ({plan.source}): nothing would change")
            return
        marks = {c.name: pat for c, pat in protected}
        _say(f"plan ({plan.source}):")
        same = [c for c in plan.changes if c.kind == "reinstall" and c.same_build is True and c.name not in marks]
        for c in plan.changes:
            if c not in same:
                click.echo(change_line(c, marks.get(c.name)), err=True)
        if same:
            word, tint = _KIND_WORDS["reinstall"]
            click.echo(f"    {style(f'{word:<10}', tint, _colour())}{len(same)} package(s), the same builds", err=True)

    def confirm(self, question: str, default: bool) -> bool:
        try:
            return click.confirm(f"envvault: {question}", default=default, err=True)
        except click.exceptions.Abort as err:
            if Terminated.behind(err):  # SIGTERM is no answer: guard ends as terminated
                raise
            click.echo("", err=True)
            return False
        except OSError:  # the terminal hung up while the question waited for its answer (EIO): no answer
            return False

    def show_diff(self, diff, before: str, after: str) -> None:
        if self.as_json:
            return
        from envvault.commands.diff_text import render_text

        if diff.environment_empty:
            _say(f"snapshot {after[:12]} taken: nothing changed")
            return
        _say(f"snapshot {style(after[:12], 'yellow', _colour())} taken; what changed:")
        click.echo("\n".join("    " + line for line in render_text(diff, colour=_colour()).splitlines()), err=True)


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--protect", "protect", multiple=True, metavar="NAME",
              help="Also protect NAME (repeatable; shell patterns such as 'vllm*' work).")
@click.option("--unprotect", "unprotect", multiple=True, metavar="NAME", help="Do not protect NAME (repeatable).")
@click.option("-y", "--yes", is_flag=True, help="Allow changes to protected packages without asking.")
@click.option("--no-restore", is_flag=True, help="Keep whatever a failed or refused command left, for inspection.")
@click.option("--venv", type=PathType(file_okay=False),
              help="The environment (default: the one the command's pip or uv would change).")
@python_option
@click.option("--save", type=click.Choice(["vault", "venv"]),
              help="Remember --protect/--unprotect in the vault's settings or in <venv>/.envvault.toml.")
@click.option("--show-protected", is_flag=True, help="Print the protected names and where each comes from.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON document on stdout (the command's own stdout goes to stderr).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def guard(ctx, protect, unprotect, yes, no_restore, venv, save, show_protected, as_json, command):
    """Snapshot, show the plan, ask before touching torch & co., run COMMAND, roll back if it fails.

    For pip, pip3, python -m pip, uv pip, uv add/remove and uv sync, guard asks the tool for its plan first
    and shows what would be removed, downgraded, upgraded or swapped for another build. A change to a
    protected package (torch, torchvision, torchaudio, triton, nvidia-*, jax, jaxlib, flash-attn, xformers,
    plus your own) needs a yes on a terminal; without one guard exits 3 unless --yes. Exit code: the
    command's own, or 3 when guard refused.

    \b
    Examples:
      envvault guard -- pip install vllm
      envvault guard --yes -- uv pip install -r requirements.txt
      envvault guard --protect 'vllm*' --save venv
      envvault guard --show-protected
    """
    from envvault.guard.run import GuardOptions
    from envvault.guard.run import guard as run_guard

    vault_path = ctx.obj.get("vault_path")
    if save or show_protected or not command:
        if not (save or show_protected):
            raise UsageError("no command given: envvault guard -- pip install ...")
        from envvault.env.probe import find_target
        from envvault.guard.protect import load_protection, save_vault_protection, save_venv_protection
        from envvault.vault.store import Vault

        target = find_target(venv) if (venv or save == "venv" or _active()) else None
        vault = Vault.open(vault_path, create=bool(save))
        if save == "vault":
            save_vault_protection(vault, protect=protect, unprotect=unprotect)
        elif save == "venv":
            save_venv_protection(target, protect=protect, unprotect=unprotect)
        if save:
            protect, unprotect = (), ()
        prot = load_protection(vault.settings(), target, protect, unprotect)
        if as_json:
            emit_json(dict(prot.to_json(), venv=str(target) if target else None))
        else:
            for pattern, source in prot.patterns:
                click.echo(f"{pattern:<24} {source}")
            click.echo(f"keep {prot.keep} guard snapshots per environment")
        if not command:
            return
    options = GuardOptions(protect=tuple(protect), unprotect=tuple(unprotect), yes=yes, restore=not no_restore,
                           interactive=sys.stdin.isatty(), venv=Path(venv) if venv else None,
                           quiet_command=as_json)
    result = run_guard(list(command), options, _CliUI(as_json), vault_path=vault_path)
    if as_json:
        emit_json(result.to_json())
    else:
        _render_outcome(result)
    if result.restore_error is not None:
        raise result.restore_error
    if result.outcome in ("refused", "declined") and result.exit_code == 3:
        raise RefusedError(result.reason or "refused")
    sys.exit(result.exit_code)


def _active() -> bool:
    import os

    return bool(os.environ.get("VIRTUAL_ENV"))


def _render_outcome(result) -> None:
    if result.outcome == "passthrough" or result.before is None:
        return
    from envvault.vault.location import command_for

    c = _colour()
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)
    if result.restored_to:
        _say(style(f"restored snapshot {result.restored_to[:12]}", "green", c) + f" ({result.reason})")
        if result.after:
            _say(f"what the command left is snapshot {result.after[:12]}: "
                 + command_for(result.vault, "restore", result.after[:12]))
    elif result.outcome in ("ran", "failed") and result.diff is not None and not result.diff.environment_empty:
        _say("undo with: " + command_for(result.vault, "restore", result.before[:12]))


@cli.command("shell-hook")
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def shell_hook(shell):
    """Print shell code that sends pip / uv pip installs through `envvault guard` in an active venv.

    ENVVAULT_DISABLE=1 turns the hook off for a command or a session.

    \b
    Examples:
      eval "$(envvault shell-hook bash)"      # in ~/.bashrc
      eval "$(envvault shell-hook zsh)"       # in ~/.zshrc
      envvault shell-hook fish | source       # in ~/.config/fish/config.fish
    """
    from envvault.guard.hook import hook_code

    click.echo(hook_code(shell), nl=False)
