"""python -m emulator scenario=dropout.yaml [key.sub=value ...]"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, NoReturn

from nodes.transport.zygote import discard_prestarted, prestart  # nothing heavier before prestart()

if TYPE_CHECKING:
    from emulator.config import ServerScenario

USAGE = """usage: python -m emulator [scenario=NAME_OR_PATH] [key.sub=value ...]
       python -m emulator [scenario=...] [key=value ...] --cfg job   # print the resolved config, run nothing
       python -m emulator -m|--multirun [scenario=...] key=a,b seed=range(3) [hydra/launcher=joblib]   # a sweep
       python -m emulator resume RUN_DIR   # continue a killed run from its last completed round
       python -m emulator keygen DIR   # CURVE keys for transport.keys_dir (workers: --keys DIR)
       python -m emulator -sc install=bash   # tab completion (Hydra's); --hydra-help, --info: Hydra's own

Runs one emulated DP-FL experiment and writes runs/<name>/ (run.json + Parquet tables).
NAME resolves against ./ and the shipped scenarios/ folder (dropout, bandwidth, ...).
Overrides follow Hydra's grammar: key=value, +policy_args.k=v (add), ~policy_args.k (remove),
and with -m comma lists, range(a,b), choice(...) and glob(...) sweep. Flags (-m, --cfg job) may
come anywhere among the overrides.

