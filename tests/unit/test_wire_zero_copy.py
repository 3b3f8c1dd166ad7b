"""What makes sending tensors uncopied safe on a worker: the update it sends shares no memory
with the model that the next task is loaded into, and it trains from read-only received frames."""

import numpy as np
import pytest
import torch

from emulator.config import load
from nodes.contracts import protocol
from nodes.contracts.tasks import ClientTask
from nodes.data import load_federated
from nodes.training.trainer import build_trainer, state_to_numpy

METRICS = {"steps": 1, "train_loss": 0.5, "update_norm": 1.0}


@pytest.fixture(scope="module")
def trainer():
    torch.set_num_threads(1)
    cfg = load(None, ["clients.n=2", "data.samples_per_client=40"])
    return build_trainer(cfg, load_federated(cfg.data, 2, cfg.seed), torch.device("cpu"))


def task(client: int) -> ClientTask:
    return ClientTask(client=client, steps=2, lr=0.5, sigma=0.0, clip=0.0, q=0.5)


def received(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The state as a worker gets it: read-only arrays over the frames of a task message."""
    message = protocol.encode("task", round=0, client=0, params={}, model=state)
    model: dict[str, np.ndarray] = protocol.decode([bytearray(f) for f in message.frames], 1 << 24)["model"]
    return model


def test_an_update_in_flight_is_not_overwritten_by_the_next_task(trainer):
    w0 = received(state_to_numpy(trainer.model))
    new, _ = trainer.train(0, task(0), w0)
    update = protocol.encode("update", round=0, client=0, model=new, metrics=METRICS)
    sent = [bytes(f) for f in update.frames]
    model = [v.detach().numpy() for v in trainer.model.state_dict().values()]
    assert not any(np.shares_memory(np.frombuffer(f, np.uint8), m) for f in update.frames[1:] for m in model)
    trainer.train(0, task(1), w0)  # loads w0 into the model and trains another client
    assert [bytes(f) for f in update.frames] == sent


def test_a_worker_trains_from_read_only_frames_and_leaves_them_as_they_came(trainer):
    w0 = received(state_to_numpy(trainer.model))
    before = {k: v.copy() for k, v in w0.items()}
    assert not any(v.flags.writeable for v in w0.values())  # a write into them would raise
    new, _ = trainer.train(0, task(0), w0)
    assert all(np.array_equal(w0[k], before[k]) for k in w0)
    assert any(not np.array_equal(new[k], w0[k]) for k in w0)
