"""A client's local training for one round: the trainer (`trainer`, Opacus DP-SGD or plain SGD), the
private half of a DP-SGD step (`dp_step`), bundles of clients trained as one computation (`bundle`), the
models (`model_catalog` as plain data, `models` as torch modules), and how a training process sets up
torch (`determinism`) and its allocator (`malloc`).

Imports nodes.contracts and nodes.data.
"""
