"""The work of every workload's headline computation: FLOPs, exponentials, bytes (no run).

    python benchmarks/cost.py RESULT.json ...     # prints one JSON line: file -> its cost

For each result file (``results/<workload>/<kind>.json`` or a run under ``runs/``) the
headline computation's work is counted in two ways and both are recorded:

* **XLA's count**: a loop-free *unit* of the computation (one field evaluation, one step of
  the published scheme, one right-hand side of an ODE, one Sinkhorn iteration, one gradient
  of an RK4 step) is lowered and compiled for this machine's backend, and
  ``jax.jit(f).lower(...).compile().cost_analysis()`` gives its ``flops``,
  ``transcendentals`` (exponentials) and ``bytes accessed``. XLA counts a while loop's body
  once, whatever its trip count, so the unit is always loop-free and *dense* (the N x N
  form of the same maths, never the blocked kernel's scan over key blocks).
* **Our count**: how often the unit runs (``repeats``: steps x stages x members, solver
  iterations, L-BFGS evaluations; static where the workload fixes it, read from the
  script's JSON where the run decides it), and the analytic counts where XLA's differ from
  the least work of the maths: a causal mask needs only N(N + 1)/2 exponentials, a
  multiscale Sinkhorn kernel only its kept fraction of the N² pairs, and the bytes a
  computation must move at least (``bytes_min``: its inputs read once and its outputs written
  once; a dense unit's ``bytes accessed`` counts its N x N intermediates, which a blocked
  kernel never writes).

The totals (``flops``, ``transcendentals``, ``bytes_min``) give the floor on a machine: the
largest of FLOPs at the matmul rate, exponentials at the exp rate of all cores and bytes
at the memory bandwidth (``suite.floor``). Work the count leaves out (the W2 evaluations of a
CLI run, the kinds of a config that are not particles) only lowers the floor, which stays a
lower bound.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

#: Published peak rates of an NVIDIA H200 SXM (141 GB) and where each figure comes from.
H200 = {
    "name": "NVIDIA H200 SXM",
    "fp32_flops_per_s": 67e12,
    "exp_per_s": 132 * 16 * 1.98e9,
    "bytes_per_s": 4.8e12,
    "sources": {
        "fp32_flops_per_s": "67 TFLOPS FP32 (non-tensor), NVIDIA H200 Tensor Core GPU datasheet "
                            "(H200 SXM column); = 132 SMs x 128 FP32 lanes x 2 x 1.98 GHz",
        "exp_per_s": "132 SMs (NVIDIA H100 Tensor Core GPU Architecture whitepaper, SXM5; the "
                     "H200 is the same GH100 die) x 16 results per clock per SM for the MUFU "
                     "base-2 exponential at compute capability 9.0 (CUDA C++ Programming Guide, "
                     "'Arithmetic Instructions' throughput table) x 1.98 GHz boost clock (the "
                     "clock that gives the datasheet's 67 TFLOPS): one MUFU.EX2 per float32 "
                     "exp, its range reduction on the FP32 lanes",
        "bytes_per_s": "4.8 TB/s HBM3e, NVIDIA H200 Tensor Core GPU datasheet",
    },
    "note": "float32 throughout; a float64 workload's FLOPs would run at the FP64 rate "
            "(34 TFLOPS non-tensor), so its H200 floor is optimistic by up to 2x on FLOPs",
}

RK_STAGES = {"rk4": 4, "heun": 2, "euler": 1, "euler_renormalise": 1, "exp_euler": 1,
             "midpoint": 2, "dopri5": 6, "tsit5": 6}
#: Config kinds whose run integrates n particles under the attention field (their n, d, t1,
#: dt, method and sweep give the field evaluations).
PARTICLE_KINDS = ("sphere", "concentration", "variants", "gaussian")
DOPRI8_EVALS = 13   # diffrax's Dopri8: 14 stages, first same as last
RODAS5_EVALS = 8


# ---------------------------------------------------------------------------------------------
# XLA's count of a loop-free unit
# ---------------------------------------------------------------------------------------------

_CACHE = {}


def analysis(fn, *args):
    """XLA's cost analysis of ``jax.jit(fn)`` at ``args`` (compiled, not run).

    Returns:
        {"flops", "transcendentals", "bytes accessed"} (those XLA reports).
    """
    import jax

    ca = jax.jit(fn).lower(*args).compile().cost_analysis()
    if isinstance(ca, (list, tuple)):  # one entry per device program in some versions
        ca = ca[0]
    return {k: float(ca[k]) for k in ("flops", "transcendentals", "bytes accessed") if k in ca}


def _cached(key, make):
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


def field_unit(n, d=3, beta=10.0, causal=False, dtype="float32"):
    """XLA's count of one dense attention-field evaluation of N particles on the sphere."""
    def make():
        import jax
        import jax.numpy as jnp

        dt = jnp.dtype(dtype)

        def field(x):
            logits = beta * x @ x.T
            if causal:
                logits = jnp.where(jnp.tril(jnp.ones((n, n), bool)), logits, -jnp.inf)
            a = jax.nn.softmax(logits, axis=-1)
            v = a @ x
            return v - jnp.sum(v * x, -1, keepdims=True) * x

        return analysis(field, jax.ShapeDtypeStruct((n, d), dt))
    return _cached(("field", n, d, beta, causal, dtype), make)


