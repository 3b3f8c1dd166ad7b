"""The node side: what every process of a run shares, and what runs on a worker.

Subpackages, lowest first; each imports only those before it (tests/unit/test_layering.py):

* `contracts`: what the server and its workers agree on: the scenario schema, the wire protocol, the
  task a client is asked to do and its result, the update codecs, the named RNG streams, CURVE keys.
* `data`: federated datasets, partitions and data quality, without torch.
* `training`: a client's local training: the trainer, the DP-SGD step, bundles of clients, the models.
* `worker` (a module): the worker process, `python -m nodes.worker`.
* `transport`: the server's side of its workers: the process pool, the inbound gate, the supervisor,
  dispatch, the roster, the zygote that forks local workers, Ray actors, the evaluator process.
"""
