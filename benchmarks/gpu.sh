#!/usr/bin/env bash
# jaxdyn on a GPU, one command (repo root or anywhere):   bash benchmarks/gpu.sh
#
# Runs, against PyTorch CUDA eager measured in the same invocation:
#   1. a probe of the blocked kernel's block step ("fused" vs "dot") and block sizes at
#      N = 2^16, which picks the configuration used below (runs/gpu_probe_gpu.json);
#   2. the suite's GPU workloads through its entry point (`python -m benchmarks run --gpu`,
#      each workload's GPU arguments are in benchmarks/suite.py):
#      phase     the phase-diagram workload (benchmarks/bench_phase.py);
#      large_n   one field evaluation for N = 2^10 … 2^20 (benchmarks/bench_large_n.py): time
#                and the device allocator's peak memory, jaxdyn dense and blocked, PyTorch
#                dense where it fits;
#      w2        Sinkhorn W2 against exact assignment (and the closed form of the affine
#                case) for N = 10^3 … 10^5 (benchmarks/bench_w2.py).
# Results are recorded (`--record`) as benchmarks/results/<workload>/gpu-<model>.{json,png} and,
# when $OUT is set, go to $OUT/<workload>/ too (with gpu_probe_gpu.json and gpu_log.txt; without
# $OUT those two stay in benchmarks/runs/, which git ignores).
# Budget: each step has its own timeout (60 + 90 + 140 + 200 s); about 8-9 minutes on an
# H200 in all (nothing to install there: JAX with CUDA is in the image; jaxdyn runs in place
# from the repo with PYTHONPATH). Run it as one device call with a 590 s limit.
#
# Python packages: the script uses `python3` (PYTHON= to override). If `import jaxdyn`
# needs a package the machine lacks (ott-jax, jaxopt, h5netcdf), it installs the wheels
# carried in .whl/ (pure Python; `pip download` them here, see /work/.library/device) into
# a private folder first. If JAX there has no GPU backend, the script says so and runs on
# the CPU anyway (numbers then mean nothing for the GPU).
#
# Smoke test on any machine (CPU included):   JAXDYN_BENCH_TINY=1 bash benchmarks/gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
TINY=${JAXDYN_BENCH_TINY:-0}
TAG=${JAXDYN_BENCH_TAG:-_gpu}
LOGDIR=${OUT:-$ROOT/benchmarks/runs}
mkdir -p "$LOGDIR" "$ROOT/benchmarks/runs"
LOG="$LOGDIR/gpu_log.txt"
exec > >(tee "$LOG") 2>&1
start=$(date +%s)
echo "== jaxdyn GPU benchmarks ($(date -u +%FT%TZ)), tiny=$TINY =="
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if ! $PY -c "import jaxdyn" 2>/dev/null; then
  if ls "$ROOT"/.whl/*.whl >/dev/null 2>&1; then
    echo "installing carried wheels from .whl/ into /tmp/jaxdyn_site"
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/jaxdyn_site "$ROOT"/.whl/*.whl || echo "wheel install failed"
    export PYTHONPATH="$ROOT:/tmp/jaxdyn_site${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
$PY - <<'EOF' || { echo "cannot import jaxdyn; stopping"; exit 1; }
import jax, jaxdyn
try:
    import torch
    tv = f"torch {torch.__version__}, cuda available: {torch.cuda.is_available()}"
except ImportError:
    tv = "torch missing"
print(f"jax {jax.__version__}, backend {jax.default_backend()}, devices {jax.devices()}; {tv}")
if jax.default_backend() == "cpu":
    print("NOTE: JAX has no GPU backend here; running on the CPU")
EOF

TORCH_DEV=$($PY -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')" 2>/dev/null || echo none)
TINYARG=""
RECORD="--record"  # the tracked latest result of the GPU kind (a smoke test is never recorded)
[ "$TINY" = "1" ] && TINYARG="--tiny" && RECORD=""
cd "$ROOT/benchmarks"

echo "== 1. probe: block step and block sizes at N = 2^16 =="
PROBE_N=65536
[ "$TINY" = "1" ] && PROBE_N=512
timeout 60 $PY bench_large_n.py --probe --probe-n $PROBE_N --tag "$TAG" || echo "probe failed or timed out"
KB=""; QB=""; FORM=""
if [ -f "$ROOT/benchmarks/runs/gpu_probe$TAG.json" ]; then
  read -r FORM KB QB < <($PY -c "
import json; r = json.load(open('$ROOT/benchmarks/runs/gpu_probe$TAG.json'))
b = r.get('best') or {}
print(b.get('formulation', ''), b.get('k_block', ''), b.get('q_block', ''))")
  echo "probe picked: formulation=$FORM k_block=$KB q_block=$QB"
fi
[ -n "$KB" ] && export JAXDYN_BENCH_K_BLOCK=$KB JAXDYN_BENCH_Q_BLOCK=$QB JAXDYN_BENCH_FORMULATION=$FORM

echo "== 2. phase-diagram workload =="
if [ "$TORCH_DEV" = "none" ]; then PHASE_TORCH="--skip-torch"; else PHASE_TORCH="--torch-device $TORCH_DEV"; fi
(cd "$ROOT" && $PY -m benchmarks run phase --gpu --timeout 90 $RECORD $TINYARG -- $PHASE_TORCH) \
  || echo "phase benchmark failed or timed out"

echo "== 3. large N =="
LARGE_EXTRA="--torch-device ${TORCH_DEV/none/cpu}"
[ "$TORCH_DEV" = "none" ] && LARGE_EXTRA="$LARGE_EXTRA --impls jax_dense,jax_blocked"
[ "$TINY" = "1" ] && LARGE_EXTRA="$LARGE_EXTRA --max-log2n 8"
(cd "$ROOT" && $PY -m benchmarks run large_n --gpu --timeout 140 $RECORD $TINYARG -- $LARGE_EXTRA) \
  || echo "large-N benchmark failed or timed out"

echo "== 4. Sinkhorn W2 to N = 10^5 =="
W2_EXTRA=""
[ "$TINY" = "1" ] && W2_EXTRA="--cases affine --sizes 200 400 --exact-max 400 --repeat 1"
(cd "$ROOT" && $PY -m benchmarks run w2 --gpu --timeout 200 $RECORD $TINYARG -- $W2_EXTRA) \
  || echo "W2 benchmark failed or timed out"

echo "== summary =="
$PY summarize.py --tag _gpu || true
echo "gpu.sh done in $(( $(date +%s) - start )) s"
