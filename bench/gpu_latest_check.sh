#!/usr/bin/env bash
# What `latest` names, on the GPU host's own venv (session 28's workflow fixes): after a full snap, a `cache
# snap --venv` of that venv (the H200 cache, carried as bench/out/inductor-cache.tar.zst) is neither what
# `status` compares with nor what `restore latest`, `diff latest current` or `export latest` take; a cache-only
# snapshot named to `restore` is one line, exit 2; a lock-only snap after that is unchanged against the venv.
# Carry .whl/ as for gpu_env_run.sh. Usage: OUT=$OUT bash bench/gpu_latest_check.sh (about 30 s).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench/out}
mkdir -p "$OUT"
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >"$OUT/pip.log" 2>&1 \
  || { echo "pip install of the carried wheels failed"; cat "$OUT/pip.log"; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
unset VIRTUAL_ENV
W=/tmp/latest-check
rm -rf "$W"; mkdir -p "$W/cache"
export ENVVAULT_HOME=$W/vault
VENV=$(python3 -c 'import sys; print(sys.prefix)')
python3 -c 'import sys, zstandard; zstandard.ZstdDecompressor().copy_stream(sys.stdin.buffer, sys.stdout.buffer)' \
  < bench/out/inductor-cache.tar.zst | tar -x -C "$W/cache"
ev() { python3 -m envvault "$@"; }
j() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
{
  echo "# $(date -u +'%Y-%m-%d %H:%M UTC') $(nproc) cores, venv $VENV"
  env_sid=$(ev snap --venv "$VENV" --no-caches --json | j 'd["id"]')
  cache_sid=$(ev cache snap --venv "$VENV" --cache-dir "$W/cache" --no-discover --json | j 'd["id"]')
  echo "env snapshot $env_sid, cache-only snapshot $cache_sid (the newest)"
  echo "status compares with: $(ev status --venv "$VENV" --json | j '(d["snapshot"], "unchanged" if d["empty"] else "CHANGED")')"
  echo "restore latest takes: $(ev restore latest --venv "$VENV" --dry-run --json | j '(d["restored"], d["changed"])')"
  echo "diff latest current: $(ev diff latest current --venv "$VENV" --json | j '(d["old"], d["empty"])')"
  ev export latest --venv "$VENV" -o "$W/pylock.toml" --no-wheels --json 2>/dev/null | j '("export latest:", d["packages"], "packages")'
  VIRTUAL_ENV=$VENV ev export latest -o "$W/pylock.toml" --no-wheels --json 2>/dev/null | j '("export latest (venv active):", d["packages"], "packages")'
  echo "show latest (venv active): $(VIRTUAL_ENV=$VENV ev show latest --json | j 'd["id"]')"
  ev restore "${cache_sid:0:12}" --venv "$VENV" --dry-run; echo "restore of the cache-only snapshot: exit $?"
  lock_sid=$(ev snap --venv "$VENV" --lock-only --json | j 'd["id"]')
  echo "after --lock-only $lock_sid, status: $(ev status --venv "$VENV" --json | j '(d["snapshot"], "unchanged" if d["empty"] else "CHANGED")')"
} 2>&1 | tee "$OUT/gpu_latest_check.txt"
