"""The compressed_bytes reproduction target: registered, its runs valid configurations of
compressed.yaml, its analytic ratios the codecs' frame sizes, and the scenario's byte budget one that
binds for every codec before the round budget does."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.reproduce.__main__ import TARGETS
from bench.reproduce.common import Options
from bench.reproduce.compressed_bytes import CODECS, SCENARIO, analytic_ratio, points
from emulator.config import load
from nodes.contracts.codecs import kept, part_bytes
from nodes.data import dataset_spec
from nodes.training.models import build_model


def tensor_sizes() -> list[int]:
    cfg = load(SCENARIO)
    data = dataset_spec(cfg.data)
    model = build_model(cfg.model, data.sample_shape, data.classes, seed=0)
    return [p.numel() for p in model.state_dict().values()]


def test_the_target_runs_every_codec_of_compressed_yaml_at_each_seed():
    assert TARGETS["compressed_bytes"] == "compressed_bytes"
    ps = points(Options(seeds=[0, 1, 2], jobs=1, out=Path("out")))
    assert len(ps) == 3 * len(CODECS) == 12
    for p in ps:
        cfg = load(p.scenario, [*(f"{k}={v}" for k, v in p.hive.items()), *p.overrides])
        _, codec, _ = CODECS[p.hive["compression.kind"]]
        assert cfg.compression == codec, p
    assert load(SCENARIO).compression == CODECS["topk"][1]  # the scenario's own: top-1 % with error feedback


def test_the_analytic_ratios_are_the_frame_sizes_of_each_codec():
    sizes = tensor_sizes()
    assert sum(sizes) == 145_418  # the scenario's comment
    plain = 4 * sum(sizes)
    assert analytic_ratio(CODECS["none"][1], sizes) == 1
    assert analytic_ratio(CODECS["qsgd"][1], sizes) == plain / sum(4 + n for n in sizes) == pytest.approx(4, rel=1e-3)
    topk = plain / sum(8 * math.ceil(0.01 * n) for n in sizes)
    assert analytic_ratio(CODECS["topk"][1], sizes) == topk and 45 < topk < 50
    assert analytic_ratio(CODECS["sign"][1], sizes) == plain / sum(4 + math.ceil(n / 8) for n in sizes)
    assert kept(0.01, 10) == 1  # the 10 output biases: one coordinate, not a tenth of one


def test_the_byte_budget_binds_for_every_codec_before_the_round_budget():
    cfg = load(SCENARIO)
    sizes = tensor_sizes()
    down = 4 * sum(sizes)  # the broadcast, its header aside: every kind downloads the model
    for kind, (_, codec, _) in CODECS.items():
        per_round = cfg.clients.n * (down + sum(part_bytes(codec, n) for n in sizes))
        assert cfg.budget.bytes < cfg.budget.rounds * per_round, kind
    # uncompressed, the budget holds 10 rounds and not 11 (a message header is a few hundred bytes)
    assert 10 * cfg.clients.n * 2 * (down + 400) < cfg.budget.bytes < 11 * cfg.clients.n * 2 * down
