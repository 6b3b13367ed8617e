#!/usr/bin/env bash
# Where the second snap, --lock-only and the compile cache restore spend their time on the device:
# bench/gpu_snap_profile.py, after installing the carried wheels (.whl) as bench/gpu_env_run.sh does.
# Usage: OUT=$OUT bash bench/gpu_snap_profile.sh
set -eu
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench/out}
export OUT
mkdir -p "$OUT"
[ -x /tmp/site/bin/uv ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export WHEELS=$PWD/.whl
[ -f bench/out/inductor-cache.tar.zst ] && export CACHE_TAR=$PWD/bench/out/inductor-cache.tar.zst
cd /tmp && exec python3 "$OLDPWD/bench/gpu_snap_profile.py"
