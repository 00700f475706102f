"""The ``jaxdyn`` command line.

    jaxdyn run [CONFIG] [--out DIR] [--set KEY=VALUE ...]   run an experiment (no CONFIG: the
                                                          embedded default); --force to run
                                                          into a non-empty foreign DIR
    jaxdyn run [CONFIG] --resume DIR                       finish an interrupted run
    jaxdyn report DIR [--movie]                            redraw the figures from saved results
    jaxdyn config [CONFIG] [--set ...]                     print the resolved config
    jaxdyn kinds [KIND]                                    the experiment kinds; a kind's config
                                                          fields (--markdown: the reference
                                                          page docs/guides/config-reference.md)
    jaxdyn --version                                       the installed version
    jaxdyn run CONFIG --out DIR --distributed              one process of several (jax.distributed;
                                                          --distributed-timeout SECONDS bounds
                                                          the wait for the others)

Exit codes (README, "What `jaxdyn run` writes"): 0 done (``summary.json`` says ``ok``, or
``some_unsuccessful`` / ``all_unsuccessful`` where grid points' result codes are not
``successful``, with one more line naming them); 1 the run failed (an OS error such
as a full disk; ``summary.json`` says ``failed``); 2 a bad input, refused before any compute
(the message names it); 3 finished with non-finite states; 4 another run holds the folder;
128 + the signal number (130 Ctrl-C, 143 SIGTERM) when interrupted: the run stops at the
kind's next progress report (between two jitted segments), or, when a compilation or one long
call holds the signal, ``HARD_STOP_SECONDS`` after it (a watchdog thread).

On CPU the host cores are exposed as JAX devices (``--xla_force_host_platform_device_count``)
before JAX starts, so sweeps shard over them; ``--no-host-devices`` or the environment
variable ``JAXDYN_NO_HOST_DEVICES=1`` turns that off.

``jaxdyn run`` keeps compiled programs in JAX's persistent compilation cache
(:func:`jaxdyn.enable_compilation_cache`: ``$XDG_CACHE_HOME/jaxdyn/jax`` or
``~/.cache/jaxdyn/jax``, or ``$JAXDYN_CACHE_DIR``), so a second run compiles almost nothing;
``--no-cache`` or ``JAXDYN_NO_CACHE=1`` turns that off.

Only the standard library and the config reader load before a command runs: ``jaxdyn
--help``, ``jaxdyn run --help``, ``jaxdyn --version``, ``jaxdyn config`` and ``jaxdyn kinds``
import no JAX. The command's programs hold no host callback:
unless ``EQX_ON_ERROR`` is set, it is ``nan`` (equinox's runtime checks return NaN, which ends
as a non-finite grid point, instead of raising through a callback), so that JAX's persistent
cache can store every program.
"""

from __future__ import annotations

import argparse
import functools
import json
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


def _compilation_cache(disable: bool):
    """The persistent compilation cache, unless ``--no-cache`` or ``JAXDYN_NO_CACHE=1``."""
    if disable or os.environ.get("JAXDYN_NO_CACHE", "").strip() not in ("", "0"):
        return None
    from ._compile import enable_compilation_cache

    return enable_compilation_cache()


def _load_raw(config, overrides):
    from .config import apply_overrides, default_config, load_yaml

    raw = default_config() if config is None else load_yaml(config)
    return apply_overrides(raw, overrides)


def _prepare_precision(raw):
    """Switch on JAX's x64 mode for a float64 config, before any array is created.

    Through the variable JAX reads when it loads if it has not (``jaxdyn config`` loads no JAX).
    """
    dtype = raw.get("dtype") if isinstance(raw, dict) else None
    if isinstance(raw, dict) and dtype is None and isinstance(raw.get("kind"), str):
        # the kind's default (float64 for the pde, gaussian and reachability kinds: a config
        # without a dtype needs x64 too); its schema loads no JAX
        try:
            from .experiments import get_kind

            field = get_kind(raw["kind"]).SCHEMA.get("dtype")
            dtype = getattr(field, "default", None)
        except Exception:  # an unknown kind: resolve_config names it
            dtype = None
    if dtype == "float64":
        if "jax" in sys.modules:
            sys.modules["jax"].config.update("jax_enable_x64", True)
        else:
            os.environ["JAX_ENABLE_X64"] = "1"


EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_NONFINITE, EXIT_LOCKED = 0, 1, 2, 3, 4


def _join_cluster(timeout_option, refusal=None):
    """Join the cluster of a ``--distributed`` run (:func:`.experiments.processes.join_cluster`).

    Args:
      timeout_option: the ``--distributed-timeout`` option (None: the environment or 120 s).
      refusal: this process's refusal of its config, told to the other processes and raised.

    Raises:
      ConfigError: ``refusal`` as it is; the cluster cannot form, or a bad timeout (the message
        names the cause).
    """
    from .config import ConfigError
    from .experiments.processes import join_cluster

    try:
        join_cluster(timeout_option, refusal=refusal)
    except ConfigError as e:
        if e is refusal:
            raise
        raise ConfigError(f"--distributed: {e}") from None


def _run_config(args):
    """The raw and resolved config of ``jaxdyn run`` (files read, ``--set`` applied, checked).

    Loads no JAX: with ``--distributed`` it runs before the processes connect.

    Returns:
      (raw config, resolved config).

    Raises:
      ConfigError: a bad config or bad arguments (the message names it).
    """
    from .config import ConfigError, load_yaml
    from .experiments import resolve_config
    from .io import CONFIG_FILE

    if args.resume and args.out and Path(args.out) != Path(args.resume):
        raise ConfigError("give either --out DIR or --resume DIR, not both")
    if args.resume and args.force:
        raise ConfigError("--force overwrites a folder; it cannot be combined with --resume")
    if args.resume and args.config is None:
        cfg_path = Path(args.resume) / CONFIG_FILE
        if not Path(args.resume).is_dir():
            raise ConfigError(f"--resume {args.resume}: no such folder")
        if not cfg_path.exists():
            raise ConfigError(f"--resume {args.resume}: no {CONFIG_FILE} there; nothing to resume")
        if args.set:
            raise ConfigError("--set cannot change a run being resumed")
        raw = load_yaml(cfg_path)
    else:
        raw = _load_raw(args.config, args.set)
    _prepare_precision(raw)
    try:
        return raw, resolve_config(raw)  # errors before any compute
    except ConfigError as e:
        if args.resume and args.config is None:
            raise ConfigError(f"--resume {args.resume}: its {CONFIG_FILE}: {e}") from None
        raise


def _cmd_run(args):
    from .config import ConfigError

    if args.distributed and not (args.out or args.resume):
        raise ConfigError("--distributed needs --out DIR (or --resume DIR): the same folder "
                          "for every process")
    try:
        raw, cfg = _run_config(args)
    except ConfigError as e:
        if args.distributed:  # the others are told at the check-in; nothing connects
            _join_cluster(args.distributed_timeout, refusal=e)
        raise
    if args.distributed:  # before JAX starts: join the cluster (README, "Several processes")
        _join_cluster(args.distributed_timeout)
    _compilation_cache(args.no_cache)
    from .experiments import run_experiment

    out = Path(args.resume or args.out or Path("runs") / f"{cfg['name']}-{time.strftime('%Y%m%d-%H%M%S')}")
    args.out_dir = out
    res = run_experiment(raw, out, resume=bool(args.resume), progress=not args.quiet,
                         force=args.force)
    if not res.writer:  # another process of a --distributed run: its one line is printed
        return 0
    if res.status in ("ok", "some_unsuccessful", "all_unsuccessful"):
        sm = res.summary
        timing = (f" ({sm['compile_seconds']:.1f}s compiling, {sm['compute_seconds']:.1f}s "
                  "computing)" if "compile_seconds" in sm else "")
        print(f"jaxdyn: done in {sm['elapsed_seconds']:.1f}s{timing}; results in {out}/ "
              f"({', '.join(['config.yaml', 'summary.json', 'data.nc'] + [Path(f).name for f in res.figures])})")
        if res.status != "ok":  # finite results, but some points' solves did not succeed
            print(f"jaxdyn: status '{res.status}': {sm.get('message', '')}; see {out}/summary.json",
                  file=sys.stderr)
        return 0
    print(f"jaxdyn: run finished with status '{res.status}': {res.summary.get('message', '')}; "
          f"see {out}/summary.json", file=sys.stderr)
    return EXIT_NONFINITE


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


