#!/usr/bin/env bash
# The CPU benchmark suite, one command:   bash benchmarks/run_all.sh [--tiny]
#
# Runs the phase-diagram workload (against PyTorch eager), large-N field evaluations
# (against NumPy, PyTorch eager and KeOps; time and peak memory), and the roofline (exp and
# matmul rates of this machine, jaxdyn's fraction of the exp-bound floor; run twice: as is and
# with XLA capped at AVX2, as on a CPU without AVX-512, each against its own floor). Each script
# exposes the host cores as JAX devices before JAX starts (opt out: JAXDYN_NO_HOST_DEVICES=1)
# and writes benchmarks/results/<name>.json and .png. Extra arguments go to every script
# (e.g. --tiny for a smoke test, --tag _x to keep earlier results).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python}
export PYTHONUNBUFFERED=1
start=$(date +%s)
echo "== phase diagram =="
$PY bench_phase.py "$@"
echo "== large N =="
$PY bench_large_n.py "$@"
echo "== roofline =="
$PY bench_roofline.py --isas native AVX2 "$@"
echo "== summary =="
$PY summarize.py "$@"
echo "benchmarks done in $(( $(date +%s) - start )) s"
