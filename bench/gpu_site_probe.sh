#!/usr/bin/env bash
# What the GPU host's venv imports before any command runs (its .pth files, sitecustomize), and what the
# quick status and a second snap import on top of it: -X importtime of `python3 -c pass`, of `python3 -m
# envvault status` (answered from the verdict) and of a second snap. Run from the repository root on the device
# machine with the carried wheels in .whl/ (as bench/gpu_env_run.sh).
set -u
cd "$(dirname "$0")/.."
rm -rf /tmp/site /tmp/probe-vault
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1 || { echo "pip install failed"; exit 1; }
python3 -c 'import sys, site; print(sys.version); print(sys.prefix); print(site.getsitepackages())'
SP=$(python3 -c 'import site; print(site.getsitepackages()[0])')
echo "## .pth files in $SP"
for f in "$SP"/*.pth; do echo "--- $f"; head -c 400 "$f"; echo; done
python3 -c 'import sitecustomize' 2>&1 | head -2
python3 -c 'import usercustomize' 2>&1 | head -2
top() { sort -t'|' -k2 -n | tail -"$1"; }
echo "## python3 -X importtime -c pass (30 slowest cumulative)"
python3 -X importtime -c pass 2>&1 | top 30
echo "## modules after site: $(python3 -c 'import sys; print(len(sys.modules))')"
python3 -c 'import sys; print(sorted(sys.modules))'
export PYTHONPATH=/tmp/site
V=/tmp/probe-vault VENV=$(python3 -c 'import sys; print(sys.prefix)')
python3 -m envvault --vault $V snap --venv "$VENV" | tail -1; python3 -m envvault --vault $V status --venv "$VENV"
echo "## quick status -X importtime (40 slowest)"
python3 -X importtime -m envvault --vault $V status --venv "$VENV" 2>&1 >/dev/null | top 40
echo "## second snap -X importtime (40 slowest)"
python3 -X importtime -m envvault --vault $V snap --venv "$VENV" 2>&1 >/dev/null | top 40
t() { local s=$(date +%s%N); "$@" >/dev/null 2>&1; echo -n "$(( ($(date +%s%N)-s)/1000000 )) "; }
for row in "python3 -c pass" "python3 -S -c pass" "python3 -I -c pass" "python3 -m envvault --vault $V status --venv $VENV" "python3 -m envvault --vault $V snap --venv $VENV" "python3 -m pip freeze"; do
  echo -n "$row:"; for i in 1 2 3 4 5 6 7; do t $row; done; echo
done