def _kind_summary(name):
    """The one-line description of a kind: the first line of its package's docstring."""
    from .experiments import get_kind

    lines = (get_kind(name).__doc__ or "").strip().splitlines()
    first = lines[0].strip() if lines else ""
    prefix = f"Experiment kind ``{name}``: "
    return first[len(prefix):] if first.startswith(prefix) else first


def _kind_rows(name):
    """The reference rows of a kind's own fields (:func:`.config.schema_rows`)."""
    from .config import schema_rows
    from .experiments import get_kind

    return schema_rows(get_kind(name).SCHEMA)


def _common_rows():
    """The reference rows of the fields every kind takes (the engine's)."""
    from .config import schema_rows
    from .experiments.planning import ENGINE_FIELDS

    return schema_rows(ENGINE_FIELDS)


def _text_rows(rows):
    import textwrap

    out = []
    for r in rows:
        head = f"  {r['name']}: {r['type']}"
        if r["default"] != "(its fields)":
            head += " (required)" if r["default"] == "required" else f" = {r['default']}"
        if r["choices"]:
            head += f"; one of: {', '.join(r['choices'])}"
        if r["sweepable"]:
            head += "; sweepable"
        out.append(head)
        if r["doc"]:
            out += textwrap.wrap(r["doc"], width=92, initial_indent=" " * 6,
                                 subsequent_indent=" " * 6)
    return out


def _md_cell(text):
    """Text for a Markdown table cell: the characters Markdown would read escaped."""
    for c in "\\`*_|[]":
        text = text.replace(c, "\\" + c)
    return text.replace("<", "&lt;").replace("{", "&#123;").replace("}", "&#125;")


def _md_table(rows):
    out = ["| field | type | default | values | description |", "|---|---|---|---|---|"]
    for r in rows:
        kind = f"{r['type']}, sweepable" if r["sweepable"] else r["type"]
        default = r["default"] if r["default"] in ("required", "(its fields)") else f"`{r['default']}`"
        values = ", ".join(f"`{c}`" for c in r["choices"])
        out.append(f"| `{r['name']}` | {kind} | {default} | {values} | {_md_cell(r['doc'])} |")
    return out


def reference_markdown() -> str:
    """The config reference page (docs/guides/config-reference.md), from the kinds' schemas.

    Returns:
      The page's Markdown: the fields every kind takes, then each kind's own, as tables.
    """
    from .experiments import KINDS

    import textwrap

    intro = (
        "Every field of every experiment kind: its type, its default, the values it takes and "
        "what it sets. A config is a YAML mapping whose `kind:` names one of the kinds below; a "
        "field left out takes its default; a field of a section is written inside it "
        "(`weights.seed` is `weights: {seed: 1}`). The fields marked *sweepable* may be given "
        "values under `sweep:`, which makes a grid of their product: a list, or "
        "`{range: [start, stop, step]}`, `{linspace: [start, stop, num]}`, "
        "`{logspace: [start, stop, num]}` ([Sweeps and the CLI](cli.md)). "
        "`jaxdyn config CONFIG` prints a config resolved, defaults filled in; in a terminal, "
        "`jaxdyn kinds` lists the kinds and `jaxdyn kinds KIND` a kind's fields.")
    source = ("This page is generated from the kinds' schemas (`jaxdyn/experiments/*/schema.py`) "
              "by `jaxdyn kinds --markdown > docs/guides/config-reference.md`; "
              "`tests/test_newcomer_cli.py` checks that it is up to date.")
    wrap = functools.partial(textwrap.wrap, width=100, break_on_hyphens=False)
    lines = [
        "# Config reference",
        "",
        *wrap(intro),
        "",
        *wrap(source),
        "",
        "| kind | what it runs |",
        "|---|---|",
        *(f"| [`{k}`](#{k}) | {_md_cell(_kind_summary(k))} |" for k in KINDS),
        "",
        "## Fields of every kind",
        "",
        *_md_table(_common_rows()),
    ]
    for k in KINDS:
        lines += ["", f"## {k}", "", _md_cell(_kind_summary(k)), "", *_md_table(_kind_rows(k))]
    return "\n".join(lines) + "\n"


