#!/usr/bin/env bash
# The CPU headline workloads, one command:   bash benchmarks/run_all.sh [--tiny] [--rounds K]
#
# A thin wrapper over the suite's entry point (`python -m benchmarks list` names every
# workload): the phase-diagram workload (against PyTorch eager), large-N field evaluations
# (against NumPy, PyTorch eager and KeOps; time and peak memory) and the roofline (jaxdyn's
# fraction of the exp-bound floor), the roofline again with XLA capped at AVX2 (as on a CPU
# without AVX-512, its own machine kind), then the targets' summary. Each workload writes
# benchmarks/runs/<workload>/<machine kind>-<stamp>.json (ignored by git); with --record, the
# tracked benchmarks/results/<workload>/<machine kind>.json that `python -m benchmarks docs`
# puts in docs/benchmarks.md. Arguments go to `python -m benchmarks run`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
export PYTHONUNBUFFERED=1
start=$(date +%s)
$PY -m benchmarks run phase large_n roofline "$@"
$PY -m benchmarks run roofline --max-isa AVX2 "$@"
$PY benchmarks/summarize.py
echo "benchmarks done in $(( $(date +%s) - start )) s"
