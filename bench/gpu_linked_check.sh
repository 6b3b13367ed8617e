#!/usr/bin/env bash
# bench/gpu_linked_check.py on the device, after bench/gpu_env_run.sh (its carried wheels in /tmp/site, its
# exported wheels in /tmp/gev/exp); without those, it installs the carried wheels and makes the export itself.
# Arguments go to gpu_linked_check.py; `--ab /tmp/site-old` with an older envvault wheel in .whl/old/.
# Run from the repository root.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench/out}
export OUT
if [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
fi
if [ -d .whl/old ] && [ ! -d /tmp/site-old ]; then
  mkdir -p /tmp/oldw && cp .whl/*.whl /tmp/oldw/ && rm /tmp/oldw/envvault-*.whl && cp .whl/old/envvault-*.whl /tmp/oldw/
  python3 -m pip install -q --no-index --no-deps --target /tmp/site-old /tmp/oldw/*.whl || exit 1
fi
if [ -z "$(ls /tmp/gev/exp/*/*.whl 2>/dev/null)" ]; then
  VENV=$(python3 -c 'import sys; print(sys.prefix)')
  rm -rf /tmp/gev && mkdir -p /tmp/gev
  (cd /tmp && PYTHONPATH=/tmp/site python3 -m envvault --vault /tmp/gev/vault snap --no-caches --venv "$VENV" -m full \
    >/dev/null && PYTHONPATH=/tmp/site python3 -m envvault --vault /tmp/gev/vault export latest --venv "$VENV" \
    -o /tmp/gev/exp/pylock.toml) || exit 1
fi
PYTHONPATH=/tmp/site exec python3 bench/gpu_linked_check.py "$@"
