"""Data-quality heterogeneity: salt-and-pepper pixels and label noise per client group and round.

Talaei & Izadi, Table I: scenarios 1 and 2 give client parts salt-and-pepper noise of
different densities; scenario 4 swaps the parts' densities after the 10th aggregation.
Here `data.quality` is a list of rules {clients | client_range, from_round, salt_pepper,
label_noise}; in round r a client follows the rule that covers it with the largest
from_round <= r (the later-listed one on ties), and is clean when none does.

A client's corruption is drawn from `stream(seed, "quality", client, rule)`, so it is the
same in every round of a phase and in every worker process: the client's data are stable
until its rule changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from nodes.contracts.rng import stream

if TYPE_CHECKING:
    import torch

    from nodes.contracts.schema import Check, DataConfig, QualityRule


class Corruption(NamedTuple):
    salt_pepper: float  # share of pixels set to 0 or 1
    label_noise: float  # share of labels replaced by a random wrong label
    rule: int  # index of the rule in data.quality; -1 = clean

    @property
    def clean(self) -> bool:
        return self.salt_pepper == 0 and self.label_noise == 0


CLEAN = Corruption(0.0, 0.0, -1)


def covers(rule: QualityRule, client: int) -> bool:
    if rule.client_range:
        first, stop = rule.client_range
        return first <= client < stop
    return client in rule.clients


def corruption_for(data_cfg: DataConfig, client: int, rnd: int) -> Corruption:
    """The corruption of `client` in round `rnd` (0-based) under data_cfg.quality."""
    current = None
    for k, rule in enumerate(data_cfg.quality):
        if (
            rule.from_round <= rnd
            and covers(rule, client)
            and (current is None or rule.from_round >= data_cfg.quality[current].from_round)
        ):
            current = k
    if current is None:
        return CLEAN
    rule = data_cfg.quality[current]
    return Corruption(float(rule.salt_pepper), float(rule.label_noise), current)


def flip_labels(y: np.ndarray, rate: float, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """Each label independently with probability `rate` becomes a uniformly drawn *other* class."""
    flip = rng.random(len(y)) < rate
    shift = rng.integers(1, num_classes, len(y))  # 1..C-1: never the true class
    return np.where(flip, (y + shift) % num_classes, y)


def salt_and_pepper_masks(
    shape: tuple[int, ...], density: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(hit, salt) boolean masks over pixels: a share `density` is hit, half of them salt (1),
    half pepper (0). For (N, C, H, W) images a pixel is one (n, h, w) across all channels."""
    pixel_shape = (shape[0], 1) + tuple(shape[2:]) if len(shape) >= 3 else shape
    hit = rng.random(pixel_shape) < density
    salt = rng.random(pixel_shape) < 0.5
    return hit, salt


def corrupt(
    x: torch.Tensor,
    y: torch.Tensor,
    salt_pepper: float,
    label_noise: float,
    num_classes: int,
    rng: np.random.Generator,
    black: float | np.ndarray | torch.Tensor = 0.0,
    white: float | np.ndarray | torch.Tensor = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Corrupted copies of (x, y) (the inputs themselves when there is nothing to do). Pepper
    pixels become `black`, salt pixels `white`: what pixel values 0 and 1 are after the input
    normalisation (per channel, shape (C, 1, 1); numpy arrays as `DatasetSpec.pixel_extremes` gives
    them, or tensors). Labels are drawn first, then pixels."""
    import torch  # here: validating a scenario (validate_quality) imports this module, and must not import torch

    if label_noise > 0:
        if num_classes < 2:
            raise ValueError(f"label noise needs at least 2 classes, got {num_classes}")
        y_np = flip_labels(y.cpu().numpy(), label_noise, num_classes, rng)
        y = torch.from_numpy(y_np).to(device=y.device, dtype=y.dtype)
    if salt_pepper > 0:
        hit, salt = salt_and_pepper_masks(tuple(x.shape), salt_pepper, rng)
        hit_t, salt_t = (torch.from_numpy(m).to(x.device) for m in (hit, salt))
        x = torch.where(
            hit_t,
            torch.where(
                salt_t,
                torch.as_tensor(white, dtype=x.dtype, device=x.device),
                torch.as_tensor(black, dtype=x.dtype, device=x.device),
            ),
            x,
        )
    return x, y


def corrupted_client_data(
    data_cfg: DataConfig,
    seed: int,
    client: int,
    rnd: int,
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    black: float | np.ndarray | torch.Tensor = 0.0,
    white: float | np.ndarray | torch.Tensor = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, Corruption]:
    """The client's training data as seen in round `rnd`, and the corruption applied
    (black / white: the normalised values of pixels 0 and 1, see `corrupt`)."""
    c = corruption_for(data_cfg, client, rnd)
    if c.clean:
        return x, y, c
    x, y = corrupt(
        x, y, c.salt_pepper, c.label_noise, num_classes, stream(seed, "quality", client, c.rule), black, white
    )
    return x, y, c


def validate_quality(rules: Sequence[QualityRule], n_clients: int, image_data: bool, check: Check) -> None:
    """Range checks for data.quality; `check(ok, key, value, expected)` raises on failure."""
    for i, r in enumerate(rules):
        key = f"data.quality[{i}]"
        check(
            bool(r.clients) != bool(r.client_range),
            key,
            {"clients": r.clients, "client_range": r.client_range},
            "exactly one of clients: [ids] or client_range: [first, stop]",
        )
        if r.client_range:
            ok = len(r.client_range) == 2 and 0 <= r.client_range[0] < r.client_range[1] <= n_clients
            check(ok, f"{key}.client_range", r.client_range, f"[first, stop] with 0 <= first < stop <= {n_clients}")
        bad = [k for k in r.clients if not 0 <= k < n_clients]
        check(not bad, f"{key}.clients", r.clients, f"client ids in [0, {n_clients})")
        check(r.from_round >= 0, f"{key}.from_round", r.from_round, "an integer >= 0")
        check(0 <= r.salt_pepper <= 1, f"{key}.salt_pepper", r.salt_pepper, "a density in [0, 1]")
        check(0 <= r.label_noise <= 1, f"{key}.label_noise", r.label_noise, "a rate in [0, 1]")
        check(
            r.salt_pepper == 0 or image_data,
            f"{key}.salt_pepper",
            r.salt_pepper,
            "0 for a dataset without image pixels, as data.dataset=synthetic (salt-and-pepper sets pixels)",
        )
