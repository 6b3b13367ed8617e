# Sourced by the device A/B scripts (bench/gpu_into_ab.sh, bench/gpu_status_ab.sh, bench/gpu_restore_ab.sh) with
# OLD, NEW (wheel folders: the dependencies' wheels in NEW) and W set: PY (python3) and VENV (its venv, the one
# measured), both builds installed under $W/old and $W/new with their bytecode compiled, the clock helpers
# and `medians LOG` (each row's median over its rounds, appended to LOG).
PY=python3
VENV=$($PY -c 'import sys; print(sys.prefix)')
mkdir -p $W
$PY -m pip install -q --no-index --no-deps --target $W/new "$NEW"/*.whl
mkdir -p $W/oldw && cp "$NEW"/*.whl $W/oldw/ && rm $W/oldw/envvault-*.whl && cp "$OLD"/envvault-*.whl $W/oldw/
$PY -m pip install -q --no-index --no-deps --target $W/old $W/oldw/*.whl
$PY -m compileall -q -j 0 $W/old $W/new >/dev/null
now() { date +%s.%N; }
secs() { $PY -c "print(round($2 - $1, 3))"; }
medians() {  # lines "round N NAME: S s" or "NAME round N: S s"
  $PY - "$1" <<'PY' | tee -a "$1"
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"(?:round \d+ (.+?)|(.+?) round \d+): ([\d.]+) s", line)
    if m:
        rows.setdefault(m.group(1) or m.group(2), []).append(float(m.group(3)))
for k, v in rows.items():
    print(f"median {k}: {statistics.median(v):.3f} s ({len(v)} runs, {min(v):.3f}-{max(v):.3f})")
PY
}
