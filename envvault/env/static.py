"""What an environment's files say, read without running or importing any of its code: which dist-info
installs a package, that distribution's build id from its RECORD alone, and the literal constants of a
module (``torch/version.py``, ``triton/__init__.py``). Cache fingerprints are made of these."""

from __future__ import annotations

from pathlib import Path

from ..errors import CorruptError, EnvironmentProblem
from ..model.identity import DistLayout, build_id
from ..model.record import parse_record
from ..vault.fsutil import read_regular

__all__ = ["find_dist_info", "record_digest", "module_constants", "read_env_file", "WHOLE_FILE_LIMIT"]

# A file read whole into memory, from an environment (a dist-info file, a module read for its constants) or
# from a vault (``materialize.stored_bytes``: a RECORD, a script to rewrite, a provenance file, entry points):
# up to this size (torch's RECORD is about 2 MB).
WHOLE_FILE_LIMIT = 64 << 20


def read_env_file(path: Path | str) -> bytes:
    """The bytes of a file of an environment read whole (a dist-info file, a module read for its constants):
    a FIFO, a device or a file over 64 MiB is a CorruptError, never waited on or read whole (a site folder may
    be writable by others); symlinks are followed, as an environment's files may be links. The one rule for
    those reads (``dists.py``, the guard's, the restore's)."""
    path = Path(path)
    return read_regular(path, WHOLE_FILE_LIMIT, f"{path.parent.name}/{path.name}", follow=True)


def _record_bytes(dist_info: Path) -> bytes:
    return read_env_file(dist_info / "RECORD")


def _universal_newlines(text: str) -> str:
    """``text`` as a file opened in text mode reads it: every ``\r\n`` and lone ``\r`` a ``\n``."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def find_dist_info(site: Path, package: str) -> Path | None:
    """The ``.dist-info`` folder whose RECORD installs ``<package>/__init__.py``; None when absent."""
    wanted = f"{package}/__init__.py,"
    infos = sorted(site.glob("*.dist-info"))
    # Name-based guesses first (torch, triton, pytorch_triton ...), then every other dist-info.
    infos.sort(key=lambda p: package not in p.name.lower())
    for info in infos:
        try:
            text = _universal_newlines(_record_bytes(info).decode("utf-8", errors="replace"))
        except (OSError, CorruptError):
            continue
        if text.startswith(wanted) or f"\n{wanted}" in text:
            return info
    return None


def record_digest(dist_info: Path) -> str:
    """The distribution's build id (``envvault.model.identity.build_id``): BLAKE3 over the sorted RECORD
    lines of the wheel's own files, so pip and uv installs of one wheel give the same digest and another
    build of the same version does not."""
    try:
        text = _record_bytes(dist_info).decode("utf-8")
    except (OSError, CorruptError, UnicodeDecodeError) as exc:
        raise EnvironmentProblem(f"cannot read {dist_info / 'RECORD'}: {exc}") from exc
    # The id has always been taken over the rows of the text with its newlines translated (a lone CR ends a
    # row; a CRLF inside a quoted path is one LF). Only a lone CR or a quoted field can make those rows differ
    # from the untranslated text's, which the scan parses: otherwise that text is parsed, and the parse shared.
    if "\r" in text and ('"' in text or "\r" in text.replace("\r\n", "")):
        text = _universal_newlines(text)
    entries, _problems = parse_record(text)  # garbled rows are the snapshot's to report
    return build_id(entries, DistLayout(dist_info.name))


def module_constants(path: Path, names: set[str]) -> dict[str, object]:
    """Top-level ``NAME = <literal>`` (or annotated) assignments of a Python file, read without running it."""
    import ast  # here: a cache restore that checks no fingerprint need not load the parser (2 ms)

    try:  # a FIFO or a device put there is never waited on, a huge file never read
        tree = ast.parse(read_env_file(path), filename=str(path))
    except (OSError, CorruptError, SyntaxError, ValueError) as exc:
        raise EnvironmentProblem(f"cannot parse {path}: {exc}") from exc
    found: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name) and target.id in names:
                try:
                    found[target.id] = ast.literal_eval(value)
                except ValueError:
                    pass
    return found
