"""One gradient of measure-to-measure control (forward + adjoint): jaxdyn against PyTorch autograd.

The sphere model on S^2 (d = 3), L layers of constant (Q, K, V, β), ``steps`` RK4 steps a layer
(projected: x ← x/|x| after each step), N particles. Three computations, each in its own child
process whose peak resident memory is read by ``/usr/bin/time -v`` (XLA's allocations are not
seen by tracemalloc):

* ``jaxdyn-flow``: the gradient in the controls of ``Σ_i ⟨x_i(T), w_i⟩`` (a fixed random w):
  :func:`jaxdyn.control.measure_flow` under ``jax.grad``, diffrax's checkpointed adjoint
  through the kernel blocked in both passes.
* ``torch-flow``: the same in PyTorch with dense attention (the N x N softmax, the code a user
  writes) and autograd; ``torch-flow-ckpt``: the same with ``torch.utils.checkpoint`` around
  each RK4 step (what a user does once the plain version runs out of memory). The plain one
  is skipped where its stored softmax matrices (about 2 · 4 L · steps · N² · 4 bytes) would
  pass ``--torch-max-gb``.
* ``jaxdyn-loss``: the gradient of the full objective of :func:`jaxdyn.control.measure_loss`
  (debiased Sinkhorn divergence to a target cloud of N points, ε = ``--epsilon``).

``--kernel-memory``: one attention gradient at N = 10^4 (float32) through
:func:`jaxdyn.kernels.interaction` (blocked) and through the control kernel, each in a child.

Writes ``benchmarks/runs/control_measure.json`` with machine facts, the commit and the load.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import ROOT, add_common_args, machine_info, write_json  # noqa: E402


def _problem(n, n_layers, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal((n, 3))
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    w = rng.standard_normal((n, 3))
    eye = np.broadcast_to(np.eye(3), (n_layers, 3, 3))
    ctrl = {k: eye + 0.2 * rng.standard_normal((n_layers, 3, 3)) for k in ("Q", "K", "V")}
    ctrl["beta"] = np.full((n_layers,), 2.0)
    centres = np.eye(3)
    y = centres[rng.integers(0, 3, n)] * 8.0 + rng.standard_normal((n, 3))  # vMF-like clusters
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    return x0.astype(np.float32), w.astype(np.float32), \
        {k: v.astype(np.float32) for k, v in ctrl.items()}, y.astype(np.float32)


def child_jaxdyn(n, n_layers, steps, what, epsilon):
    """One jaxdyn gradient (flow or full objective): first call and second call, seconds."""
    import jax
    import jax.numpy as jnp

    from jaxdyn.control import measure_flow, measure_loss

    x0, w, ctrl, y = _problem(n, n_layers)
    ctrl = {k: jnp.asarray(v) for k, v in ctrl.items()}
    if what == "flow":
        def f(c):
            xs = measure_flow(c, x0, t1=1.0, model="sphere", steps_per_layer=steps)
            return jnp.sum(xs[-1] * w)
    else:
        def f(c):
            return measure_loss(c, x0, y, t1=1.0, model="sphere", epsilon=epsilon,
                                steps_per_layer=steps, sinkhorn_threshold=1e-3)
    g = jax.jit(jax.grad(f))
    t0 = time.perf_counter()
    jax.block_until_ready(g(ctrl))
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = jax.block_until_ready(g(ctrl))
    run = time.perf_counter() - t0
    finite = all(bool(jnp.all(jnp.isfinite(v))) for v in out.values())
    return {"first_s": first, "run_s": run, "finite": finite}


def child_torch(n, n_layers, steps, ckpt):
    """One PyTorch autograd gradient of the flow with dense attention (optionally checkpointed)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    x0, w, ctrl, _ = _problem(n, n_layers)
    x0, w = torch.from_numpy(x0), torch.from_numpy(w)
    c = {k: torch.from_numpy(v).requires_grad_(True) for k, v in ctrl.items()}
    h = 1.0 / (n_layers * steps)

    def field(x, Q, K, V, b):
        logits = b * (x @ Q.T) @ (x @ K.T).T  # N x N
        m = torch.softmax(logits, dim=1) @ x
        a = m @ V.T
        return a - (a * x).sum(1, keepdim=True) * x

    def rk4(x, Q, K, V, b):
        k1 = field(x, Q, K, V, b)
        k2 = field(x + h / 2 * k1, Q, K, V, b)
        k3 = field(x + h / 2 * k2, Q, K, V, b)
        k4 = field(x + h * k3, Q, K, V, b)
        y = x + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        return y / y.norm(dim=1, keepdim=True)

    def grad():
        for v in c.values():
            v.grad = None
        x = x0
        for layer in range(n_layers):
            args = (c["Q"][layer], c["K"][layer], c["V"][layer], c["beta"][layer])
            for _ in range(steps):
                x = checkpoint(rk4, x, *args, use_reentrant=False) if ckpt else rk4(x, *args)
        loss = (x * w).sum()
        loss.backward()
        return {k: v.grad for k, v in c.items()}

    t0 = time.perf_counter()
    out = grad()
    first = run = time.perf_counter() - t0
    if n < 5000:  # no compilation to separate: one call only at large N (it takes minutes)
        t0 = time.perf_counter()
        out = grad()
        run = time.perf_counter() - t0
    finite = all(bool(torch.isfinite(v).all()) for v in out.values())
    return {"first_s": first, "run_s": run, "finite": finite}


