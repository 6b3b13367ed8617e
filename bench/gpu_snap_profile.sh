#!/usr/bin/env bash
# Where the second snap, --lock-only and the compile cache restore spend their time on the device
# (bench/gpu_snap_profile.py). Usage: OUT=$OUT bash bench/gpu_snap_profile.sh
exec bash "$(dirname "$0")/gpu_quick_profile.sh" gpu_snap_profile.py