def rk4_grad_unit(n, d=3, dtype="float32"):
    """XLA's count of the gradient (forward and reverse) of one projected RK4 step."""
    def make():
        import jax
        import jax.numpy as jnp

        dt = jnp.dtype(dtype)

        def field(x, q):
            a = jax.nn.softmax(2.0 * (x @ q) @ x.T, axis=-1)
            v = a @ x
            return v - jnp.sum(v * x, -1, keepdims=True) * x

        def step(x, q, w):
            h = 0.1
            k1 = field(x, q)
            k2 = field(x + 0.5 * h * k1, q)
            k3 = field(x + 0.5 * h * k2, q)
            k4 = field(x + h * k3, q)
            y = x + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
            y = y / jnp.linalg.norm(y, axis=-1, keepdims=True)
            return jnp.sum(y * w)

        s = jax.ShapeDtypeStruct
        return analysis(jax.grad(step, argnums=(0, 1)), s((n, d), dt), s((d, d), dt), s((n, d), dt))
    return _cached(("rk4grad", n, d, dtype), make)


def attention_grad_unit(n, d=3, dtype="float32"):
    """XLA's count of the gradient of one dense attention pass (softmax(x xᵀ) x)."""
    def make():
        import jax
        import jax.numpy as jnp

        dt = jnp.dtype(dtype)

        def f(x, w):
            return jnp.sum(jax.nn.softmax(x @ x.T, axis=-1) @ x * w)

        s = jax.ShapeDtypeStruct
        return analysis(jax.grad(f), s((n, d), dt), s((n, d), dt))
    return _cached(("attgrad", n, d, dtype), make)


def moment_rhs_unit(sets, d, dtype="float64"):
    """XLA's count of the moment ODE's right-hand side for ``sets`` Gaussians.

    Σ' = AΣ + ΣAᵀ + VΣBΣ + ΣBᵀΣVᵀ, m' = Am + b + VΣBm (docs/math.md).

    Returns:
        XLA's counts.
    """
    def make():
        import jax
        import jax.numpy as jnp

        dt = jnp.dtype(dtype)

        def rhs(m, S, A, B, V, b):
            SB = S @ B
            VSBS = V @ SB @ S
            dS = A @ S + S @ jnp.swapaxes(A, -1, -2) + VSBS + jnp.swapaxes(VSBS, -1, -2)
            dm = (A @ m[..., None])[..., 0] + b + (V @ SB @ m[..., None])[..., 0]
            return dm, dS

        s = jax.ShapeDtypeStruct
        mat = s((sets, d, d), dt)
        vec = s((sets, d), dt)
        return analysis(rhs, vec, mat, mat, mat, mat, vec)
    return _cached(("moment", sets, d, dtype), make)