def child_kernel(n, which):
    """One attention gradient through the interaction kernel or the control kernel."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxdyn.kernels import attend
    from jaxdyn.kernels import interaction

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((n, 3)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((n, 3)), jnp.float32)
    if which == "control":
        def f(x):
            return jnp.sum(attend(x, x, x, jnp.zeros((n,), x.dtype)) * w)
    else:
        def f(x):
            return jnp.sum(interaction(x, x, jnp.eye(3, dtype=x.dtype), 1.0, kernel="blocked") * w)
    g = jax.jit(jax.grad(f))
    jax.block_until_ready(g(x))
    t0 = time.perf_counter()
    jax.block_until_ready(g(x))
    return {"first_s": None, "run_s": time.perf_counter() - t0, "finite": True}


def run_child(args, timeout, mem_limit_kb=None):
    """``python this --child ...`` under /usr/bin/time -v: (result dict or None, peak RSS MB, note)."""
    cmd = ["/usr/bin/time", "-v", sys.executable, str(Path(__file__).resolve()), *args]
    if mem_limit_kb:
        cmd = ["bash", "-c", f"ulimit -v {int(mem_limit_kb)}; exec " + " ".join(cmd)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, None, f"timeout after {timeout} s"
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    rss = int(m.group(1)) / 1024 if m else None
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0 or not lines:
        tail = p.stderr.strip().splitlines()
        err = next((line for line in reversed(tail) if "Error" in line), tail[-1] if tail else "")
        return None, rss, f"failed (rc {p.returncode}): {err[:300]}"
    return json.loads(lines[-1]), rss, ""


def _commit():
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
    except OSError:
        return None


def main():
    """Run the children, collect times and peak memory, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p)
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 3000, 10000])
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--steps", type=int, default=2, help="RK4 steps a layer")
    p.add_argument("--epsilon", type=float, default=0.05)
    p.add_argument("--torch-max-gb", type=float, default=6.0,
                   help="skip the plain PyTorch autograd run whose softmax storage passes this")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per child")
    p.add_argument("--no-loss", action="store_true", help="skip the full-objective gradient")
    p.add_argument("--kernel-memory", action="store_true")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        kind, n = args.child[0], int(args.child[1])
        if kind.startswith("jaxdyn"):
            out = child_jaxdyn(n, args.layers, args.steps, kind.split("-")[1], args.epsilon)
        elif kind.startswith("torch"):
            out = child_torch(n, args.layers, args.steps, kind.endswith("ckpt"))
        else:
            out = child_kernel(n, kind.split("-")[1])
        print(json.dumps(out))
        return
    sizes = [200, 400] if args.tiny else args.sizes
    n_layers = 2 if args.tiny else args.layers
    common = ["--layers", str(n_layers), "--steps", str(args.steps), "--epsilon", str(args.epsilon)]
    rows = []
    if args.kernel_memory:
        for which in ("kernel-interaction", "kernel-control"):
            res, rss, note = run_child(["--child", which, "10000"], args.timeout)
            rows.append({"impl": which, "n": 10000, "peak_rss_mb": rss, **(res or {}),
                         "note": note})
            print(rows[-1], flush=True)
    else:
        for n in sizes:
            impls = ["jaxdyn-flow", "torch-flow", "torch-flow-ckpt"]
            if not args.no_loss:
                impls.append("jaxdyn-loss")
            for impl in impls:
                est_gb = 2 * 4 * n_layers * args.steps * n * n * 4 / 2**30
                if impl == "torch-flow" and est_gb > args.torch_max_gb:
                    rows.append({"impl": impl, "n": n, "note": f"skipped: its stored softmax "
                                 f"matrices need about {est_gb:.0f} GB"})
                    print(rows[-1], flush=True)
                    continue
                limit = (args.torch_max_gb + 2) * 2**20 if impl.startswith("torch") else None
                load = os.getloadavg()[0]
                res, rss, note = run_child(["--child", impl, str(n), *common], args.timeout,
                                           limit)
                rows.append({"impl": impl, "n": n, "peak_rss_mb": rss, "loadavg_1min": load,
                             **(res or {}), "note": note})
                print(rows[-1], flush=True)
    for r in rows:  # ratios to the jaxdyn flow gradient of the same N
        base = next((b for b in rows if b["impl"] == "jaxdyn-flow" and b["n"] == r["n"]
                     and b.get("run_s")), None)
        if base and r.get("run_s"):
            r["time_ratio_to_jaxdyn_flow"] = r["run_s"] / base["run_s"]
            r["memory_ratio_to_jaxdyn_flow"] = r["peak_rss_mb"] / base["peak_rss_mb"]
    data = {"benchmark": "control_measure", "layers": n_layers, "steps_per_layer": args.steps,
            "d": 3, "dtype": "float32", "epsilon": args.epsilon, "commit": _commit(),
            "rows": rows, "machine": machine_info(codegen_check=False)}
    name = "control_measure_kernel" if args.kernel_memory else "control_measure"
    write_json(name + ("_tiny" if args.tiny else "") + args.tag, data)


if __name__ == "__main__":
    main()
