"""Sanity check of the ALI-DPFL Table V CNN: non-private, centralised SGD on FashionMNIST.

    python bench/centralised_fmnist.py [--epochs 2] [--lr 0.1] [--batch 128] [--root DIR]

Loads FashionMNIST through the emulator's own loader (one client holding the whole
training set), trains with plain mini-batch SGD and prints the test accuracy per epoch.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nodes.contracts.rng import seed_int
from nodes.contracts.schema import DataConfig, ModelConfig
from nodes.data import load_federated
from nodes.training.models import build_model, loss_fn, num_params
from nodes.training.trainer import tensors


@torch.no_grad()
def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 2000) -> float:
    model.eval()
    correct = sum((model(x[i : i + batch]).argmax(1) == y[i : i + batch]).sum().item() for i in range(0, len(y), batch))
    return correct / len(y)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--root", default="")
    args = ap.parse_args()

    data = load_federated(DataConfig(dataset="fashion_mnist", root=args.root, partition="iid"), 1, args.seed)
    (x, y), (tx, ty) = tensors(data.client(0)), tensors(data.test())
    model = build_model(ModelConfig(name="cnn_fmnist"), data.input_shape, data.num_classes, args.seed)
    loss = loss_fn("cnn_fmnist")
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    order = torch.Generator().manual_seed(seed_int(args.seed, "bench", "order"))
    print(
        f"cnn_fmnist: {num_params(model)} parameters; {len(y)} training / {len(ty)} test samples; "
        f"SGD lr={args.lr} batch={args.batch}"
    )
    print(f"epoch 0: test accuracy {accuracy(model, tx, ty):.4f}")
    for epoch in range(1, args.epochs + 1):
        start = time.monotonic()
        model.train()
        perm = torch.randperm(len(y), generator=order)
        for i in range(0, len(y), args.batch):
            idx = perm[i : i + args.batch]
            opt.zero_grad(set_to_none=True)
            loss(model(x[idx]), y[idx], reduction="mean").backward()
            opt.step()
        print(f"epoch {epoch}: test accuracy {accuracy(model, tx, ty):.4f} ({time.monotonic() - start:.1f} s)")


if __name__ == "__main__":
    main()