def sinkhorn_iteration_unit(n, d, dtype="float32"):
    """XLA's count of one dense log-domain Sinkhorn iteration (both potentials) at N."""
    def make():
        import jax
        import jax.numpy as jnp
        from jax.scipy.special import logsumexp

        dt = jnp.dtype(dtype)

        def it(x, y, f, g):
            c = jnp.sum((x[:, None, :] - y[None, :, :]) ** 2, -1)
            eps = 0.01
            f = -eps * logsumexp((g[None, :] - c) / eps, axis=1)
            g = -eps * logsumexp((f[:, None] - c) / eps, axis=0)
            return f, g

        s = jax.ShapeDtypeStruct
        return analysis(it, s((n, d), dt), s((n, d), dt), s((n,), dt), s((n,), dt))
    return _cached(("sinkhorn", n, d, dtype), make)


def density_rhs_unit(m, beta):
    """XLA's count of the density solver's right-hand side on S¹ at M cells (float64)."""
    def make():
        import jax
        import jax.numpy as jnp
        import numpy as np

        jax.config.update("jax_enable_x64", True)
        from jaxdyn import pde

        i2 = np.eye(2)
        model = pde.CircleDensity(i2, i2, i2, beta, m)
        return analysis(lambda r: model(0.0, r), jax.ShapeDtypeStruct((m,), jnp.float64))
    return _cached(("density", m, beta), make)


# ---------------------------------------------------------------------------------------------
# totals
# ---------------------------------------------------------------------------------------------

def _scaled(unit, factor):
    return {k: v * factor for k, v in unit.items()}


def _total(program, unit, repeats, bytes_min, *, exps=None, flops=None, note=""):
    """The record: XLA's unit, the repeats, the totals (our count where given)."""
    xla = _scaled(unit, repeats)
    out = {"program": program, "unit_xla": unit, "repeats": repeats,
           "flops": float(flops if flops is not None else xla.get("flops", 0.0)),
           "transcendentals": float(exps if exps is not None else xla.get("transcendentals", 0.0)),
           "bytes_accessed_xla": xla.get("bytes accessed"),
           "bytes_min": float(bytes_min)}
    if exps is not None:
        out["transcendentals_xla"] = xla.get("transcendentals")
    if flops is not None:
        out["flops_xla"] = xla.get("flops")
    if note:
        out["note"] = note
    return out


def _headline_n(rec, key="N"):
    m = re.search(rf"\b{key} = (\d+)", (rec.get("headline") or {}).get("jaxdyn", ""))
    return int(m.group(1)) if m else None


def _sibling(workload, kind):
    p = HERE / "results" / workload / f"{kind}.json"
    return json.loads(p.read_text()) if p.exists() else None


def _sweep_members(cfg):
    """Grid points of a config's sweep: {n: members} (n from the sweep or the config)."""
    sweep = cfg.get("sweep") or {}
    count = 1
    ns = None
    for key, vals in sweep.items():
        if isinstance(vals, dict) and "range" in vals:
            k = len(range(*[int(v) for v in vals["range"]]))
        elif isinstance(vals, list):
            k = len(vals)
        else:
            k = 1
        if key == "n" and isinstance(vals, list):
            ns = [int(v) for v in vals]
        else:
            count *= k
    return {n: count for n in (ns or [int(cfg["n"])])}


def particle_config(cfg, name):
    """Counts of a particle config (n, d, t1, dt, method, sweep).

    Returns:
        Every member's field evaluations, dense form; None for a config without particles.
    """
    if cfg.get("kind") not in PARTICLE_KINDS or not all(k in cfg for k in ("d", "t1", "dt")) or (
            "n" not in cfg and "n" not in (cfg.get("sweep") or {})):
        return None
    d = int(cfg["d"])
    steps = round(float(cfg["t1"]) / float(cfg["dt"]))
    stages = RK_STAGES.get(cfg.get("method", "rk4"), 4)
    dtype = cfg.get("dtype", "float32")
    size = 8 if dtype == "float64" else 4
    total = {"flops": 0.0, "transcendentals": 0.0, "bytes accessed": 0.0}
    bytes_min, members_all = 0.0, 0
    for n, members in _sweep_members(cfg).items():
        unit = field_unit(n, d, dtype=dtype)
        for k in total:
            total[k] += unit.get(k, 0.0) * members * steps * stages
        bytes_min += members * 2 * n * d * size
        members_all += members
    return {"program": f"{name}: {members_all} members x {steps} steps x {stages} field "
                       f"evaluations (dense, d = {d})",
            "flops": total["flops"], "transcendentals": total["transcendentals"],
            "bytes_accessed_xla": total["bytes accessed"], "bytes_min": bytes_min}


