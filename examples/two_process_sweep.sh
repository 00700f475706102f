#!/usr/bin/env bash
# A sweep split over two processes on one machine (one JAX cluster over gloo, one CPU device
# each): both run the same command with the same --out; process 1 computes its share of the
# chunks and process 0 computes the rest and writes the results (data.nc, summary.json, figures).
#
#     bash examples/two_process_sweep.sh [--out OUT]   # OUT: default a new temporary folder
#
# (`bash examples/two_process_sweep.sh OUT` works too.) On several machines, run the same
# command on each with JAXDYN_PROCESS_ID = 0, 1, ... and JAX_COORDINATOR_ADDRESS = process 0's
# host:port (under SLURM, none of them: JAX reads the job's layout).
set -euo pipefail
OUT=
while (($#)); do
    case $1 in
        -h | --help) sed -n '2,10s/^# \{0,1\}//p' "$0"; exit 0 ;;
        --out) OUT=${2:?--out needs a folder}; shift 2 ;;
        --out=*) OUT=${1#--out=}; shift ;;
        -*) echo "two_process_sweep.sh: unknown option $1 (--help lists the options)" >&2; exit 2 ;;
        *) OUT=$1; shift ;;
    esac
done
OUT=${OUT:-$(mktemp -d)/two_process_sweep}
PORT=${PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
export JAX_COORDINATOR_ADDRESS=127.0.0.1:$PORT JAXDYN_NUM_PROCESSES=2
export JAXDYN_NO_HOST_DEVICES=1                 # one CPU device per process
# configs/sweep_large.yaml, made small: 4 β × 2 seeds × 1 N = 8 systems in 2 chunks, to t = 10
# (time enough for the mean inner product to grow: clustering, fastest at small β)
SMALL=(--set "sweep.beta=[0.5, 1.0, 2.0, 4.0]" --set "sweep.seed=[0, 1]" --set "sweep.n=[64]"
       --set t1=10.0 --set "snapshots=[0.0, 10.0]" --set chunk_size=4 --quiet)
# process 1 prints one line naming itself; process 0 prints the plan and where it writes
JAXDYN_PROCESS_ID=1 jaxdyn run configs/sweep_large.yaml --out "$OUT" --distributed "${SMALL[@]}" &
JAXDYN_PROCESS_ID=0 jaxdyn run configs/sweep_large.yaml --out "$OUT" --distributed "${SMALL[@]}"
wait
python3 - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
s = json.loads((out / "summary.json").read_text())
print(f"status {s['status']}: {s['n_points']} systems in {s['n_chunks']} chunks over 2 processes "
      f"({s['elapsed_seconds']:.1f} s); results in {out}: data.nc, summary.json, "
      + ", ".join(s.get("figures", [])))
EOF
