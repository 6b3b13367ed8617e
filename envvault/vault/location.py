"""Where a vault is: ``default_vault_path`` for a local one (``--vault``, ``$ENVVAULT_HOME``, else
``$XDG_DATA_HOME/envvault``); URLs: ``s3://BUCKET[/PREFIX]`` opens a vault in a bucket (``envvault/vault/s3.py``);
anything else with a scheme, a malformed ``s3://`` URL, or ``s3://`` without the s3 extra is one line (exit 2),
never a local folder named ``s3:``. Imported by every command (``Vault.open``, the quick ``status``): stdlib
only, no client.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from envvault.errors import UsageError

__all__ = ["default_vault_path", "vault_url", "parse_s3_url", "S3Url", "have_client", "EXTRA_HINT", "command_for"]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
EXTRA_HINT = "install the s3 extra: pip install 'envvault[s3]'"


def default_vault_path(explicit: str | os.PathLike | None = None) -> Path:
    url = vault_url(explicit or os.environ.get("ENVVAULT_HOME") or None)  # H6: a URL is never a local folder
    if url:
        raise UsageError(f"{url} is not a local folder")
    if explicit:
        return Path(explicit).expanduser().absolute()
    if os.environ.get("ENVVAULT_HOME"):
        return Path(os.environ["ENVVAULT_HOME"]).expanduser().absolute()
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home).expanduser().absolute() / "envvault"


def command_for(location: str, *words: str) -> str:
    """The command line ``envvault WORDS`` a message tells the user to run on the vault at ``location``: with
    ``--vault LOCATION`` when a plain ``envvault`` (``$ENVVAULT_HOME``, else the default folder) would open
    another vault, so that a hint copied from a ``--vault`` run acts on the same vault."""
    import shlex

    try:
        default = vault_url(os.environ.get("ENVVAULT_HOME") or None) or str(default_vault_path())
    except UsageError:
        default = None
    flag = [] if location == default else ["--vault", location]
    return " ".join(["envvault", *map(shlex.quote, [*flag, *words])])


def vault_url(location: str | os.PathLike | None) -> str | None:
    """``location`` when it is a URL envvault opens (``s3://BUCKET[/PREFIX]``), None when it is a local path.

    A URL of another scheme, a malformed ``s3://`` URL, or ``s3://`` without the s3 extra installed is a
    UsageError (one line, exit 2): a URL never becomes a local folder named ``s3:``."""
    if location is None or isinstance(location, os.PathLike):
        return None
    text = str(location).strip()
    m = _SCHEME.match(text)
    if not m:
        return None
    scheme = m.group(1).lower()
    if scheme != "s3":
        raise UsageError(f"unsupported vault URL {_redact(text)!r}: envvault opens a local folder or "
                         "s3://BUCKET/PREFIX")
    parse_s3_url(text)
    if not have_client():
        raise UsageError(f"{_redact(text)} is an S3 vault and the S3 client is not installed; {EXTRA_HINT}")
    return text


class S3Url:
    __slots__ = ("bucket", "prefix")

    def __init__(self, bucket: str, prefix: str):
        self.bucket = bucket
        self.prefix = prefix  # "" or "a/b" (no leading or trailing slash)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


def parse_s3_url(text: str) -> S3Url:
    """``s3://BUCKET[/PREFIX]`` split and checked (UsageError naming the problem)."""
    m = _SCHEME.match(text)
    if not m or m.group(1).lower() != "s3":
        raise UsageError(f"{_redact(text)!r} is not an s3:// URL")
    rest = text[m.end():]
    if "@" in rest.split("/", 1)[0]:
        raise UsageError("an s3:// vault URL holds no credentials; set AWS_ACCESS_KEY_ID and "
                         "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE")
    if "?" in rest or "#" in rest:
        raise UsageError(f"vault URL {text!r}: query strings and fragments are not supported")
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise UsageError(f"vault URL {text!r}: {bucket!r} is not a valid bucket name (3-63 characters: "
                         "lowercase letters, digits, '.' and '-')")
    parts = [p for p in prefix.split("/") if p]
    if any(p in (".", "..") or "\0" in p for p in parts):
        raise UsageError(f"vault URL {text!r}: the prefix may not hold '.' or '..' parts")
    return S3Url(bucket, "/".join(parts))


def _redact(text: str) -> str:
    """A URL without anything that looks like credentials (user:password@)."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@", r"\1***@", text)


def have_client() -> bool:
    try:
        import obstore  # noqa: F401
    except ImportError:
        return False
    return True
