#!/usr/bin/env bash
# Issue 11, the small files' groups (envvault/snap/groups.py) and the restore's remembered groups, on the device
# in one call: first snaps of its venv by the code before (.whl/old: e6dd3d2's wheel) and after, the groups in 8
# processes (the default on 16 cores) and in 12, beside tar | zstd, each with its memory (bench/gpu_tuning.sh);
# then the issue's table without its first-snap and --into rows (bench/gpu_env_run.sh --skip snap,into).
# Usage: OUT=$OUT bash bench/gpu_groups_run.sh [ROUNDS]
set -u
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
rm -rf .whl/old-tree && mkdir -p .whl/old-tree && (cd .whl/old-tree && python3 -m zipfile -e ../old/envvault-*.whl .)
echo "cores: $(nproc), venv: $(python3 -c 'import sys; print(sys.prefix)'), $(nvidia-smi -L 2>/dev/null | head -1)"
timeout 300 bash bench/gpu_tuning.sh "$ROUNDS" "PYTHONPATH=/tmp/oldsite" "" "ENVVAULT_GROUP_PROCESSES=12"
# where a default first snap's time goes (its stages summed over threads and builders, envvault/vault/timing.py)
( source bench/gpu_site.sh; rm -rf /tmp/tun/v; t0=$(now)
  ENVVAULT_STAGES=1 ENVVAULT_HOME=/tmp/tun/v timeout 60 $PY -m envvault snap --venv "$VENV" --no-caches -m t >/dev/null 2>/tmp/tun/stages
  t1=$(now); echo "first snap with ENVVAULT_STAGES=1: $(secs $t0 $t1) s"; grep envvault-stage /tmp/tun/stages; rm -rf /tmp/tun/v ) 2>&1 | tee "$OUT/gpu_stages.txt"
timeout 260 bash bench/gpu_env_run.sh --repeat "$ROUNDS" --skip snap,into
python3 - "$OUT/gpu_env_run.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    print(r.get("figure"), r.get("envvault_s"), r.get("anchor_s"), r.get("ratio"), r.get("goal"))
PY
