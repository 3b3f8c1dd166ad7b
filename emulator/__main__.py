"""python -m emulator scenario=dropout.yaml [key.sub=value ...]"""
from __future__ import annotations

import logging
import sys

USAGE = """usage: python -m emulator [scenario=NAME_OR_PATH] [key.sub=value ...]
       python -m emulator --multirun [scenario=...] key=a,b other=x,y [jobs=N]   # a grid of runs (sweep)
       python -m emulator keygen DIR   # CURVE keys for transport.keys_dir (workers: --keys DIR)

Runs one emulated DP-FL experiment and writes runs/<name>/ (run.json + Parquet tables).
NAME resolves against ./ and the shipped scenarios/ folder (dropout, bandwidth, ...).

keys (default  # meaning):
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from emulator.config import ConfigError, help_text, load
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE + help_text())
        return 0
    if argv[:1] == ["keygen"]:
        return _keygen(argv[1:])
    if "--multirun" in argv:
        from emulator.sweep import main as sweep_main
        return sweep_main([a for a in argv if a != "--multirun"])
    scenario = None
    overrides = []
    for a in argv:
        if a.startswith("scenario="):
            scenario = a.split("=", 1)[1]
        else:
            overrides.append(a)
    try:
        cfg = load(scenario, overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from emulator.run import run
    from nodes.data import DatasetNotFound
    from nodes.server import NoWorkersLeft
    try:
        run_dir = run(cfg)
    except DatasetNotFound as e:
        print(f"error: data.dataset={cfg.data.dataset}: {e}", file=sys.stderr)
        return 2
    except NoWorkersLeft as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; completed rounds are on disk", file=sys.stderr)
        return 130
    print(f"results: {run_dir}")
    return 0


def _keygen(args: list[str]) -> int:
    from emulator.keys import KeysError, keygen
    if len(args) != 1:
        print("usage: python -m emulator keygen DIR", file=sys.stderr)
        return 2
    try:
        written = keygen(args[0])
    except KeysError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(map(str, written)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
