"""Virtual time: per-client links and compute (`resources`), built of each direction's rate
(`bandwidth`) and the client's losses (`loss`); the SimPy network that moves bytes (`network`), trace
files integrated exactly (`traces`), availability windows (`availability`), the SimPy clock of one
round (`clock`), partial work (`partial_work`), and read-only per-client sequences built on demand
(`by_index`).

Imports emulator.formats, emulator.privacy and nodes.
"""
