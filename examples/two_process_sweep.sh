#!/usr/bin/env bash
# A sweep split over two processes on one machine (one JAX cluster over gloo, one CPU device
# each): both run the same command with the same --out; process 0 writes the results.
#
#     bash examples/two_process_sweep.sh [OUT]     # OUT: default a new temporary folder
#
# On several machines, run the same command on each with JAX_PROCESS_ID = 0, 1, ... and
# JAX_COORDINATOR_ADDRESS = process 0's host:port (or under SLURM, none of the three variables).
set -euo pipefail
OUT=${1:-$(mktemp -d)/two_process_sweep}
PORT=${PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
export JAX_COORDINATOR_ADDRESS=127.0.0.1:$PORT JAX_NUM_PROCESSES=2
export JAXDYN_NO_HOST_DEVICES=1                 # one CPU device per process
# configs/sweep_large.yaml, made small: 4 β × 2 seeds × 1 N = 8 systems in 2 chunks
SMALL=(--set "sweep.beta=[1.0, 2.0, 4.0, 8.0]" --set "sweep.seed=[0, 1]" --set "sweep.n=[64]"
       --set t1=2.0 --set chunk_size=4 --quiet)
JAX_PROCESS_ID=1 jaxdyn run configs/sweep_large.yaml --out "$OUT" --distributed "${SMALL[@]}" &
JAX_PROCESS_ID=0 jaxdyn run configs/sweep_large.yaml --out "$OUT" --distributed "${SMALL[@]}"
wait
echo "$OUT"
