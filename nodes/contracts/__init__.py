"""What the server and its workers agree on, as plain data: the scenario schema (`schema`), the wire
format (`protocol`), the task a client is asked to do and its result (`tasks`), the update codecs
(`codecs`), the named RNG streams (`rng`) and CURVE keys (`keys`).

The lowest layer: it imports nothing else of the project, and none of it imports torch.
"""
