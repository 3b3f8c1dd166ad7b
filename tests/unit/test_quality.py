import numpy as np
import pytest
import torch

from emulator.config import ConfigError, check, load
from nodes.contracts.rng import stream
from nodes.contracts.schema import DataConfig, QualityRule
from nodes.data.quality import (
    CLEAN,
    Corruption,
    corrupt,
    corrupted_client_data,
    corruption_for,
    validate_quality,
)

# Talaei & Izadi, Table I scenario 4 (densities ours): the parts swap quality after round 10.
SCENARIO_4 = [
    QualityRule(client_range=[0, 20], from_round=0, salt_pepper=0.5),
    QualityRule(client_range=[0, 20], from_round=10, salt_pepper=0.05),
    QualityRule(client_range=[20, 40], from_round=0, salt_pepper=0.2),
    QualityRule(client_range=[40, 60], from_round=0, salt_pepper=0.05),
    QualityRule(client_range=[40, 60], from_round=10, salt_pepper=0.5),
]


def grey(n: int, shape=(1, 28, 28)) -> torch.Tensor:
    return torch.full((n,) + shape, 0.5)


# --- which corruption when ----------------------------------------------------------------


def test_phase_switch_at_the_given_round():
    cfg = DataConfig(dataset="mnist", quality=SCENARIO_4)
    assert corruption_for(cfg, 0, 0) == corruption_for(cfg, 19, 9) == (0.5, 0.0, 0)
    assert corruption_for(cfg, 0, 10) == corruption_for(cfg, 19, 29) == (0.05, 0.0, 1)
    assert corruption_for(cfg, 20, 9) == corruption_for(cfg, 39, 10) == (0.2, 0.0, 2)
    assert corruption_for(cfg, 40, 9) == (0.05, 0.0, 3)
    assert corruption_for(cfg, 59, 10) == (0.5, 0.0, 4)
    assert corruption_for(cfg, 60, 5) == CLEAN and CLEAN.clean


def test_explicit_clients_ties_and_before_first_phase():
    rules = [
        QualityRule(clients=[1, 3], from_round=2, label_noise=0.1),
        QualityRule(clients=[3], from_round=2, label_noise=0.3),
    ]
    cfg = DataConfig(quality=rules)
    assert corruption_for(cfg, 1, 1) == CLEAN  # before its first phase a client is clean
    assert corruption_for(cfg, 1, 2) == Corruption(0.0, 0.1, 0)
    assert corruption_for(cfg, 3, 5) == Corruption(0.0, 0.3, 1)  # tie on from_round: later-listed wins
    assert corruption_for(cfg, 2, 5) == CLEAN


def test_scenario_file_reproduces_talaei_scenario_4():
    cfg = load("padpfl_quality.yaml")
    assert cfg.clients.n == 60 and cfg.model.name == "mlp_talaei" and cfg.budget.rounds == 30
    assert [g.samples for g in cfg.data.groups] == [150] and cfg.data.groups[0].clients == 60
    severe, moderate, slight = 0.5, 0.2, 0.05
    for client, before, after in [(0, severe, slight), (25, moderate, moderate), (59, slight, severe)]:
        assert corruption_for(cfg.data, client, 9).salt_pepper == before
        assert corruption_for(cfg.data, client, 10).salt_pepper == after


# --- the corruption itself ----------------------------------------------------------------


@pytest.mark.parametrize("density", [0.05, 0.3, 0.8])
def test_salt_and_pepper_density_within_one_percent(density):
    x, y = grey(1300), torch.zeros(1300, dtype=torch.long)  # 1,019,200 pixels
    cx, cy = corrupt(x, y, density, 0.0, 10, stream(0, "test"))
    hit = cx != 0.5
    measured = hit.float().mean().item()
    assert abs(measured - density) <= 0.01 * density
    salt = (cx == 1.0).sum().item() / hit.sum().item()
    assert abs(salt - 0.5) < 0.01
    assert torch.all((cx == 0.5) | (cx == 0.0) | (cx == 1.0))
    assert torch.equal(cy, y) and torch.all(x == 0.5)  # labels untouched, input not modified


