"""The server's side of each update: impact factors p_i (`impact`), the update rules of buffered and
asynchronous aggregation (`staleness`), the plausibility bound on an update (`plausibility`), and the
server's side of compression (`compression`).

Imports the layers below it (formats, privacy, timemodel) and nodes.
"""
