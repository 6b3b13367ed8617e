"""Vault locations that are URLs: s3:// opens an S3 vault; any other scheme, a malformed s3:// URL, or s3://
without the s3 extra is one clear line and a non-zero exit, never a local folder named ``s3:``."""

from __future__ import annotations

from pathlib import Path

import pytest

from evtools import assert_one_line_error, ev, ev_env
from envvault.errors import UsageError
from envvault.vault.location import parse_s3_url, vault_url


def test_parse_s3_url():
    assert str(parse_s3_url("s3://team-vault/a//b/")) == "s3://team-vault/a/b"
    u = parse_s3_url("s3://team.vault")
    assert (u.bucket, u.prefix) == ("team.vault", "")
    for bad in ("s3://A_B/x", "s3://ab", "s3://bucket/../x", "s3://user:pw@bucket/x", "s3://bucket/x?versionId=1"):
        with pytest.raises(UsageError):
            parse_s3_url(bad)
    assert vault_url("/tmp/s3/vault") is None and vault_url("rel/path") is None and vault_url(None) is None
    assert vault_url(Path("s3://x")) is None  # a Path object is a path
    with pytest.raises(UsageError, match="unsupported vault URL"):
        vault_url("gs://bucket/x")


@pytest.mark.parametrize("how", ["env", "flag"])
@pytest.mark.parametrize("url,needle", [
    ("gs://team/vault", "unsupported vault URL"),
    ("https://example.com/vault", "unsupported vault URL"),
    ("s3://Bad_Bucket/vault", "not a valid bucket name"),
    ("s3://u:secret@team/vault", "holds no credentials"),
])
def test_bad_urls_are_one_line(tmp_path: Path, how: str, url: str, needle: str):
    env = ev_env(tmp_path / "unused")
    args = ["list"]
    if how == "env":
        env["ENVVAULT_HOME"] = url
    else:
        env.pop("ENVVAULT_HOME")
        args = ["--vault", url, "list"]
    proc = ev(tmp_path, *args, check=False, env=env, cwd=tmp_path)
    assert_one_line_error(proc, needle)
    assert proc.returncode == 2
    assert "secret" not in proc.stderr
    assert list(tmp_path.iterdir()) == [], "a URL made something in the working directory"


def test_s3_without_the_extra(tmp_path: Path):
    """obstore not importable (a shadowing package that raises ImportError): one line naming the extra."""
    shadow = tmp_path / "shadow" / "obstore"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('simulated: obstore is not installed')\n")
    work = tmp_path / "work"
    work.mkdir()
    env = ev_env(tmp_path / "unused")
    env["ENVVAULT_HOME"] = "s3://team/vault"
    env["PYTHONPATH"] = f"{shadow.parent}:{env['PYTHONPATH']}"
    for args in (["list"], ["show", "latest"], ["gc", "--dry-run"]):
        proc = ev(tmp_path, *args, check=False, env=env, cwd=work)
        assert_one_line_error(proc, "pip install 'envvault[s3]'", "s3://team/vault")
        assert proc.returncode == 2
    assert list(work.iterdir()) == []
