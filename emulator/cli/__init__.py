"""The command line around a run: Hydra as the parser (`hydra_app`), sweeps (`sweep`), and when an earlier
run may stand for a new one (`reuse`).

The top layer below emulator.__main__.
"""