def _cmd_kinds(args):
    from .config import ConfigError
    from .experiments import KINDS

    if args.markdown:
        if args.kind is not None:
            raise ConfigError("--markdown writes the page of every kind: give no KIND")
        sys.stdout.write(reference_markdown())
        return 0
    if args.kind is None:
        width = max(map(len, KINDS))
        lines = ["Experiment kinds (the `kind:` of a config; `jaxdyn kinds KIND` lists a kind's "
                 "fields):", ""]
        lines += [f"  {k:<{width}}  {_kind_summary(k)}" for k in KINDS]
        sys.stdout.write("\n".join(lines) + "\n")
        return 0
    if args.kind not in KINDS:
        raise ConfigError(f"unknown experiment kind {args.kind!r}; known kinds: {', '.join(KINDS)}")
    lines = [f"kind {args.kind}: {_kind_summary(args.kind)}", "",
             "Its fields (NAME: TYPE = DEFAULT; `sweepable`: may take a list of values under "
             "`sweep:`):", "", *_text_rows(_kind_rows(args.kind)), "",
             "Fields of every kind:", "", *_text_rows(_common_rows())]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _raise_interrupt(signum, frame):
    from .io import PENDING_SIGNALS

    PENDING_SIGNALS.append(signum)
    raise KeyboardInterrupt(f"signal {signum}")


#: seconds a signal may wait for the computation in flight before ``jaxdyn run`` stops without
#: it (an XLA compilation or one long jitted call holds Python's handler until it returns);
#: the environment variable ``JAXDYN_HARD_STOP_SECONDS`` sets another
HARD_STOP_SECONDS = 20.0


def _hard_stop_seconds() -> float:
    try:
        return float(os.environ.get("JAXDYN_HARD_STOP_SECONDS", HARD_STOP_SECONDS))
    except ValueError:
        return HARD_STOP_SECONDS


def _stop_hard(signum, out):
    """Stop the process now: ``summary.json`` says interrupted, finished chunks stay on disk.

    The chunk files are written atomically and the folder's lock is an ``flock`` the system
    releases at exit, so ``--resume`` continues from the chunks on disk.
    """
    from . import io as jio

    hint = ""
    if out is not None:
        hint = f"; resume with: jaxdyn run --resume {out}"
        try:
            path = Path(out) / jio.SUMMARY_FILE
            summary = json.loads(path.read_text())
            if summary.get("status") == "running":
                done = len(list((Path(out) / "chunks").glob("chunk_*.npz")))
                jio.write_json(path, {**summary, "status": "interrupted", "chunks_done": done,
                                      "error": f"KeyboardInterrupt: signal {signum} (stopped "
                                               f"after {_hard_stop_seconds():g} s without the "
                                               "computation in flight)"})
        except (OSError, ValueError):  # no summary yet, or a full disk: it stays as it is
            pass
    sys.stderr.write(f"\njaxdyn: interrupted; the computation in flight (an XLA compilation or "
                     f"a long call) held the signal over {_hard_stop_seconds():g} s, so the run "
                     f"stopped without it; finished chunks are kept{hint}\n")
    sys.stderr.flush()
    os._exit(128 + int(signum))


class _Watchdog:
    """Stops ``jaxdyn run`` hard when a signal's ``KeyboardInterrupt`` is held too long.

    Python runs a signal handler only between bytecodes of the main thread; while XLA compiles
    or runs one call (Python's lock released) the handler waits. The signal also wakes this
    thread (:func:`signal.set_wakeup_fd`); if the main thread has not finished stopping
    ``HARD_STOP_SECONDS`` later (or ``$JAXDYN_HARD_STOP_SECONDS``), :func:`_stop_hard` ends
    the process.
    """

    def __init__(self, args):
        import socket
        import threading

        self.args = args
        self.done = threading.Event()
        self.rsock, self.wsock = socket.socketpair()
        self.wsock.setblocking(False)
        self.old_fd = signal.set_wakeup_fd(self.wsock.fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._watch, name="jaxdyn-stop-watchdog", daemon=True).start()

    def _watch(self):
        try:
            data = self.rsock.recv(1)
        except OSError:
            data = b""
        finally:
            self.rsock.close()
        if not data or self.done.is_set():
            return
        signum = data[0]
        if self.done.wait(_hard_stop_seconds()):
            return
        if signal.getsignal(signum) is _raise_interrupt:  # not a cluster's deferred signals
            _stop_hard(signum, getattr(self.args, "out_dir", None))

    def close(self):
        """Disarm (the command has ended): restore the previous wakeup fd, end the thread."""
        self.done.set()
        signal.set_wakeup_fd(self.old_fd)
        try:
            self.wsock.send(b"\0")  # wakes the thread, which sees ``done`` and ends
        except OSError:  # the buffer holds a signal's byte already: it wakes on that
            pass
        self.wsock.close()


