"""inspect, torch install-hook, torch uninstall-hook: parse, call the library, render.

``inspect`` reads checkpoints without torch and without running anything from the file, and never opens
the vault.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from envvault.cli import PathType, cli
from envvault.commands.snapshots import json_option, venv_option
from envvault.output import emit_json, human_bytes, printable, style

if TYPE_CHECKING:
    from envvault.model.stamp import DriftChange, Stamp

COLLAPSE = 4  # a mapping of more tensors than this is shown as one line


@cli.command()
@click.argument("path", type=PathType(exists=False, path_type=Path))
@json_option
def inspect(path: Path, as_json: bool) -> None:
    """Show a checkpoint's stamp and everything in it but tensor data, without torch.

    Reads torch zip and legacy files, safetensors, distributed-checkpoint and Hugging Face directories.
    Nothing from the file is imported or run: tensors show as shape and dtype, other classes as inert
    records, and calls a pickle would make (os.system, eval, ...) are reported under findings.

    \b
    Examples:
      envvault inspect step_690.pt
      envvault inspect ckpt_dir/ --json | jq .stamp.snapshot
    """
    from envvault.torch.directories import read_checkpoint

    info = read_checkpoint(path)
    if as_json:
        emit_json(info.to_dict())
    else:
        _render(info, path)
    if Path(path).is_dir():
        _warn_mixed_stamps(Path(path))
    danger = sum(1 for f in info.findings if f.severity == "danger")
    if danger:
        click.echo(f"warning: {printable(str(path))} holds {danger} call(s) that would run code on torch.load(weights_only=False); "
                   "none ran here", err=True)


def _warn_mixed_stamps(d: Path) -> None:
    """A folder whose files name different snapshots: inspect shows one stamp; `restore` and `diff` refuse
    such a folder (``refs.stamped_parts``, the rule they read it by), so say so here too. Without the vault,
    only stamps that surely resolve apart count: other environments or lock-level fingerprints, or two full
    snapshots of one (a lock-only stamp may resolve to the full snapshot another file names)."""
    from envvault.refs import stamped_parts

    parts = stamped_parts(d)
    prints = {(stamp.fingerprint or stamp.snapshot, stamp.venv) for _, _, stamp in parts}
    full: dict = {}
    for _, _, stamp in parts:
        if stamp.snapshot and not stamp.snapshot_lock_only:
            full.setdefault((stamp.fingerprint, stamp.venv), set()).add(stamp.snapshot)
    named: dict[str, list[str]] = {}
    for name, _path, stamp in parts:
        which = stamp.snapshot[:12] if stamp.snapshot else f"fingerprint {(stamp.fingerprint or '?')[:12]}"
        named.setdefault(which, []).append(name)
    if len(named) <= 1 or (len(prints) <= 1 and all(len(ids) <= 1 for ids in full.values())):
        return
    listed = "; ".join(f"{', '.join(map(printable, names))} -> {which}" for which, names in named.items())
    click.echo(f"warning: {printable(str(d))}: its files are stamped with different snapshots ({listed}); `restore` "
               "and `diff` refuse this folder: name one file", err=True)


def _render(info, path: Path) -> None:
    t = info.tensors
    size = human_bytes(_size(path))
    dtypes = ", ".join(f"{k} x{v}" for k, v in sorted(t.dtypes.items()))
    click.echo(f"{style(printable(str(path)), 'bold')}: {info.format}, {size}; {t.count} tensors, "
               f"{human_bytes(t.bytes)}" + (f" ({dtypes})" if dtypes else ""))
    click.echo("")
    if info.stamp is None:
        click.echo("stamp: none (saved without envvault stamping)")
    else:
        click.echo(f"stamp ({printable(str(info.stamp_source))}):")
        for label, value in _stamp_lines(info.stamp):
            click.echo(f"  {label:<12} {value}")
    click.echo("")
    click.echo("content:")
    content = info.content
    if info.stamp_source == "key" and isinstance(content, dict):
        content = {k: v for k, v in content.items() if k != "envvault"}  # shown above
    # Every string below comes from the file: control characters (C1 and bidi ones too, which json.dumps
    # leaves as they are) are shown escaped, so that a file cannot move the cursor or hide a finding.
    click.echo(_indent(json.dumps(_readable(content), indent=2, ensure_ascii=False), "  "))
    for f in info.files:
        click.echo(f"file {printable(f.name)}: {printable(f.format)}, {human_bytes(f.size)}, {f.tensors.count} tensors"
                   + (", stamped" if f.stamp else ""))
    if info.findings:
        click.echo("")
        click.echo(style("findings", "red") + " (blocked: torch.load(weights_only=False) would run these):")
        for f in info.findings:
            click.echo(f"  {f.severity}: {printable(str(f))}")
    if info.notes:
        click.echo("")
        click.echo("notes:")
        for n in info.notes:
            click.echo(f"  {printable(n)}")


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def _stamp_lines(s: Stamp) -> list[tuple[str, str]]:
    lines = []
    if s.snapshot:
        lines.append(("snapshot", style(printable(s.snapshot), "yellow") + (" (lock-only)" if s.snapshot_lock_only else "")))
    else:
        lines.append(("snapshot", "none" + (f" (vault {printable(s.vault)})" if s.vault else "")))
    lines.append(("fingerprint", printable(s.fingerprint or "unknown")))
    lines.append(("torch", printable(f"{s.torch or 'not imported'}, cuda {s.cuda or 'none'}")))
    lines.append(("python", printable(f"{s.python}  {s.executable or ''}".rstrip())))
    lines.append(("venv", printable(str(s.venv))))
    lines.append(("host", printable(str(s.host))))
    lines.append(("time", printable(str(s.time))))
    lines.append(("argv", printable(" ".join(s.argv)) if s.argv is not None else "None"))
    lines.append(("cwd", printable(str(s.cwd))))
    if s.git is not None:
        dirty = {True: ", dirty", False: ", clean", None: ""}[s.git.dirty]
        branch = f" on {s.git.branch}" if s.git.branch else ""
        lines.append(("git", printable(f"{s.git.commit or 'no commit'}{branch}{dirty}  ({s.git.root})")))
    if s.env:
        lines.append(("env", printable(", ".join(f"{k}={v}" for k, v in s.env.items()))))
    if s.drift is not None:
        changed = printable(", ".join(_change(c) for c in s.drift.changed)) or "unknown distributions"
        lines.append(("drift", style(f"the environment on disk changed after the process started: {changed}", "red")))
    else:
        lines.append(("drift", "none"))
    for w in s.warnings:
        lines.append(("warning", printable(w)))
    for key in sorted(s.extra):
        lines.append((printable(key), printable(json.dumps(s.extra[key], ensure_ascii=False))))
    return lines


def _change(c: DriftChange) -> str:
    if c.old is None:
        return f"{c.name} {c.new} installed"
    if c.new is None:
        return f"{c.name} {c.old} removed"
    if c.old == c.new:
        return f"{c.name} {c.old} (other build)"
    return f"{c.name} {c.old} -> {c.new}"


def _is_tensor(v: Any) -> bool:
    return isinstance(v, dict) and "tensor" in v and "dtype" in v and set(v) <= {"tensor", "dtype", "kind", "device"}


def _readable(o: Any) -> Any:
    """Content for people: a tensor as one string, a mapping of many tensors as one line."""
    if _is_tensor(o):
        shape = o["tensor"]
        text = f"tensor{list(shape) if shape is not None else '[?]'} {o['dtype']}"
        if o.get("kind"):
            text += f" ({o['kind']})"
        if o.get("device"):
            text += f" on {o['device']}"
        return text
    if isinstance(o, dict):
        if len(o) > COLLAPSE and all(_is_tensor(v) for v in o.values()):
            return f"<{len(o)} tensors>"
        return {k: _readable(v) for k, v in o.items()}
    if isinstance(o, list):
        if len(o) > COLLAPSE and all(_is_tensor(v) for v in o):
            return f"<list of {len(o)} tensors>"
        return [_readable(v) for v in o]
    return o


def _indent(text: str, pad: str) -> str:
    return "\n".join(pad + printable(line) for line in text.split("\n"))  # not splitlines(): U+2028 is escaped


@cli.group("torch")
def torch_group() -> None:
    """Stamp every checkpoint a venv saves with the snapshot of its environment (zero code change).

    \b
    Examples:
      envvault torch install-hook --venv ~/venvs/train
      ENVVAULT_STAMP=1 ~/venvs/train/bin/python train.py
      envvault inspect checkpoints/step_690.pt
      envvault restore checkpoints/step_690.pt
    """



def _venv_of_hook(venv):
    """The venv the stamping hook goes into; a system environment (``--python``, or ``--venv`` of an
    interpreter's prefix) is refused in one line: its site directories are shared by every user of it."""
    from envvault.env.probe import find_target, system_of
    from envvault.errors import UsageError

    target = find_target(venv)
    if system_of(target) is not None:
        raise UsageError(f"the stamping hook goes into a virtual environment; {target} is a system Python's "
                         "installation (not supported yet): pass --venv with a venv")
    return target


@torch_group.command("install-hook")
@venv_option
@json_option
def install_hook_cmd(venv, as_json) -> None:
    """Add a .pth hook to a venv: with ENVVAULT_STAMP=1, every torch.save, safetensors save and distributed
    checkpoint of that venv's Python carries a stamp. Without the variable it costs nothing.

    When the venv has no envvault of its own, the hook links to this envvault and its dependencies (same
    Python ABI needed); they become importable only while stamping is on, after the venv's own packages.

    \b
    Examples:
      envvault torch install-hook --venv ~/venvs/train
    """
    from envvault.torch.hook import install_hook

    result = install_hook(_venv_of_hook(venv))
    if as_json:
        emit_json(result.to_json())
        return
    how = f"linking envvault from {result.libs}" if result.libs else "using the venv's own envvault"
    click.echo(f"installed {result.pth} ({how}); run training with ENVVAULT_STAMP=1 to stamp checkpoints")


@torch_group.command("uninstall-hook")
@venv_option
@json_option
def uninstall_hook_cmd(venv, as_json) -> None:
    """Remove the stamping hook from a venv (nothing to remove is not an error).

    \b
    Examples:
      envvault torch uninstall-hook --venv ~/venvs/train
    """
    from envvault.torch.hook import uninstall_hook

    result = uninstall_hook(_venv_of_hook(venv))
    if as_json:
        emit_json(result.to_json())
    elif result.removed:
        click.echo(f"removed {', '.join(result.removed)}")
    else:
        click.echo(f"no stamping hook in {result.venv}")
