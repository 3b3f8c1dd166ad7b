"""Offline analysis of emulator runs and sweeps: `python -m analysis PATH... [--out DIR] [--query SQL]`.

load (runs and their Parquet tables) -> summary (per-configuration table) -> plots -> report;
query answers ad-hoc SQL over the same tables.
"""
