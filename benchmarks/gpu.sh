#!/usr/bin/env bash
# jaxdyn on a GPU, one command (repo root or anywhere):   bash benchmarks/gpu.sh
#
# Runs, against PyTorch CUDA eager measured in the same invocation:
#   1. a probe of the blocked kernel's block step ("fused" vs "dot") and block sizes at
#      N = 2^16, which picks the configuration used below (results/gpu_probe.json);
#   2. the phase-diagram workload (benchmarks/bench_phase.py);
#   3. one field evaluation for N = 2^10 … 2^20 (benchmarks/bench_large_n.py): time and the
#      device allocator's peak memory, jaxdyn dense and blocked, PyTorch dense where it fits;
#   4. Sinkhorn W2 against exact assignment (and the closed form of the affine case) for
#      N = 10^3 … 10^5 (benchmarks/bench_w2.py, issue "Concentration study").
# Results go to benchmarks/results/*_gpu.{json,png} and, when $OUT is set, to $OUT too
# (phase_gpu, large_n_gpu, gpu_probe, w2_sinkhorn_gpu, summary_gpu, gpu_log.txt).
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
LOGDIR=${OUT:-$ROOT/benchmarks/results}
mkdir -p "$LOGDIR" "$ROOT/benchmarks/results"
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
[ "$TINY" = "1" ] && TINYARG="--tiny"
cd "$ROOT/benchmarks"

echo "== 1. probe: block step and block sizes at N = 2^16 =="
PROBE_N=65536
[ "$TINY" = "1" ] && PROBE_N=512
timeout 60 $PY bench_large_n.py --probe --probe-n $PROBE_N --tag "$TAG" || echo "probe failed or timed out"
KB=""; QB=""; FORM=""
if [ -f "$ROOT/benchmarks/results/gpu_probe$TAG.json" ]; then
  read -r FORM KB QB < <($PY -c "
import json; r = json.load(open('$ROOT/benchmarks/results/gpu_probe$TAG.json'))
b = r.get('best') or {}
print(b.get('formulation', ''), b.get('k_block', ''), b.get('q_block', ''))")
  echo "probe picked: formulation=$FORM k_block=$KB q_block=$QB"
fi
[ -n "$KB" ] && export JAXDYN_BENCH_K_BLOCK=$KB JAXDYN_BENCH_Q_BLOCK=$QB JAXDYN_BENCH_FORMULATION=$FORM

echo "== 2. phase-diagram workload =="
PHASE_ARGS="--tag $TAG --variants jax_vmap,jaxdyn_sharded,jaxdyn_ensemble"
if [ "$TORCH_DEV" = "none" ]; then PHASE_ARGS="$PHASE_ARGS --skip-torch"; else PHASE_ARGS="$PHASE_ARGS --torch-device $TORCH_DEV"; fi
timeout 90 $PY bench_phase.py $PHASE_ARGS $TINYARG || echo "phase benchmark failed or timed out"

echo "== 3. large N =="
LARGE_IMPLS="jax_dense,jax_blocked"
[ "$TORCH_DEV" != "none" ] && LARGE_IMPLS="$LARGE_IMPLS,torch"
MAXLOG=20
[ "$TINY" = "1" ] && MAXLOG=8
timeout 140 $PY bench_large_n.py --impls "$LARGE_IMPLS" --max-log2n $MAXLOG --min-log2n 10 \
    --torch-device "${TORCH_DEV/none/cpu}" --mem-cap-gb 48 --time-cap 10 --budget 50 --reps 5 \
    --headline-rounds 10 \
    --tag "$TAG" $TINYARG || echo "large-N benchmark failed or timed out"

echo "== 4. Sinkhorn W2 to N = 10^5 =="
W2_ARGS="--name w2_sinkhorn$TAG --cases affine concentration --sizes 1000 4000 10000 30000 100000 --exact-max 4000 --ott-max 0 --repeat 2 --budget-s 120"
[ "$TINY" = "1" ] && W2_ARGS="--name w2_sinkhorn$TAG --cases affine --sizes 200 400 --exact-max 400 --ott-max 0 --repeat 1"
timeout 200 $PY bench_w2.py $W2_ARGS || echo "W2 benchmark failed or timed out"
[ -n "${OUT:-}" ] && cp -f "$ROOT/benchmarks/results/w2_sinkhorn$TAG.json" "$ROOT/benchmarks/results/w2_sinkhorn$TAG.png" "$OUT/" 2>/dev/null

echo "== summary =="
$PY summarize.py --tag "$TAG" || true
if [ -n "${OUT:-}" ]; then
  cp -f "$ROOT/benchmarks/results/summary$TAG.json" "$OUT/" 2>/dev/null || true
fi
echo "gpu.sh done in $(( $(date +%s) - start )) s"
