#!/usr/bin/env bash
# The local (block-sparse) attention kernel on a GPU, one command:   bash benchmarks/gpu_local.sh
#
# One field evaluation on S², uniform points, Q = K = V = I, β = N, tol = 1e-6, at N = 10^7 and
# 10^8 (bench_local.py's field case, the suite's GPU arguments of the `local` workload): first
# call (compile) apart, median wall time, visited fraction beside the crude cap, the error
# against a float64 NumPy reference on 50 queries. Recorded (`--record`) as
# benchmarks/results/local/gpu-<model>.json; with $OUT set, copied to $OUT/local/ too, with the
# log. About 3-5 minutes on an H100/H200 (most of it the float64 reference and compilation);
# run it as one device call with a 400 s limit.
#
# Smoke test on any machine (CPU included):   JAXDYN_BENCH_TINY=1 bash benchmarks/gpu_local.sh
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
LOGDIR=${OUT:-$ROOT/benchmarks/runs}
mkdir -p "$LOGDIR"
exec > >(tee "$LOGDIR/gpu_local_log.txt") 2>&1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c "import jax; print('jax', jax.__version__, 'backend', jax.default_backend(), jax.devices())" \
  || { echo "cannot import jax; stopping"; exit 1; }
if [ "${JAXDYN_BENCH_TINY:-0}" = "1" ]; then
  $PY -m benchmarks run local --tiny -- --cases field --field-ns 2000,4000 --accuracy-queries 20
else
  $PY -m benchmarks run local --gpu --timeout 380 --record
fi
