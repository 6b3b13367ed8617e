#!/usr/bin/env bash
# The twenty-ninth session's fixes on the GPU host's own venv: a guarded command that dies the way a pip
# killed mid-uninstall of torch does (torch moved aside as ~orch, then SIGKILL) is rolled back and the
# leftover removed; then the first checkpoint stamp in fresh processes of that venv (enable + first
# torch.save, goal <= 300 ms) and the snapshot it names. Carry .whl/ as for gpu_env_run.sh.
# Usage: OUT=$OUT bash bench/gpu_session29_check.sh (about a minute).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/bench/out}
mkdir -p "$OUT"
rm -rf /tmp/site /tmp/s29
mkdir -p /tmp/s29
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >"$OUT/pip.log" 2>&1 \
  || { echo "pip install of the carried wheels failed"; cat "$OUT/pip.log"; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH ENVVAULT_HOME=/tmp/s29/vault
unset VIRTUAL_ENV
VENV=$(python3 -c 'import sys; print(sys.prefix)')
SITE=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ev() { python3 -m envvault "$@"; }
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
{
  echo "# $(date -u +'%Y-%m-%d %H:%M UTC') $(nproc) cores, venv $VENV"
  t0=$(date +%s%N); ev snap --venv "$VENV" --no-caches; echo "first snap: $(ms "$t0") ms"
  t0=$(date +%s%N)
  ev guard --venv "$VENV" --yes --json -- sh -c "mv $SITE/torch $SITE/~orch && kill -KILL \$\$" >/tmp/s29/guard.json
  echo "guard: exit $?, $(ms "$t0") ms"
  python3 -c "import json; d=json.load(open('/tmp/s29/guard.json')); print(d['outcome'], d['exit_code'], d['warnings'], {k: round(v, 2) for k, v in d['timings'].items() if k != 'command_started_at'})"
  echo "~ entries left in site-packages: $(ls -d "$SITE"/~* 2>/dev/null | wc -l)"
  ev status --venv "$VENV"
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
  for i in 1 2 3; do
    python3 - <<'PY'
import time
import torch
t0 = time.perf_counter()
import envvault.torch
envvault.torch.enable(full_snapshot=False)
torch.save({"step": 1}, "/tmp/s29/step.pt")
t1 = time.perf_counter()
torch.save({"step": 2}, "/tmp/s29/plain.pt")
t2 = time.perf_counter()
print(f"first stamp: enable + first save {1000 * (t1 - t0):.1f} ms; the next save {1000 * (t2 - t1):.1f} ms")
PY
  done
  ev inspect /tmp/s29/step.pt --json | python3 -c "import json, sys; print('the stamp names', json.load(sys.stdin)['stamp']['snapshot'][:12])"
  ev list | head -4
} 2>&1 | tee "$OUT/gpu_session29_check.txt"
