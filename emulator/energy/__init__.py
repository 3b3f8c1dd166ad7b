"""Energy: what a client's radio and processor draw for each task, from the clock's own timeline.

`radio` holds the radios' power models (Huang et al., MobiSys 2012; docs/energy.md gives their
coefficients and source), one line each; `task` turns a client's `ClientTimeline` into the joules of its
download, upload, the radio's tail and its training, and `Energy` does so for a run's clients with their
drawn compute power.

Imports emulator.timemodel and nodes.
"""
