#!/usr/bin/env bash
# bench/gpu_linked_check.py on the device, after bench/gpu_env_run.sh (its carried wheels in /tmp/site, its
# exported wheels in /tmp/gev/exp). Run from the repository root.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench/out} PYTHONPATH=/tmp/site exec python3 bench/gpu_linked_check.py