def _config(path, overrides=()):
    from jaxdyn.config import apply_overrides, default_config, load_yaml

    raw = default_config() if path is None else load_yaml(ROOT / path)
    return apply_overrides(raw, list(overrides))


# ---------------------------------------------------------------------------------------------
# the workloads
# ---------------------------------------------------------------------------------------------

def phase(rec, kind):
    """The published step for every system (β x systems, n = 32 on S¹), x steps."""
    w = (rec.get("result") or {}).get("workload") or {}
    systems = int(w.get("betas", 16)) * int(w.get("systems", 512))
    n, steps = int(w.get("n", 32)), int(w.get("steps", 300))
    import jax
    import jax.numpy as jnp

    def step(x):
        a = jax.nn.softmax(9.0 * jnp.einsum("snd,smd->snm", x, x), axis=-1)
        y = x + 0.1 * jnp.einsum("snm,smd->snd", a, x)
        return y / jnp.linalg.norm(y, axis=-1, keepdims=True)

    unit = _cached(("phase", systems, n), lambda: analysis(
        step, jax.ShapeDtypeStruct((systems, n, 2), jnp.float32)))
    return _total(f"the published step, {systems} systems x n = {n} on S¹, x {steps} steps",
                  unit, steps, 2 * systems * n * 2 * 4)


def _field_workload(rec, kind, default_n):
    n = _headline_n(rec) or default_n
    return _total(f"one attention-field evaluation, N = {n}, d = 3 (dense)",
                  field_unit(n), 1, 2 * n * 3 * 4 + 3 * 9 * 4)


def large_n(rec, kind):
    """One field evaluation at the headline N."""
    return _field_workload(rec, kind, 4096)


def roofline(rec, kind):
    """One field evaluation at the roofline's largest N."""
    return _field_workload(rec, kind, 8192)


def _moments_counts(res):
    j = ((res or {}).get("methods") or {}).get("jaxdyn") or {}
    w = (res or {}).get("workload") or {}
    sets, d = int(w.get("n", 4096)), int(w.get("d", 3))
    explicit, stiff = j.get("explicit_iterations"), j.get("stiff_iterations") or 0
    if explicit is None:
        return None
    unit = moment_rhs_unit(sets, d)
    per_set = {k: v / sets for k, v in unit.items()}
    evals = explicit * DOPRI8_EVALS * sets + stiff * RODAS5_EVALS * int(j.get("stiff_members") or 0)
    return _total(f"moment ODE right-hand side, d = {d}: {explicit} lock-step Dopri8 iterations "
                  f"x {DOPRI8_EVALS} evaluations x {sets} sets (+ {stiff} Rodas5 iterations on "
                  f"the stiff sets)", per_set, evals, sets * (4 * d * d + 3 * d) * 8 + sets * (
                      d * d + d) * 8,
                  note="the lock-step schedule as run: every set in every explicit iteration "
                       "(compaction drops finished sets, so the work done is at most this)")


def moments(rec, kind):
    """The batched moment solve: its right-hand sides, as many as the solver ran."""
    return _moments_counts(rec.get("result"))


def first_call(rec, kind):
    """The moments solve of the first call (compile-bound: the floor is the compute only)."""
    sib = _sibling("moments", kind)
    out = _moments_counts((sib or {}).get("result"))
    if out:
        out["note"] = ("the headline is compilation (CPU seconds): this is the work of the "
                       "computation compiled, from the moments result of the same machine kind")
    return out


def reach(rec, kind):
    """L-BFGS on the controlled moment ODE: evaluations x pieces x steps x stages x 3."""
    rows = (rec.get("result") or {}).get("rows") or []
    if not rows:
        return None
    r = max(rows, key=lambda r: r["d"])
    j = r.get("jaxdyn_lbfgs") or {}
    setup = (rec.get("result") or {}).get("setup") or {}
    pieces = int(setup.get("n_pieces", 8))
    its = sum(j.get("iterations") or [])
    trials = sum(j.get("rejected_trials") or [])
    steps = max(j.get("steps_per_piece") or [2])
    d = int(r["d"])
    evals = (its + trials) * pieces * steps * DOPRI8_EVALS * 3
    return _total(f"controlled moment ODE right-hand side, d = {d}: {its + trials} L-BFGS "
                  f"evaluations over {len(j.get('iterations') or [])} targets x {pieces} pieces "
                  f"x {steps} Dopri8 steps x {DOPRI8_EVALS} x 3 (forward, and the reverse pass "
                  f"at twice the forward's work)", moment_rhs_unit(1, d), evals,
                  (4 * d * d + 3 * d) * 8 * len(j.get("iterations") or [1]))


