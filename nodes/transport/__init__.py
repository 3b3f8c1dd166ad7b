"""The server's side of its workers: the process pool (`pool`) over three parts (the inbound gate
`inbound`, the `supervisor`, `dispatch`) that share the `roster`; the `zygote` that forks local workers,
workers as Ray actors (`ray_workers`), and the server's evaluator process (`evaluator`).

Imports the rest of nodes; the emulator drives it.
"""