def test_salt_and_pepper_hits_whole_colour_pixels():
    x = torch.rand(200, 3, 32, 32)  # 204,800 pixels
    cx, _ = corrupt(x, torch.zeros(200, dtype=torch.long), 0.25, 0.0, 10, stream(1, "test"))
    changed = (cx != x).any(dim=1)
    hit = ((cx == 0) | (cx == 1)).all(dim=1) & changed
    assert torch.equal(changed, hit)  # a hit pixel is black or white in all three channels
    assert abs(changed.float().mean().item() - 0.25) < 0.005  # ~5 sigma on 204,800 pixels


@pytest.mark.parametrize("rate", [0.1, 0.4])
def test_label_noise_rate_within_one_percent(rate):
    n, classes = 1_000_000, 10
    y = torch.from_numpy(np.random.default_rng(0).integers(0, classes, n))
    x = torch.zeros(n, 1)
    cx, cy = corrupt(x, y, 0.0, rate, classes, stream(2, "test"))
    flipped = cy != y
    assert abs(flipped.float().mean().item() - rate) <= 0.01 * rate
    assert cy.dtype == torch.int64 and int(cy.min()) >= 0 and int(cy.max()) < classes
    # a flipped label is uniform over the 9 wrong classes
    shift = ((cy - y) % classes)[flipped]
    counts = torch.bincount(shift, minlength=classes).float()
    assert counts[0] == 0 and torch.all((counts[1:] / counts[1:].mean() - 1).abs() < 0.05)
    assert cx is x


def test_clean_data_is_returned_as_is():
    x, y = grey(4), torch.arange(4)
    cfg = DataConfig(quality=[QualityRule(clients=[1], salt_pepper=0.3)])
    cx, cy, c = corrupted_client_data(cfg, 0, 0, 5, x, y, 10)
    assert cx is x and cy is y and c == CLEAN


def test_same_corruption_within_a_phase_new_one_after():
    cfg = DataConfig(
        dataset="mnist",
        quality=[
            QualityRule(clients=[0, 1], salt_pepper=0.3, label_noise=0.2),
            QualityRule(clients=[0, 1], from_round=4, salt_pepper=0.3, label_noise=0.2),
        ],
    )
    x, y = grey(50), torch.arange(50) % 10

    def view(client, rnd, seed=7):
        cx, cy, _ = corrupted_client_data(cfg, seed, client, rnd, x, y, 10)
        return cx, cy

    a, b = view(0, 0), view(0, 3)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])  # stable within the phase
    c = view(0, 4)  # same densities, new phase: a fresh draw
    assert not torch.equal(a[0], c[0])
    assert not torch.equal(a[0], view(1, 0)[0])  # clients differ
    assert not torch.equal(a[0], view(0, 0, seed=8)[0])  # seeds differ


def test_label_noise_needs_two_classes():
    with pytest.raises(ValueError, match="2 classes"):
        corrupt(grey(3), torch.zeros(3, dtype=torch.long), 0.0, 0.5, 1, stream(0, "test"))


# --- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rule, image_data, key",
    [
        (QualityRule(), True, r"data\.quality\[0\]"),
        (QualityRule(clients=[1], client_range=[0, 2]), True, r"data\.quality\[0\]"),
        (QualityRule(client_range=[0, 11]), True, r"client_range"),
        (QualityRule(client_range=[5, 5]), True, r"client_range"),
        (QualityRule(client_range=[3]), True, r"client_range"),
        (QualityRule(clients=[10]), True, r"clients"),
        (QualityRule(clients=[0], from_round=-1), True, r"from_round"),
        (QualityRule(clients=[0], salt_pepper=1.5), True, r"salt_pepper"),
        (QualityRule(clients=[0], label_noise=-0.1), True, r"label_noise"),
        (QualityRule(clients=[0], salt_pepper=0.1), False, r"salt_pepper.*synthetic"),
    ],
)
def test_validate_quality_rejects(rule, image_data, key):
    with pytest.raises(ConfigError, match=key):
        validate_quality([rule], 10, image_data, check)


def test_validate_quality_accepts_and_config_checks_it():
    validate_quality(SCENARIO_4, 60, True, check)
    validate_quality([QualityRule(clients=[0], label_noise=0.3)], 1, False, check)
    with pytest.raises(ConfigError, match=r"data\.quality\[1\]\.clients"):
        load(None, ["clients.n=5", "data.quality=[{clients: [0]}, {clients: [5]}]"])