def pde(rec, kind):
    """One Heun step of the density on S¹: two right-hand sides (FFT convolutions)."""
    res = rec.get("result") or {}
    m, beta = int(res.get("m", 4096)), float(res.get("beta", 5.0))
    unit = density_rhs_unit(m, beta)
    fft = 2 * 3 * 3 * 5 * m * math.log2(m)  # 2 RHS x 3 convolutions x 3 FFTs x 5 M log2 M
    xla = unit.get("flops", 0.0) * 2
    return _total(f"density right-hand side at M = {m}, x 2 (Heun)", unit, 2, 2 * m * 8,
                  flops=max(xla, fft),
                  note="FLOPs: the larger of XLA's count and 3 FFT convolutions of length M per "
                       "right-hand side at 5 M log2 M each (XLA's CPU cost analysis does not see "
                       "inside an FFT)")


def _w2_counts(n, iters, density, d=3):
    n0 = 2048
    unit = sinkhorn_iteration_unit(n0, d)
    pairs = density * n * n
    per_pair = {k: v / (n0 * n0) for k, v in unit.items()}
    kept = ("the full N² kernel" if density >= 1 else
            f"{density:.4g} of the N² kernel (the multiscale geometry's kept fraction)")
    return _total(f"log-domain Sinkhorn, N = {n}: {iters} iterations x {kept} x 2 potentials; "
                  f"XLA's counts per pair at N = {n0}, scaled", per_pair, pairs * iters,
                  4 * n * d * 4)


def w2(rec, kind):
    """Sinkhorn iterations at the headline N, over the kernel entries the geometry keeps."""
    rows = [r for r in (rec.get("result") or {}).get("rows") or []
            if (r.get("jaxdyn_s") is not None or r.get("method") == "jaxdyn")
            and not r.get("skipped")]
    n = _headline_n(rec)
    r = next((r for r in rows if r["n"] == n and r.get("n_iters")), None)
    if r is None:
        return None
    return _w2_counts(n, int(r["n_iters"]), float(r.get("kernel_density") or 1.0))


def w2_cache(rec, kind):
    """The same W2 solve in a fresh process; iterations from the w2 result of the same N."""
    n = int((rec.get("result") or {}).get("n", 100000))
    sib = _sibling("w2", kind)
    rows = ((sib or {}).get("result") or {}).get("rows") or []
    r = next((r for r in rows if r.get("n") == n and r.get("n_iters")), None)
    if r is None:
        return None
    out = _w2_counts(n, int(r["n_iters"]), float(r.get("kernel_density") or 1.0))
    out["note"] = ("the headline is a whole process (start, compilation or cache load, "
                   "solve): this is the solve's work, iterations from the w2 result of this kind")
    return out


def causal(rec, kind):
    """One causal field evaluation: N(N + 1)/2 pairs."""
    n = _headline_n(rec) or 8192
    n0 = min(n, 2048)
    unit = _scaled(field_unit(n0, causal=True), (n / n0) ** 2)
    frac = (n + 1) / (2 * n)
    return _total(f"one causal attention-field evaluation, N = {n} (dense, masked; XLA's counts "
                  f"at N = {n0} scaled by N²)", unit, 1, 2 * n * 3 * 4, exps=n * (n + 1) / 2,
                  flops=unit.get("flops", 0.0) * frac,
                  note="exps and FLOPs: the N(N + 1)/2 unmasked pairs (the dense program "
                       "evaluates all N²)")


def distributed(rec, kind):
    """The sweep_large config: every member's RK4 field evaluations."""
    cfg_path = (rec.get("result") or {}).get("workload") or "configs/sweep_large.yaml"
    return particle_config(_config(cfg_path), Path(cfg_path).stem)


