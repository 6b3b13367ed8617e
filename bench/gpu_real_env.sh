#!/usr/bin/env bash
# The whole real-environment cycle on the GPU host's own venv (issue 9, "On a real GPU image"). Run from the
# repository root on the device machine, whose python3 is a real pip-installed venv (torch 2.11.0+cu130,
# Triton 3.6, an edited certifi bundle), without network; envvault and its dependencies are carried as cp312
# wheels in .whl/ (envvault's own wheel included: `pip wheel --no-deps -w .whl .`).
#
# Steps: snap, second snap, status, --lock-only snap; delete site-packages/torch and edit a triton file;
# status and diff (without --venv: `current` is the snapshot's own venv); restore latest (the lock-only one,
# from the vault's stored copies); restore of the full snapshot (nothing left to do); import torch and run a CUDA matmul;
# restore --into a new venv (verified; torch imports there and sees the GPU); export + `uv pip install
# --offline --no-deps` of the wheels into a fresh venv; a stamped torch.save of a training step, a torch file
# edited, `envvault restore step.pt`, status.
#
# Every step's command, exit code, wall time and output tail go to $OUT/gpu_real_env.log; the summary
# (one line per step) to $OUT/gpu_real_env.json, rewritten after every step.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
LOG=$OUT/gpu_real_env.log
: >"$LOG"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >"$OUT/pip.log" 2>&1 \
  || { echo "pip install of the carried wheels failed" | tee -a "$LOG"; cat "$OUT/pip.log"; exit 1; }
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
unset VIRTUAL_ENV
W=/tmp/gv
rm -rf "$W"; mkdir -p "$W"
export ENVVAULT_HOME=$W/vault TORCHINDUCTOR_CACHE_DIR=$W/inductor TRITON_CACHE_DIR=$W/triton
VENV=$(python3 -c 'import sys; print(sys.prefix)')
BASEPY=$(python3 -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')
SP=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
EV=/tmp/site/bin/envvault  # the installed entry point, not `-m` (which would import ./envvault)
SUMMARY=$OUT/gpu_real_env.json
echo "[]" >"$SUMMARY"
failed=0

step() {  # step NAME EXPECTED_RC COMMAND...
  local name=$1 want=$2; shift 2
  local t0 t1 rc out
  t0=$(date +%s.%N)
  out=$("$@" 2>&1); rc=$?
  t1=$(date +%s.%N)
  local wall; wall=$(python3 -c "print(round($t1-$t0, 2))")
  local ok=ok; if [ "$want" != any ] && [ "$rc" != "$want" ]; then ok=FAILED; failed=$((failed+1)); fi
  printf '\n=== %s  rc=%s (want %s)  %ss  %s\n$ %s\n%s\n' "$name" "$rc" "$want" "$wall" "$ok" "$*" \
    "$(printf '%s\n' "$out" | tail -n 25)" >>"$LOG"
  printf '%-28s rc=%-3s %7ss  %s\n' "$name" "$rc" "$wall" "$ok"
  python3 - "$SUMMARY" "$name" "$rc" "$want" "$wall" "$ok" <<'PY'
import json, sys
path, name, rc, want, wall, ok = sys.argv[1:]
rows = json.load(open(path))
rows.append({"step": name, "rc": int(rc), "want": want, "wall_s": float(wall), "ok": ok == "ok"})
json.dump(rows, open(path, "w"), indent=1)
PY
}

{
  echo "venv $VENV  base python $BASEPY  cores $(nproc)"
  du -sh "$VENV" 2>/dev/null | cut -f1
  find "$VENV" -type f | wc -l
} >>"$LOG"

# The anchor of the first snap, in the same run: tar | zstd -3 on all cores (no zstd CLI there).
step anchor_tar_zstd 0 bash -c "tar -cf - -C '$VENV' . | python3 -c 'import sys, zstandard; zstandard.ZstdCompressor(level=3, threads=-1).copy_stream(sys.stdin.buffer, open(\"$W/anchor.tar.zst\", \"wb\"))'"
step snap_full 0 $EV snap --venv "$VENV" -m "gpu host, full"
step tag_full 0 $EV tag latest gpu-full
FULL=gpu-full
step snap_again 0 $EV snap --venv "$VENV" -m "again, unchanged"
step status_unchanged 0 $EV status --venv "$VENV" --exit-code
step snap_lock_only 0 $EV snap --venv "$VENV" --lock-only -m "lock-only"
step pip_freeze_anchor 0 python3 -m pip freeze

rm -rf "$SP/torch"
echo "# edited by gpu_real_env.sh" >>"$SP/triton/__init__.py"
step status_broken 1 $EV status --venv "$VENV" --exit-code
step diff_no_venv 1 $EV diff latest current --exit-code
step restore_latest_lock_only 0 $EV restore latest --venv "$VENV"
step status_after_lock_restore 0 $EV status --venv "$VENV" --exit-code
step import_torch_1 0 python3 -c "import torch; print(torch.__version__, torch.cuda.is_available())"
step restore_full 0 $EV restore "$FULL" --venv "$VENV"
step status_after_full_restore 0 $EV status --venv "$VENV" --exit-code
step cuda_matmul 0 python3 -c "
import torch
a = torch.randn(4096, 4096, device='cuda'); b = a @ a; torch.cuda.synchronize()
print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), float(b.abs().mean()))"

step restore_into 0 $EV restore "$FULL" --into "$W/into"
step into_torch_gpu 0 "$W/into/bin/python" -c "
import torch; assert torch.cuda.is_available()
a = torch.randn(1024, 1024, device='cuda'); print(torch.__version__, float((a @ a).abs().mean()))"

step export 0 $EV export "$FULL" -o "$W/exp/pylock.toml"
step uv_venv 0 uv venv -q --python "$BASEPY" "$W/uvv"
step uv_install_wheels 0 bash -c "uv pip install -q --offline --no-deps --python '$W/uvv/bin/python' '$W'/exp/pylock.wheels/*.whl"
step uv_venv_torch 0 "$W/uvv/bin/python" -c "import torch; print(torch.__version__, torch.cuda.is_available())"

cat >"$W/train.py" <<'PY'
import torch, envvault.torch as et
et.enable()
model = torch.nn.Linear(64, 64).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
loss = model(torch.randn(32, 64, device="cuda")).pow(2).mean()
loss.backward(); opt.step()
torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": 1, "args": {"lr": 1e-3}}, "step.pt")
print("saved, loss", float(loss))
PY
step train_step_stamped 0 bash -c "cd '$W' && ENVVAULT_STAMP_FULL_SNAPSHOT=0 python3 train.py"
step inspect_ckpt 0 $EV inspect "$W/step.pt"
echo "# edited after the checkpoint" >>"$SP/torch/__init__.py"
step restore_from_ckpt 0 $EV restore "$W/step.pt"
step status_after_ckpt_restore 0 $EV status --venv "$VENV" --exit-code
step cuda_after_ckpt_restore 0 python3 -c "
import torch
a = torch.randn(2048, 2048, device='cuda'); torch.cuda.synchronize(); print(torch.__version__, float((a @ a).abs().mean()))"
step verify_vault 0 $EV verify
du -sh "$W/vault" "$W/anchor.tar.zst" >>"$LOG" 2>&1

echo "failed steps: $failed" | tee -a "$LOG"
[ "$failed" = 0 ]
