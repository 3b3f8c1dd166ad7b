"""Energy: what a client's radio and processor draw for each task, from the clock's own timeline.

`radio` holds the radios' power models (Huang et al., MobiSys 2012; docs/energy.md gives their
coefficients and source), one line each; `task` turns a client's `ClientTimeline` into the joules of its
download, upload, the radio's tail and its training; `battery` keeps each client's charge and finds when a
task would empty it; `model`'s `Energy` is a run's: its radio, its clients' drawn compute power and their
batteries.

Imports emulator.timemodel and nodes.
"""
