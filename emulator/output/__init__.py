"""A run's output: the run directory with run.json and its Parquet tables (`results`), the checkpoint
(`checkpoint`), TensorBoard events (`tensorboard`), and the lines printed when a run ends (`summary`).

Imports the layers below it (up to emulator.config) and nodes.
"""