def startup(rec, kind):
    """The default `jaxdyn run` (the embedded default config): its particles' field evaluations."""
    out = particle_config(_config(None), "the default config")
    if out:
        out["note"] = ("the particles' field evaluations only (the run's W2 evaluations, "
                       "figures, start-up and compilation are not counted)")
    return out


def startup_configs(rec, kind):
    """The shipped configs of the run (with its overrides): the particle configs' work."""
    res = rec.get("result") or {}
    over = res.get("overrides") or {}
    total = {"flops": 0.0, "transcendentals": 0.0, "bytes_accessed_xla": 0.0, "bytes_min": 0.0}
    counted, skipped = [], []
    for row in res.get("rows") or []:
        name = row["config"]
        c = particle_config(_config(f"configs/{name}.yaml", row.get("overrides") or
                                    over.get(name) or ()), name)
        if c is None:
            skipped.append(name)
            continue
        counted.append(name)
        for k in total:
            total[k] += c[k] or 0.0
    if not counted:
        return None
    return {"program": f"field evaluations of {', '.join(counted)}", **total,
            "note": f"not counted (no particles): {', '.join(skipped) or 'none'}; "
                    "start-up, compilation and figures not counted"}


def control_measure(rec, kind):
    """One gradient of the measure flow: L layers x steps RK4 steps, forward and reverse."""
    res = rec.get("result") or {}
    n = _headline_n(rec) or 10000
    layers, steps = int(res.get("layers", 16)), int(res.get("steps_per_layer", 2))
    n0 = 2048
    unit = _scaled(rk4_grad_unit(n0), (n / n0) ** 2)
    return _total(f"the gradient of one projected RK4 step (dense, forward and reverse), "
                  f"N = {n}, x {layers} layers x {steps} steps; XLA's counts at N = {n0} "
                  f"scaled by N²", unit, layers * steps, 2 * n * 3 * 4 + layers * 3 * 9 * 4)


def control_measure_kernel(rec, kind):
    """One gradient of one attention pass at N (the kernel memory probe)."""
    n = _headline_n(rec) or 10000
    n0 = 2048
    unit = _scaled(attention_grad_unit(n0), (n / n0) ** 2)
    return _total(f"the gradient of one dense attention pass, N = {n}; XLA's counts at "
                  f"N = {n0} scaled by N²", unit, 1, 3 * n * 3 * 4)


def local(rec, kind):
    """The local kernel at the headline N, β = N: the pairs it computed (visited x N²)."""
    n = _headline_n(rec)
    cases = (rec.get("result") or {}).get("cases") or {}
    visited = None
    for r in (cases.get("keops") or {}).get("rows", []):
        if r.get("n") == n:
            visited = (r.get("jaxdyn_local") or {}).get("visited")
    if visited is None:
        visited = next((r.get("visited") for r in (cases.get("field") or {}).get("rows", [])
                        if r.get("n") == n), None)
    if n is None or not visited:
        return None
    n0 = 2048
    per_pair = {k: v / (n0 * n0) for k, v in field_unit(n0).items()}
    pairs = visited * n * n
    return _total(f"the local attention kernel, N = {n}, β = N: {visited:.3g} of the N² pairs "
                  f"(the kernel's stats.visited); XLA's per-pair counts of the dense field at "
                  f"N = {n0}, scaled", per_pair, pairs, 2 * n * 3 * 4, exps=pairs,
                  note="the pairs computed only: the ordering the kernel builds in each call "
                       "(a sort, O(N log N)) is not counted")


def interrupt(rec, kind):
    """The least work a stop waits for: one Adam step of the control kind at L = 16, N = 128."""
    n, layers, steps, n0 = 128, 16, 2, 128
    unit = rk4_grad_unit(n0)
    return _total(f"one optimiser step of control_gaussian_to_mixture at L = {layers}: the "
                  f"gradient of one projected RK4 step (dense), N = {n}, x {layers} layers x "
                  f"{steps} steps", unit, layers * steps, 2 * n * 3 * 4 + layers * 3 * 9 * 4,
                  note="a stop's floor: the segment in flight must end; start-up, compilation "
                       "and the process's exit not counted")


