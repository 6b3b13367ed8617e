# Sourced by the device A/B scripts (bench/gpu_into_ab.sh, bench/gpu_status_ab.sh) with OLD, NEW (wheel folders:
# the dependencies' wheels in NEW), PY and W set: both builds installed under $W/old and $W/new with their
# bytecode compiled, and the clock helpers.
mkdir -p $W
$PY -m pip install -q --no-index --no-deps --target $W/new "$NEW"/*.whl
mkdir -p $W/oldw && cp "$NEW"/*.whl $W/oldw/ && rm $W/oldw/envvault-*.whl && cp "$OLD"/envvault-*.whl $W/oldw/
$PY -m pip install -q --no-index --no-deps --target $W/old $W/oldw/*.whl
$PY -m compileall -q -j 0 $W/old $W/new >/dev/null
now() { date +%s.%N; }
secs() { $PY -c "print(round($2 - $1, 3))"; }
