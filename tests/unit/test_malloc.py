"""A trainer's process keeps the memory it frees: its DP-SGD steps do not fault their temporaries in
again each step (nodes/malloc.py). Counted in fresh processes, as malloc's state is per process."""

import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt thresholds are glibc's")

# Page faults per bk step of the FashionMNIST CNN (batch 64), a Trainer built first when asked
# ("trainer"): the quietest of three windows of twenty steps, as this VM's memory reclaim (kdamond)
# now and then takes pages back from any process and a window's count jumps (31 faults a step once,
# 0-20 otherwise); the malloc setting shows in every window.
STEPS = """
import resource, sys, torch
from emulator.config import load
from nodes.data import load_federated
from nodes.dp_step import PrivateStep
from nodes.models import build_model
from nodes.schema import ModelConfig
from nodes.trainer import Trainer

if sys.argv[1] == "trainer":
    cfg = load(None, ["clients.n=2"])
    Trainer(cfg, load_federated(cfg.data, 2, cfg.seed), torch.device("cpu"))
torch.set_num_threads(1)
m = build_model(ModelConfig(name="cnn_fmnist"), (1, 28, 28), 10, 0).to(memory_format=torch.channels_last)
s = PrivateStep(m, "bk")
o = s.optimizer(0.1, 1.0, 1.0, 64.0, torch.Generator())
x, y = torch.randn(64, 1, 28, 28).contiguous(memory_format=torch.channels_last), torch.randint(0, 10, (64,))

def step():
    o.zero_grad()
    s.backward(torch.nn.functional.cross_entropy(s.forward(x), y, reduction="none"), 1.0)
    o.step()

work, times = step, 20
"""
# The script's `work()` done `times` times in each of three windows, after a warm-up: the fewest page
# faults per call of a window.
COUNT = """
for _ in range(5):
    work()
per_call = []
for _ in range(3):
    f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(times):
        work()
    per_call.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f) / times)
print(min(per_call))
"""


# What glibc's default costs varies by machine (its dynamic mmap threshold, the kernel's page sizes):
# the CI machine once read 266 faults per evaluation where this one reads 3,500-22,700. The floor only
# shows the case measures something the setting then removes; the setting's own limit is 30.
DEFAULT_FLOOR = 100


def faults_per_call(script: str, mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", script + COUNT, mode], capture_output=True, text=True, check=True)
    return float(out.stdout)


def test_a_trainers_dp_steps_do_not_fault_their_temporaries_in_again():
    default, trainer = faults_per_call(STEPS, "default"), faults_per_call(STEPS, "trainer")
    assert default > DEFAULT_FLOOR  # 450-1,700 measured here: the cost the trainer's malloc setting removes
    assert trainer < 30


# Page faults per evaluation of FedAvgCNN (640 images at batch 64, whose first conv's output, 4.7 MB,
# glibc maps afresh by default), a GlobalEvaluation (the evaluator process's) built first when asked.
EVALUATIONS = """
import resource, sys, torch
from emulator.config import load
from nodes.data import load_federated
from nodes.models import build_model
from nodes.schema import ModelConfig
from nodes.trainer import GlobalEvaluation, evaluate

if sys.argv[1] == "evaluator":
    cfg = load(None, ["clients.n=2"])
    GlobalEvaluation(cfg, load_federated(cfg.data, 2, cfg.seed), torch.device("cpu"))
torch.set_num_threads(1)
m = build_model(ModelConfig(name="cnn_fedavg"), (1, 28, 28), 10, 0)
x, y = torch.randn(640, 1, 28, 28), torch.randint(0, 10, (640,))


def work():
    evaluate(m, x, y, 64)


times = 3
"""


def test_the_evaluators_evaluations_do_not_fault_their_temporaries_in_again():
    default, evaluator = faults_per_call(EVALUATIONS, "default"), faults_per_call(EVALUATIONS, "evaluator")
    assert default > DEFAULT_FLOOR  # 266-22,700 measured: an evaluation that kept no memory faults it in again
    assert evaluator < 30