COSTS = {"phase": phase, "large_n": large_n, "roofline": roofline, "moments": moments,
         "reach": reach, "pde": pde, "w2": w2, "w2_cache": w2_cache, "causal": causal,
         "distributed": distributed, "first_call": first_call, "startup": startup,
         "startup_configs": startup_configs, "interrupt": interrupt,
         "control_measure": control_measure,
         "control_measure_kernel": control_measure_kernel, "local": local}


def cost_of(path):
    """The cost record of one result file, or None where it cannot be counted."""
    import jax

    path = Path(path)
    rec = json.loads(path.read_text())
    name = rec.get("workload") or path.parent.name
    kind = rec.get("machine_kind") or path.stem.split(".")[0]
    if name not in COSTS:
        return None
    out = COSTS[name](rec, kind)
    if out is None:
        return None
    out.update(backend=jax.default_backend(), jax=jax.__version__)
    return out


def measure_rates():
    """This machine's rates, measured now, per CPU-second so that other load does not count.

    The exp loop and the matmul of ``bench_roofline`` and a streaming add: each call's
    process CPU time (all threads) gives a rate per core-second (time the process waited
    for a core is not counted), the best of five calls; times the usable cores for the
    machine. The memory bandwidth: a streaming a * c + 1 over 256 MB (read and written), bytes
    per CPU-second of the call (one core's worth; a lower bound of the machine's).

    Returns:
        {"exp_per_s_per_core", "matmul_flops_per_s", "bytes_per_s", "cores", "how", ...}.
    """
    import os
    import resource
    import time

    import jax
    import jax.numpy as jnp

    sys.path.insert(0, str(HERE))
    from bench_roofline import exp_loop

    def cpu():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def best(fn, arg, work, reps=5):
        jax.block_until_ready(fn(arg))
        per_cpu, per_wall = 0.0, 0.0
        for _ in range(reps):
            c0, t0 = cpu(), time.perf_counter()
            jax.block_until_ready(fn(arg))
            c, t = cpu() - c0, time.perf_counter() - t0
            per_cpu = max(per_cpu, work / max(c, 1e-9))
            per_wall = max(per_wall, work / t)
        return per_cpu, per_wall

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    exp_cpu, exp_wall = 0.0, 0.0
    for form in ("reduce", "elementwise"):
        size = 16384
        f, reps = exp_loop(size, 2**26, form)
        a = jax.random.uniform(jax.random.PRNGKey(0), (size,), jnp.float32, -8.0, 0.0)
        c, w = best(f, a, size * reps)
        exp_cpu, exp_wall = max(exp_cpu, c), max(exp_wall, w)
    n = 2048
    m = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    mm = jax.jit(lambda a: jnp.matmul(a, a, precision=jax.lax.Precision.HIGHEST))
    mm_cpu, mm_wall = best(mm, m, 2 * n**3)
    big = jnp.ones((64 * 2**20,), jnp.float32)
    bw_cpu, bw_wall = best(jax.jit(lambda a: a * 1.0001 + 1.0), big, 2 * big.nbytes)
    return {"exp_per_s_per_core": exp_cpu, "matmul_flops_per_s": mm_cpu * cores,
            "bytes_per_s": bw_cpu, "cores": cores,
            "wall_clock": {"exp_per_s": exp_wall, "matmul_flops_per_s": mm_wall,
                           "bytes_per_s": bw_wall},
            "how": "per CPU-second (process CPU time, all threads; best of 5 calls): the float32 "
                   "exp loop of bench_roofline (16K elements, both loop forms) and a 2048³ "
                   "float32 matmul (HIGHEST) times the usable cores; memory: a streaming "
                   "a * c + 1 over 256 MB, read and written, per CPU-second (one core's worth)",
            "loadavg": list(os.getloadavg())}


def main(paths):
    """Print one JSON line: result file -> its cost record (files that cannot be counted: None)."""
    import jax

    jax.config.update("jax_enable_x64", True)  # the float64 units; every unit names its dtype
    if paths == ["--rates"]:
        print(json.dumps(measure_rates()))
        return
    out = {}
    for p in paths:
        try:
            out[str(p)] = cost_of(p)
        except Exception as e:  # one workload's count never stops the others
            out[str(p)] = {"error": f"{type(e).__name__}: {e}"[:300]}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
