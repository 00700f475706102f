"""The ``jaxdyn`` command line.

    jaxdyn run [CONFIG] [--out DIR] [--set KEY=VALUE ...]   run an experiment (no CONFIG: the
                                                          embedded default)
    jaxdyn run [CONFIG] --resume DIR                       finish an interrupted run
    jaxdyn report DIR [--movie]                            redraw the figures from saved results
    jaxdyn config [CONFIG] [--set ...]                     print the resolved config

On CPU the host cores are exposed as JAX devices (``--xla_force_host_platform_device_count``)
before JAX starts, so sweeps shard over them; ``--no-host-devices`` or the environment
variable ``JAXDYN_NO_HOST_DEVICES=1`` turns that off.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path


def _host_devices(disable: bool):
    """Expose the host cores as XLA CPU devices; must run before JAX initialises."""
    if disable:
        return
    from .simulation._sharding import configure_host_devices

    configure_host_devices()


def _load_raw(config, overrides):
    from .config import apply_overrides, default_config, load_yaml

    raw = default_config() if config is None else load_yaml(config)
    return apply_overrides(raw, overrides)


def _prepare_precision(raw):
    """float64 configs switch on JAX's x64 mode (before any array is created)."""
    if isinstance(raw, dict) and raw.get("dtype") == "float64":
        import jax

        jax.config.update("jax_enable_x64", True)


def _cmd_run(args):
    from .config import ConfigError
    from .io import CONFIG_FILE

    if args.resume and args.out and Path(args.out) != Path(args.resume):
        raise ConfigError("give either --out DIR or --resume DIR, not both")
    if args.resume and args.config is None:
        import yaml

        cfg_path = Path(args.resume) / CONFIG_FILE
        if not cfg_path.exists():
            raise ConfigError(f"--resume {args.resume}: no {CONFIG_FILE} there; nothing to resume")
        raw = yaml.safe_load(cfg_path.read_text())
        if args.set:
            raise ConfigError("--set cannot change a run being resumed")
    else:
        raw = _load_raw(args.config, args.set)
    _prepare_precision(raw)
    from .experiments import resolve_config, run_experiment

    cfg = resolve_config(raw)  # errors before any compute
    out = Path(args.resume or args.out or Path("runs") / f"{cfg['name']}-{time.strftime('%Y%m%d-%H%M%S')}")
    args.out_dir = out
    res = run_experiment(raw, out, resume=bool(args.resume), progress=not args.quiet)
    if res.status == "ok":
        print(f"jaxdyn: done in {res.summary['elapsed_seconds']:.1f}s; results in {out}/ "
              f"({', '.join(['config.yaml', 'summary.json', 'data.nc'] + [Path(f).name for f in res.figures])})")
        return 0
    print(f"jaxdyn: run finished with status '{res.status}': {res.summary.get('message', '')}; "
          f"see {out}/summary.json", file=sys.stderr)
    return 3


def _cmd_report(args):
    from .experiments import report

    figs = report(args.dir, movie=args.movie)
    print(f"jaxdyn: redrew {len(figs)} figure(s) in {args.dir}/: {', '.join(Path(f).name for f in figs)}")
    return 0


def _cmd_config(args):
    import yaml

    raw = _load_raw(args.config, args.set)
    _prepare_precision(raw)
    from .experiments import get_kind, resolve_config

    cfg = resolve_config(raw)
    warns = get_kind(cfg["kind"]).check(cfg)
    sys.stdout.write(yaml.safe_dump(cfg, sort_keys=False))
    for w in warns or []:
        print(f"warning: {w}", file=sys.stderr)
    return 0


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def build_parser():
    p = argparse.ArgumentParser(prog="jaxdyn", description="Mean-field dynamics of Transformers in JAX.")
    p.add_argument("--no-host-devices", action="store_true",
                   help="do not expose the CPU cores as separate JAX devices")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run an experiment (no CONFIG: the embedded default)")
    r.add_argument("config", nargs="?", help="YAML config (see configs/)")
    r.add_argument("--out", help="output folder (default runs/NAME-TIMESTAMP)")
    r.add_argument("--resume", metavar="DIR", help="resume the run in DIR, skipping finished chunks")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config field, e.g. --set n=512 --set sweep.beta=[1,10]")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.set_defaults(func=_cmd_run)
    rep = sub.add_parser("report", help="redraw the figures of a finished run from its saved results")
    rep.add_argument("dir")
    rep.add_argument("--movie", action="store_true", help="also write an animation of the particles")
    rep.set_defaults(func=_cmd_report)
    c = sub.add_parser("config", help="print the resolved config (defaults filled in)")
    c.add_argument("config", nargs="?")
    c.add_argument("--set", action="append", metavar="KEY=VALUE")
    c.set_defaults(func=_cmd_config)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    # SciPy's OpenBLAS threads fight XLA's on small machines (one 384×384 eigh: 2.3 s of CPU
    # with default threads, 0.19 s with one); must be set before SciPy loads LAPACK.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    _host_devices(args.no_host_devices)
    # SIGTERM (a pre-empted job) ends the run like Ctrl-C: finished chunks stay on disk.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    from .config import ConfigError

    try:
        return args.func(args)
    except ConfigError as e:
        print(f"jaxdyn: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        where = getattr(args, "out_dir", None)
        hint = f"; resume with: jaxdyn run --resume {where}" if where else ""
        print(f"jaxdyn: interrupted; finished chunks are kept{hint}", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
