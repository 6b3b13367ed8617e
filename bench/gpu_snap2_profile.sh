#!/usr/bin/env bash
# Where a second snap of the device's own venv goes, beyond the quick status's work: its stages
# (ENVVAULT_STAGES=1) and a cProfile of the whole command in process (cumulative, 45 rows), with the carried
# wheels installed at /tmp/site (bench/gpu_env_run.sh leaves them there). Usage: bash bench/gpu_snap2_profile.sh
set -u
[ -d /tmp/site/envvault ] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
V=/tmp/s2v VENV=$(python3 -c 'import sys; print(sys.prefix)')
rm -rf $V
cd /tmp
python3 -m envvault --vault $V snap --venv "$VENV" --no-caches | tail -1
python3 -m envvault --vault $V snap --venv "$VENV" >/dev/null
for i in 1 2 3; do ENVVAULT_STAGES=1 python3 -m envvault --vault $V snap --venv "$VENV" 2>&1 | grep -v "^snapshot"; echo; done
ENVVAULT_QUICK_EXIT=0 python3 -c "
import cProfile, pstats, sys
sys.argv = ['envvault', '--vault', '$V', 'snap', '--venv', '$VENV']
from envvault.entry import main
pr = cProfile.Profile(); pr.enable()
try:
    main()
except SystemExit:
    pass
pr.disable(); pstats.Stats(pr).sort_stats('cumulative').print_stats(45)" 2>&1 | grep -v '^$' | cut -c1-170
rm -rf $V
