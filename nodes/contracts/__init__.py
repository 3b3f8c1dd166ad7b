"""What the server and its workers agree on, as plain data: the scenario schema (`schema`, a package
of its sections), the wire format (`protocol`), the task a client is asked to do and its result
(`tasks`), the update codecs (`codecs`), the named RNG streams (`rng`), CURVE keys (`keys`), and the
plug-ins a user names as `package.module:ClassName` (`plugins`).

The lowest layer: it imports nothing else of the project, and none of it imports torch.
"""
