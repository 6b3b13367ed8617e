#!/usr/bin/env bash
# Where the quick `status` spends its time on the device: bench/gpu_quick_profile.py, after installing the
# carried wheels (.whl) as bench/gpu_env_run.sh does. Usage: OUT=$OUT bash bench/gpu_quick_profile.sh
set -eu
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench/out}
export OUT
mkdir -p "$OUT"
[ -x /tmp/site/bin/uv ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export WHEELS=$PWD/.whl
cd /tmp && exec python3 "$OLDPWD/bench/gpu_quick_profile.py"
