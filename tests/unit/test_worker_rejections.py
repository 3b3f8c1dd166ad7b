"""A worker, or the evaluator, never drops a server message in silence: one that does not decode (the
network thread, Link._receive) or that it does not take (the main thread, serve and serve_evaluations)
is answered at once with `rejected`, naming why and what could be read of it."""

import argparse
import queue

import msgpack
import numpy as np
import pytest

from nodes.contracts import protocol
from nodes.worker import Link, serve, serve_evaluations
from tests.unit.test_protocol import VALID

LIMIT = 1 << 16
V = protocol.VERSION


def raw(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


class Dealer:
    """What Link._receive sends on: the messages it would have sent the server, decoded."""

    def __init__(self):
        self.sent = []

    def send_multipart(self, frames, **_):
        self.sent.append(protocol.decode(frames, LIMIT))


@pytest.fixture
def link():
    args = argparse.Namespace(id="local-0.0", parent=1, max_message_bytes=LIMIT, connect="ipc:///nowhere")
    link = Link(args, None)  # not started: the tests call its receiving end themselves
    yield link
    link.ctx.destroy(linger=0)


def task(**change) -> list[bytes]:
    fields = {**VALID["task"], "round": 4, "client": 2, **change}
    return [bytes(f) for f in protocol.encode("task", **fields).frames]


def task_header(**change) -> bytes:
    return raw({"v": V, "type": "task", **{**VALID["task"], "round": 4, "client": 2, "model": [], **change}})


NAN_MODEL = {"w": np.array([0.0, np.nan], np.float32)}
# each of decode's reasons: (frames, what the rejection reads of the message)
UNDECODABLE = [
    ("non_finite", task(model=NAN_MODEL), {"of_type": "task", "round": 4, "client": 2}),
    ("oversized", task(model={"w": np.zeros(LIMIT, np.float32)}), {"of_type": "task", "round": 4, "client": 2}),
    ("frames", [task_header(), b"\x00" * 4], {"of_type": "task", "round": 4, "client": 2}),
    ("undecodable", [b"\xc1" + b"\x00" * 8], {}),
    ("not_a_map", [raw([1, 2])], {}),
    ("version", [raw({"v": 1, "type": "task", "round": 4, "client": 2})], {"of_type": "task", "round": 4, "client": 2}),
    ("unknown_type", [raw({"v": V, "type": "launch", "round": 4})], {"of_type": "launch", "round": 4}),
    ("missing_field", [raw({"v": V, "type": "task", "round": 4})], {"of_type": "task", "round": 4}),
    ("unknown_field", [task_header(admin=True)], {"of_type": "task", "round": 4, "client": 2}),
    ("field_type", [task_header(round="x")], {"of_type": "task", "client": 2}),
    (
        "bad_tensor",
        [task_header(model=[["w", "object", [1]]]), b"\x00" * 8],
        {"of_type": "task", "round": 4, "client": 2},
    ),
    (
        "bad_compressed",
        [
            bytes(f)
            for f in protocol.encode(
                "compressed",
                **{
                    **VALID["compressed"],
                    "round": 4,
                    "parts": {"w:scale": np.ones(1, np.float32), "w:bits": np.zeros(5, np.uint8)},
                },
            ).frames
        ],
        {"of_type": "compressed", "round": 4, "client": 1},
    ),
]
NOTHING = {"of_type": "", "round": None, "client": None, "request": None}


@pytest.mark.parametrize(("reason", "frames", "seen"), UNDECODABLE, ids=[u[0] for u in UNDECODABLE])
def test_a_message_that_does_not_decode_is_answered_with_a_rejection_naming_why(link, reason, frames, seen):
    dealer = Dealer()
    link._receive(dealer, [memoryview(f) for f in frames])
    (sent,) = dealer.sent
    assert link.inbox.empty()
    with pytest.raises(protocol.ProtocolError) as e:
        protocol.decode(frames, LIMIT)
    assert sent == {"v": V, "type": "rejected", "reason": reason, "detail": str(e.value), **NOTHING, **seen}
    assert e.value.reason == reason  # each case is the reason it claims


def test_every_reason_decode_can_give_but_invalid_has_a_case():
    assert {u[0] for u in UNDECODABLE} == set(protocol.REASONS) - {"invalid"}  # invalid: a check a value broke


def test_a_message_that_decodes_goes_to_the_main_thread_unanswered(link):
    dealer = Dealer()
    link._receive(dealer, [memoryview(f) for f in task()])
    assert not dealer.sent and link.inbox.get_nowait()["client"] == 2


class Stop(Exception):
    pass


class Served(queue.Queue):
    """A link's inbox that ends the serving loop once it is empty."""

    def get(self, *args, **kwargs):
        if self.empty():
            raise Stop
        return super().get(block=False)


def replies(link, serving, kinds):
    """What `serving` (serve or serve_evaluations) sends for each message of `kinds`, decoded."""
    sent = []
    link.send = lambda message: sent.append(protocol.decode(message.frames, LIMIT))
    link.inbox = Served()
    for kind in kinds:
        msg = protocol.decode(protocol.encode(kind, **VALID[kind]).frames, LIMIT)
        msg["nbytes"] = 0
        link.inbox.put(msg)
    with pytest.raises(Stop):
        serving("local-0.0", link)
    return sent


TASKS = ("task", "task_residual", "bundle")
# every type the worker's main thread may get (shutdown ends it in the network thread); setup builds a trainer
WORKER_OTHERS = sorted(set(protocol.FIELDS) - {"setup", "shutdown"})
EVALUATOR_OTHERS = sorted(set(protocol.FIELDS) - {"evaluator_setup", "shutdown"})


@pytest.mark.parametrize("kind", WORKER_OTHERS)
def test_a_worker_answers_every_message_it_does_not_take_with_a_rejection(link, kind):
    (sent,) = replies(link, serve, [kind])
    fields = VALID[kind]
    reason, detail = (
        ("not_set_up", f"{kind} before the setup")
        if kind in TASKS
        else ("unexpected_type", f"{kind} is not a message a worker takes")
    )
    assert sent["reason"] == reason and sent["detail"] == detail and sent["of_type"] == kind
    assert sent["round"] == fields.get("round")
    assert sent["client"] == fields.get("client", fields.get("clients", [None])[0])
    assert sent["request"] == fields.get("request")


@pytest.mark.parametrize("kind", EVALUATOR_OTHERS)
def test_the_evaluator_answers_every_message_it_does_not_take_with_a_rejection(link, kind):
    (sent,) = replies(link, serve_evaluations, [kind])
    if kind == "evaluate":
        assert (sent["reason"], sent["detail"]) == ("not_set_up", "evaluate before the evaluator_setup")
        assert sent["request"] == VALID["evaluate"]["request"]
    else:
        assert (sent["reason"], sent["detail"]) == ("unexpected_type", f"{kind} is not a message the evaluator takes")
    assert sent["of_type"] == kind


def setup_then_task(link, setup: dict) -> list[dict]:
    """What a worker answers `setup` and then a task with."""
    sent = []
    link.send = lambda message: sent.append(protocol.decode(message.frames, LIMIT))
    link.inbox = Served()
    for kind, fields in (("setup", setup), ("task", VALID["task"])):
        msg = protocol.decode(protocol.encode(kind, **fields).frames, LIMIT)
        link.inbox.put({**msg, "nbytes": 0})
    with pytest.raises(Stop):
        serve("local-0.0", link)
    return sent


def test_a_worker_rejects_a_setup_naming_a_codec_it_cannot_import(link, monkeypatch):
    """The worker stays up, not set up, and the server drops it as unfit for the run (nodes.transport.inbound)."""
    from nodes import worker
    from nodes.contracts.schema import from_dict

    monkeypatch.setattr(worker, "_configured", lambda scenario, device="": (from_dict(scenario), None))
    setup = {**VALID["setup"], "scenario": {"seed": 0, "compression": {"kind": "no_such_module:Codec"}}}
    rejected, task_reply = setup_then_task(link, setup)
    assert (rejected["reason"], rejected["of_type"]) == ("unknown_codec", "setup")
    assert rejected["detail"].startswith("compression.kind = 'no_such_module:Codec': cannot import no_such_module")
    assert task_reply["reason"] == "not_set_up"


def test_a_worker_whose_setup_fails_says_why_once_and_stays_up(link, monkeypatch):
    """Its data or device cannot be set up here (a dataset missing on this node, say): one `rejected`
    naming the error, which the server drops as unfit, instead of a crash the supervisor restarts."""
    from nodes import worker

    def missing(scenario, device=""):
        raise FileNotFoundError("dataset fashion_mnist: train-images-idx3-ubyte.gz not found\nsecond line")

    monkeypatch.setattr(worker, "_configured", missing)
    rejected, task_reply = setup_then_task(link, VALID["setup"])
    assert (rejected["reason"], rejected["of_type"]) == ("setup_failed", "setup")
    assert rejected["detail"] == "FileNotFoundError: dataset fashion_mnist: train-images-idx3-ubyte.gz not found"
    assert task_reply["reason"] == "not_set_up"
