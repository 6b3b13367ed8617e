"""A vault's ``config.json`` (docs/format.md, "config.json"): written once by the first creator, read and
gated by format on every open."""

from __future__ import annotations

import json
import os

from envvault.errors import CorruptError, NotFoundError, StorageError, UsageError
from envvault.model.encoding import parse_json, utc_timestamp
from envvault.vault.backend import Backend, Missing, ReadFailed

__all__ = ["FORMAT", "MAX_SMALL_DOC", "write_config", "read_config", "check_config", "open_local"]

FORMAT = 1
MAX_SMALL_DOC = 1 << 20  # config.json, settings.json


def write_config(backend: Backend) -> None:
    """Write a new vault's config, once: two creators race, one config wins."""
    cfg = {
        "format": FORMAT,
        "vault_id": os.urandom(16).hex(),
        "created": utc_timestamp(),
        "zstd_level": 3,
        "zstd_level_large": 2,
    }
    backend.save("config", "config", json.dumps(cfg, indent=1).encode(), exclusive=True)


def read_config(backend: Backend) -> dict | None:
    """The parsed config, or None when it is not a JSON object with an integer format."""
    where = backend.where("config", "config")
    try:
        config = parse_json(backend.load("config", "config", limit=MAX_SMALL_DOC), where)
    except ReadFailed as err:
        raise StorageError(f"cannot read {where}: {err.why}") from None
    except Missing:
        raise StorageError(f"cannot read {where}: No such file or directory") from None
    except CorruptError:
        return None
    if not isinstance(config, dict) or type(config.get("format")) is not int:
        return None
    return config


def check_config(backend: Backend, config: dict | None) -> dict:
    """``config`` when this envvault reads its format: a CorruptError when it is no config, a UsageError when
    a newer envvault wrote it."""
    if config is None:
        raise CorruptError(f"{backend.where('config', 'config')} is not an envvault config; is --vault pointing at "
                           "the right place?")
    if config["format"] > FORMAT:
        raise UsageError(
            f"this vault was written by a newer envvault (format {config['format']}, this one reads {FORMAT}); upgrade envvault"
        )
    return config


def open_local(backend, *, create: bool = False) -> dict:
    """What every opening of the local vault of ``backend`` (a ``LocalBackend``) checks, and its config: there
    (made when absent and ``create``), none of its own entries a symlink, a config this envvault reads.
    ``Vault.open`` and the quick status (``snap/verdict.py``) both ask here: a vault the full command refuses
    is refused by both. Raises NotFoundError, UsageError (another program's folder, a newer format),
    CorruptError, StorageError."""
    root = backend.root
    if not backend.exists():
        if not create:
            raise NotFoundError(f"no vault at {root}; run `envvault snap` first or pass --vault PATH")
        backend.create()
        write_config(backend)
    backend.check_links()
    config = read_config(backend)
    if config is None and not backend.looks_like_vault():  # another program's folder, not a damaged vault
        cfg_path = backend.where("config", "config")
        raise UsageError(f"{root} is not an envvault vault ({cfg_path} is not envvault's); pass --vault "
                         "with a new or empty folder")
    return check_config(backend, config)
