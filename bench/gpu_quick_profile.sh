#!/usr/bin/env bash
# Where the quick `status` spends its time on the device: bench/gpu_quick_profile.py (or the script named, e.g.
# gpu_snap_profile.py), after installing the carried wheels (.whl) as bench/gpu_env_run.sh does; the H200
# cache archive, when carried, is CACHE_TAR. Usage: OUT=$OUT bash bench/gpu_quick_profile.sh [SCRIPT]
set -eu
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench/out}
export OUT
mkdir -p "$OUT"
[ -x /tmp/site/bin/uv ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export WHEELS=$PWD/.whl
[ -f bench/out/inductor-cache.tar.zst ] && export CACHE_TAR=$PWD/bench/out/inductor-cache.tar.zst
cd /tmp && exec python3 "$OLDPWD/bench/${1:-gpu_quick_profile.py}"
