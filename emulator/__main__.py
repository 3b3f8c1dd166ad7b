"""python -m emulator scenario=dropout.yaml [key.sub=value ...]"""

from __future__ import annotations

import itertools
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import NoReturn

from emulator.config import clip

USAGE = """usage: python -m emulator [scenario=NAME_OR_PATH] [key.sub=value ...]
       python -m emulator [scenario=...] [key=value ...] --cfg job   # print the resolved config, run nothing
       python -m emulator --multirun|-m [scenario=...] key=a,b other=x,y [jobs=N]   # a grid of runs (sweep)
       python -m emulator resume RUN_DIR   # continue a killed run from its last completed round
       python -m emulator keygen DIR   # CURVE keys for transport.keys_dir (workers: --keys DIR)

Runs one emulated DP-FL experiment and writes runs/<name>/ (run.json + Parquet tables).
NAME resolves against ./ and the shipped emulator/scenarios/ folder (dropout, bandwidth, ...).

keys (default  # meaning; range):
"""
ERROR_CHARS = 2000  # a last resort: keys and values are already cut to 80 characters where echoed


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from emulator.config import ConfigError, help_text, load, split_args

    if any(a in ("-h", "--help") for a in argv):
        print(USAGE + help_text())
        return 0
    if argv[:1] == ["keygen"]:
        return _keygen(argv[1:])
    if argv[:1] == ["resume"]:
        return _resume(argv[1:])
    multirun = any(a in ("--multirun", "-m") for a in argv)
    if _wants_config(argv):
        if multirun:
            _error("--cfg job prints one run's config: give each swept key one value, without --multirun")
            return 2
        return _print_config([a for a in argv if a not in ("--cfg", "job")])
    if multirun:
        from emulator.sweep import main as sweep_main

        return sweep_main([a for a in argv if a not in ("--multirun", "-m")])
    from emulator.guards import ResourceError, preflight

    try:
        cfg = load(*split_args(argv))
        preflight(cfg)  # before the run directory exists: a run that cannot start leaves nothing
    except (ConfigError, ResourceError) as e:
        _error(e)
        return 2
    from emulator.run import run

    return _execute(lambda: run(cfg))


def _wants_config(argv: list[str]) -> bool:
    """Hydra's `--cfg job` (also `--cfg=job`)."""
    return "--cfg=job" in argv or ("--cfg", "job") in itertools.pairwise(argv)


def _print_config(argv: list[str]) -> int:
    """The scenario as the run would use it, every default filled in, as YAML; only the chosen
    policy's section (the others are never read)."""
    from omegaconf import OmegaConf

    from emulator.config import ConfigError, chosen_sections, load, split_args
    from nodes.schema import to_dict

    try:
        cfg = load(*split_args([a for a in argv if a != "--cfg=job"]))
    except ConfigError as e:
        _error(e)
        return 2
    print(OmegaConf.to_yaml(chosen_sections(to_dict(cfg))), end="")
    return 0


def _error(e: object) -> None:
    """One line on stderr, however long or multi-line the message (it may echo user input)."""
    print(f"error: {clip(' '.join(str(e).split()), ERROR_CHARS)}", file=sys.stderr)


def _resume(args: list[str]) -> int:
    if len(args) != 1:
        print("usage: python -m emulator resume RUN_DIR", file=sys.stderr)
        return 2
    from emulator.config import ConfigError
    from emulator.run import ResumeError, resume

    try:
        return _execute(lambda: resume(args[0]))
    except (ResumeError, FileNotFoundError, ConfigError) as e:
        _error(e)
        return 2


class Terminated(KeyboardInterrupt):
    """SIGTERM, what schedulers send: raised where Ctrl-C raises KeyboardInterrupt, so that it
    stops a run the same way (workers shut down, completed rounds kept, run.json interrupted)."""


def _terminate(signum: int, frame: FrameType | None) -> NoReturn:
    raise Terminated()


def _execute(start: Callable[[], Path]) -> int:
    """Run `start()` with one-line errors and the exit statuses the README documents."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from emulator.guards import ResourceError
    from emulator.results import ResultsWriteError, RunDirError
    from nodes.data.cifar import CIFARFormatError
    from nodes.data.fetch import ChecksumError
    from nodes.data.idx import IDXFormatError
    from nodes.data.locate import DatasetNotFound
    from nodes.pool import AddressError, NoWorkersLeft

    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        run_dir = start()
    except (ResourceError, AddressError, RunDirError) as e:  # refused before anything ran
        _error(e)
        return 2
    except ResultsWriteError as e:
        _error(e)
        return 1
    except (DatasetNotFound, ChecksumError, IDXFormatError, CIFARFormatError) as e:
        _error(f"data: {e}")
        return 2
    except NoWorkersLeft as e:
        _error(e)
        return 1
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM as Terminated
        how = "terminated" if isinstance(e, Terminated) else "interrupted"
        print(f"{how}; completed rounds are on disk", file=sys.stderr)
        _print_summary(getattr(e, "run_dir", None))
        return 128 + (signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT)
    finally:  # the CLI may be called in a process that handles SIGTERM its own way
        signal.signal(signal.SIGTERM, previous)
    print(f"results: {run_dir}")
    _print_summary(run_dir)
    return 0


def _print_summary(run_dir: Path | None) -> None:
    """The run's summary from what it wrote (emulator.run_summary), ending with the next command."""
    if run_dir is None or not (run_dir / "run.json").is_file():  # stopped before the run directory existed
        return
    from emulator.run_summary import summarise_run

    try:
        print(summarise_run(run_dir), flush=True)
    except (OSError, ValueError) as e:  # e.g. a disk-full run left its run.json unfinished: keep the status
        _error(f"no summary: {e}")


def _keygen(args: list[str]) -> int:
    from nodes.keys import KeysError, keygen

    if len(args) != 1:
        print("usage: python -m emulator keygen DIR", file=sys.stderr)
        return 2
    try:
        written = keygen(args[0])
    except KeysError as e:
        _error(e)
        return 2
    print("\n".join(map(str, written)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
