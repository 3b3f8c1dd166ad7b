"""One run's lifecycle (`lifecycle`): where it starts (`state`), the loops of synchronous rounds
(`round_loop`) and of buffered and asynchronous ones (`buffered`), its own after-round hooks
(`run_hooks`), the evaluations of the global model (`evaluation`), the checks against the machine
(`guards`) and the devices each process trains on (`devices`).

Imports every layer below it and nodes.
"""
