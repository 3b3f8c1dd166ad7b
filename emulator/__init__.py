"""The server side: the scenario, the virtual clock, the policies, privacy accounting and the run.

Subpackages, lowest first; each imports only those before it and nodes (tests/unit/test_layering.py):

* `formats`: what the emulator reads from users and writes for itself: untrusted YAML, a user's class by
  name, JSON with parts encoded ahead.
* `privacy`: the ε theorems and their ledgers (accountants).
* `timemodel`: virtual time: links, traces, availability, the SimPy clock of a round, partial work.
* `energy`: the joules of each task, from the clock's timeline: radio power models, compute power.
* `aggregate`: the server's side of an update: impact factors, staleness rules, plausibility bounds,
  compression.
* `policies`: the server policies (the public `Policy` API) and the boundary that checks them.
* `rounds`: one round (`play_round`, `RoundRecord`), buffered mode's clients in flight, the budgets.
* `hooks` (a module): the public `RoundHook` contract.
* `config`: the scenario a user writes: loading, validation, help.
* `output`: the run directory: run.json, Parquet tables, checkpoints, TensorBoard, the summary.
* `run`: one run's lifecycle: the loops of rounds, the run's own hooks, evaluation, guards, devices.
* `cli`: Hydra as the command line, sweeps, and when an earlier run stands for a new one.
* `__main__`: `python -m emulator`.
"""
