"""A user's own dataset, named as data.dataset=tests.plugins.dataset:TinyImages: generated, so that a run
over it needs no file, and its sizes are its own (90 training and 30 test images)."""

from __future__ import annotations

import numpy as np

from nodes.data import ImageArrays
from nodes.data.images import Arrays


class TinyImages(ImageArrays):
    """4x4 grey images of 3 classes: class c lights row c over dim noise, drawn from a fixed seed."""

    train_size = 90
    test_size = 30
    sample_shape = (1, 4, 4)
    classes = 3
    channel_stats = ((0.3,), (0.35,))

    def arrays(self) -> Arrays:
        rng = np.random.default_rng(0)

        def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
            y = np.arange(n) % self.classes
            x = rng.integers(0, 64, (n, *self.sample_shape), dtype=np.uint8)
            x[np.arange(n), 0, y, :] = 255
            return x, y

        return (*draw(self.train_size), *draw(self.test_size))


class Undeclared(ImageArrays):
    """Writes `arrays` but declares none of the sizes, the shape and the classes."""

    def arrays(self) -> Arrays:
        return TinyImages(self.cfg).arrays()


class NotADataset:
    """Not a DatasetSpec."""