def _unraisable(previous, unraisable):
    """Python's hook for an exception it cannot raise, silent for a signal's interrupt.

    The handler's ``KeyboardInterrupt`` raised inside a callback (XLA's garbage-collection
    callback) is lost, and Python would print its traceback; the signal is recorded all the
    same (``PENDING_SIGNALS``) and stops the run at its next check.
    """
    if not issubclass(unraisable.exc_type, KeyboardInterrupt):
        previous(unraisable)


def _raise_pending():
    """Raise the ``KeyboardInterrupt`` of a signal the handler recorded but Python swallowed."""
    from .io import PENDING_SIGNALS

    if PENDING_SIGNALS:
        raise KeyboardInterrupt(f"signal {PENDING_SIGNALS[-1]}")


def _version():
    """The version of the running package (``jaxdyn.__version__``, its installed metadata's)."""
    from . import __version__

    return __version__


def build_parser():
    """The argument parser of the ``jaxdyn`` command.

    Returns:
      The parser (subcommands ``run``, ``report``, ``config``, ``kinds``).
    """
    p = argparse.ArgumentParser(prog="jaxdyn", description="Mean-field dynamics of Transformers in JAX.")
    p.add_argument("--no-host-devices", action="store_true",
                   help="do not expose the CPU cores as separate JAX devices (one CPU device; "
                        "the same as the environment variable JAXDYN_NO_HOST_DEVICES=1)")
    p.add_argument("--version", action="version", version=f"jaxdyn {_version()}",
                   help="print the installed version and exit")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run an experiment (no CONFIG: the embedded default)")
    r.add_argument("config", nargs="?", help="YAML config (see configs/)")
    r.add_argument("--out", help="output folder (default runs/NAME-TIMESTAMP)")
    r.add_argument("--resume", metavar="DIR", help="resume the run in DIR, skipping finished chunks")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config field, e.g. --set n=512 --set sweep.beta=[1,10]")
    r.add_argument("--force", action="store_true",
                   help="run into a non-empty --out that is not a run of this config, replacing "
                        "the results there (other files are left alone)")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.add_argument("--no-cache", action="store_true",
                   help="do not use the persistent compilation cache (~/.cache/jaxdyn/jax; "
                        "also JAXDYN_NO_CACHE=1)")
    r.add_argument("--distributed", action="store_true",
                   help="one of several processes (jax.distributed) running this config into the "
                        "same --out, described as jax.distributed.initialize takes it: "
                        "JAX_COORDINATOR_ADDRESS with JAXDYN_NUM_PROCESSES and JAXDYN_PROCESS_ID, "
                        "or what JAX detects (SLURM, Open MPI) for any of them; process 0 writes")
    r.add_argument("--distributed-timeout", metavar="SECONDS",
                   help="with --distributed: how long every process waits for the others to start "
                        "and join (default 120; also JAXDYN_DISTRIBUTED_TIMEOUT); past it, one "
                        "line names the processes missing")
    r.set_defaults(func=_cmd_run)
    rep = sub.add_parser("report", help="redraw the figures of a finished run from its saved results")
    rep.add_argument("dir")
    rep.add_argument("--movie", action="store_true", help="also write an animation of the particles")
    rep.set_defaults(func=_cmd_report)
    c = sub.add_parser("config", help="print the resolved config (defaults filled in)")
    c.add_argument("config", nargs="?")
    c.add_argument("--set", action="append", metavar="KEY=VALUE")
    c.set_defaults(func=_cmd_config)
    k = sub.add_parser("kinds", help="list the experiment kinds, or one kind's config fields",
                       description="List the experiment kinds (the `kind:` of a config), or the "
                                   "config fields of one: name, type, default, allowed values, "
                                   "help. The same tables are docs/guides/config-reference.md.")
    k.add_argument("kind", nargs="?", help="a kind: list its fields (name, type, default, values)")
    k.add_argument("--markdown", action="store_true",
                   help="print the config reference page of every kind in Markdown")
    k.set_defaults(func=_cmd_kinds)
    return p