keys (default  # meaning; range):
"""
ERROR_CHARS = 2000  # a last resort: keys and values are already cut to 80 characters where echoed


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if _runs(argv):  # its workers' zygote starts first: their import of torch overlaps our start
        prestart()
    try:
        return _command(argv)
    finally:
        discard_prestarted()  # not taken by the run's workers: a refused scenario, another launcher


def _runs(argv: list[str]) -> bool:
    """Whether the command is a run or a resume (overrides only: no flag, no other command)."""
    return argv[:1] == ["resume"] or not any(a.startswith("-") or "=" not in a for a in argv)


def _command(argv: list[str]) -> int:
    from emulator.config import ConfigError, help_text

    if any(a in ("-h", "--help") for a in argv):
        print(USAGE + help_text())
        return 0
    if argv[:1] == ["keygen"]:
        return _keygen(argv[1:])
    if argv[:1] == ["resume"]:
        return _resume(argv[1:])
    from emulator.run.guards import ResourceError

    try:
        return _hydra_command(argv)
    except (ConfigError, ResourceError) as e:
        _error(e)
        return 2


def _hydra_command(argv: list[str]) -> int:
    """Hydra's command line: a run, a sweep (-m), --cfg, --info, -sc or --hydra-help."""
    from emulator.cli import hydra_app
    from emulator.config import ConfigError, load, split_args

    parser = hydra_app.args_parser()
    parser.error = _usage_error  # type: ignore[method-assign,assignment]  # one line, exit 2, like every refusal
    args = parser.parse_intermixed_args(argv)  # flags anywhere among the overrides: `... seed=0,1 -m`
    if args.shell_completion or args.info or args.hydra_help:
        _hydra_own(args)
        return 0
    parsed = hydra_app.parse(args.overrides)
    # Hydra's own parser reads them as we did: a bracketed IPv6 address quoted
    args.overrides = [o.input_line or "" for o in parsed]
    swept = [o.input_line for o in parsed if o.is_sweep_override()]
    if args.cfg and (args.multirun or swept):
        raise ConfigError(f"--cfg {args.cfg} prints one run's config: give each swept key one value, without -m")
    if args.multirun:
        from emulator.cli.sweep import sweep

        return sweep(parsed, argv)
    if swept:
        raise ConfigError(f"{swept[0]}: a sweep; add --multirun (-m) to run every value")
    scenario, overrides = split_args(hydra_app.task_items(parsed))
    cfg = load(scenario, overrides)
    if args.cfg in ("hydra", "all"):
        _hydra_own(args, scenario)  # Hydra's section; the job's is ours (Hydra's lacks the scenario file's keys)
    if args.cfg in ("job", "all"):
        return _print_config(cfg)
    if args.cfg:
        return 0
    from emulator.run.lifecycle import run

    if not any(o.is_hydra_override() for o in parsed):
        # Hydra's job would compose again what load has checked, in an output directory it leaves as
        # it is (hydra_app.HYDRA_SETTINGS): server CPU before round 0, for nothing (python -m bench --only startup)
        return _execute(lambda: run(cfg))
    with hydra_app.instance(scenario=scenario) as hydra:  # Hydra composes the job (hydra.* apply), runs it
        done = hydra.run(hydra_app.APP, lambda _: _execute(lambda: run(cfg)), args.overrides)
    code: int = done.return_value
    return code


def _usage_error(text: str) -> NoReturn:
    from emulator.config import ConfigError

    raise ConfigError(f"{text} (python -m emulator --help)")


def _hydra_own(args: argparse.Namespace, scenario: str | None = None) -> None:
    """What Hydra answers itself: tab completion, --info, --hydra-help, --cfg hydra (and the hydra
    section of --cfg all)."""
    from emulator.cli import hydra_app

    with hydra_app.instance(completion=args.shell_completion, scenario=scenario) as hydra:
        if args.shell_completion:
            hydra.shell_completion(config_name=hydra_app.APP, overrides=args.overrides)
        elif args.info:
            hydra.show_info(args.info, config_name=hydra_app.APP, overrides=args.overrides)
        elif args.hydra_help:
            hydra.hydra_help(config_name=hydra_app.APP, args_parser=hydra_app.args_parser(), args=args)
        else:
            hydra.show_cfg(
                config_name=hydra_app.APP,
                overrides=args.overrides,
                cfg_type="hydra",
                package=args.package,
                resolve=args.resolve,
            )


def _print_config(cfg: ServerScenario) -> int:
    """The scenario as the run would use it, every default filled in, as YAML; only the chosen
    policy's section (the others are never read)."""
    from omegaconf import OmegaConf

    from emulator.config import chosen_sections
    from nodes.contracts.schema import to_dict

    print(OmegaConf.to_yaml(chosen_sections(to_dict(cfg))), end="")
    return 0


def _error(e: object) -> None:
    """One line on stderr, however long or multi-line the message (it may echo user input)."""
    from emulator.config import clip

    print(f"error: {clip(' '.join(str(e).split()), ERROR_CHARS)}", file=sys.stderr)


def _resume(args: list[str]) -> int:
    if len(args) != 1:
        print("usage: python -m emulator resume RUN_DIR", file=sys.stderr)
        return 2
    from emulator.config import ConfigError
    from emulator.run.lifecycle import ResumeError, resume

    try:
        return _execute(lambda: resume(args[0]))
    except (ResumeError, FileNotFoundError, ConfigError) as e:
        _error(e)
        return 2


class Terminated(KeyboardInterrupt):
    """SIGTERM, what schedulers send: raised where Ctrl-C raises KeyboardInterrupt, so that it
    stops a run the same way (workers shut down, completed rounds kept, run.json interrupted)."""


# SIGTERMs received while _execute runs: Ray's blocking calls (ray.wait, ray.get; its
# _raylet.check_signals) catch the handler's Terminated and raise a plain KeyboardInterrupt in its
# place, which made a scheduler's stop exit 130 as "interrupted"
_sigterms: list[int] = []


def _terminate(signum: int, frame: FrameType | None) -> NoReturn:
    _sigterms.append(signum)
    raise Terminated()


def _execute(start: Callable[[], Path]) -> int:
    """Run `start()` with one-line errors and the exit statuses the README documents."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from emulator.output.results import ResultsWriteError, RunDirError
    from emulator.policies.boundary import PolicyError
    from emulator.privacy import AccountantError
    from emulator.rounds.round import ModelNotFinite
    from emulator.run.guards import ResourceError
    from nodes.data.cifar import CIFARFormatError
    from nodes.data.fetch import ChecksumError
    from nodes.data.idx import IDXFormatError
    from nodes.data.locate import DatasetNotFound
    from nodes.data.spec import DatasetMismatch
    from nodes.transport.evaluator import EvaluatorError
    from nodes.transport.inbound import AddressError
    from nodes.transport.supervisor import NoWorkersLeft

    _sigterms.clear()
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        run_dir = start()
    except (ResourceError, AddressError, RunDirError) as e:  # refused before anything ran
        _error(e)
        return 2
    except ResultsWriteError as e:
        _error(e)
        return 1
    except (DatasetNotFound, ChecksumError, IDXFormatError, CIFARFormatError, DatasetMismatch) as e:
        _error(f"data: {e}")
        return 2
    except (NoWorkersLeft, EvaluatorError, PolicyError, AccountantError, ModelNotFinite) as e:
        _error(e)
        return 1
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM as Terminated
        terminated = isinstance(e, Terminated) or bool(_sigterms)
        how = "terminated" if terminated else "interrupted"
        print(f"{how}; completed rounds are on disk", file=sys.stderr)
        _print_summary(getattr(e, "run_dir", None))
        return 128 + (signal.SIGTERM if terminated else signal.SIGINT)
    finally:  # the CLI may be called in a process that handles SIGTERM its own way
        signal.signal(signal.SIGTERM, previous)
    print(f"results: {run_dir}")
    _print_summary(run_dir)
    return 0


def _print_summary(run_dir: Path | None) -> None:
    """The run's summary from what it wrote (emulator.output.summary), ending with the next command."""
    if run_dir is None or not (run_dir / "run.json").is_file():  # stopped before the run directory existed
        return
    from emulator.output.summary import summarise_run

    try:
        print(summarise_run(run_dir), flush=True)
    except (OSError, ValueError) as e:  # e.g. a disk-full run left its run.json unfinished: keep the status
        _error(f"no summary: {e}")


def _keygen(args: list[str]) -> int:
    from nodes.contracts.keys import KeysError, keygen

    if len(args) != 1:
        print("usage: python -m emulator keygen DIR", file=sys.stderr)
        return 2
    try:
        written = keygen(args[0])
    except KeysError as e:
        _error(e)
        return 2
    except OSError as e:  # a parent that is a file, a read-only or full disk: one line, not a traceback
        _error(f"keygen {args[0]}: {e}")
        return 2
    print("\n".join(map(str, written)))
    return 0


def cli() -> NoReturn:
    """`python -m emulator` and the `dpfl-emulator` script. A run or a resume leaves with os._exit once
    its output is flushed: every result is written and every worker stopped when main returns, and
    the interpreter's teardown of the server's modules (pyarrow, pandas, Hydra) is a visible share of a
    short run (python -m bench --only w2). Other commands (a sweep's launchers, keygen) exit as usual."""
    argv = sys.argv[1:]
    code = main(argv)
    if not _runs(argv):
        sys.exit(code)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream: nothing left to say
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    cli()