def _prepare_process(args):
    """The process's environment, set before SciPy, equinox and JAX load."""
    # SciPy's OpenBLAS threads fight XLA's on small machines (``encoder.limit_blas_threads``);
    # must be set before SciPy loads LAPACK.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # Programs without host callbacks: equinox's runtime checks (diffrax's own, on the step and
    # save times, which jaxdyn also checks on the host before tracing) return NaN instead of
    # raising through a callback (equinox's documented EQX_ON_ERROR, read when it loads; a NaN
    # ends as a non-finite grid point). JAX's persistent cache stores no program holding a
    # callback: with the default "raise" the default run's segment program would compile again
    # in every process.
    os.environ.setdefault("EQX_ON_ERROR", "nan")
    # host devices only where JAX runs (a run, a report); `jaxdyn config` and `jaxdyn kinds`
    # load no JAX
    _host_devices(args.no_host_devices or args.command in ("config", "kinds"))


def _catch_signals():
    """SIGTERM (a pre-empted job) and SIGINT end the run like Ctrl-C: finished chunks stay on disk.

    Returns:
      The handlers replaced, by signal (none off the main thread: the caller handles signals).
    """
    from .io import PENDING_SIGNALS

    PENDING_SIGNALS.clear()
    old_handlers = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            old_handlers[sig] = signal.signal(sig, _raise_interrupt)
        except ValueError:  # not the main thread: the caller handles signals
            pass
    return old_handlers


def _interrupted(args, argv):
    """Report an interrupted command; the process's own ``run`` ends at once.

    Returns:
      128 + the signal's number.
    """
    from .io import PENDING_SIGNALS

    where = getattr(args, "out_dir", None)
    hint = f"; resume with: jaxdyn run --resume {where}" if where else ""
    print(f"jaxdyn: interrupted; finished chunks are kept{hint}", file=sys.stderr)
    signum = PENDING_SIGNALS[-1] if PENDING_SIGNALS else signal.SIGINT
    if argv is None and args.command == "run":
        # the process's own command: end now, without the interpreter's teardown (JAX's
        # objects of an interrupted trace or compilation can crash it, or hold it seconds);
        # the chunks and summary.json are on disk, the folder's lock goes with the process
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + int(signum))
    return 128 + int(signum)


def main(argv=None):
    """Run the ``jaxdyn`` command.

    Args:
      argv: the arguments (default: the process's).

    Returns:
      The exit status (module doc).
    """
    args = build_parser().parse_args(argv)
    _prepare_process(args)
    from .io import PENDING_SIGNALS

    old_handlers = _catch_signals()
    from .config import ConfigError

    watchdog = _Watchdog(args) if args.command == "run" and old_handlers else None
    old_unraisable = sys.unraisablehook
    sys.unraisablehook = functools.partial(_unraisable, old_unraisable)
    try:
        rc = args.func(args)
        _raise_pending()  # a signal whose exception Python swallowed (a GC callback)
        return rc
    except ConfigError as e:
        from .experiments.engine import RunLockedError

        print(f"jaxdyn: error: {e}", file=sys.stderr)
        return EXIT_LOCKED if isinstance(e, RunLockedError) else EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return _interrupted(args, argv)
    except OSError as e:  # a full disk, a permission lost mid-run: one line, status failed
        where = getattr(args, "out_dir", None)
        what = e.strerror or str(e)
        name = f" ({e.filename})" if getattr(e, "filename", None) else ""
        hint = f"; finished chunks are kept, resume with: jaxdyn run --resume {where}" if where else ""
        print(f"jaxdyn: error: {type(e).__name__}: {what}{name}{hint}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise  # a bug: the traceback is the report (summary.json says failed)
        where = getattr(args, "out_dir", None)
        hint = f"; finished chunks are kept, resume with: jaxdyn run --resume {where}" if where else ""
        print(f"jaxdyn: error: out of memory ({' '.join(str(e).split())[:160]}): lower n or set a "
              f"smaller chunk_size / memory_budget_gb{hint}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        sys.unraisablehook = old_unraisable
        if watchdog is not None:
            watchdog.close()
        for sig, h in old_handlers.items():
            signal.signal(sig, h)
        PENDING_SIGNALS.clear()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
