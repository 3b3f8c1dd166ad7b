"""python -m bench.reproduce.authors_step --authors PATH [--client 5]

Is one local DP-SGD step of our Trainer the ALI-DPFL authors' step? Loads their code from a
checkout of github.com/XinpengLing/ALI-DPFL (PATH holds `system/`; nothing of it is copied here),
gives their FedAvgCNN our initial weights and their DPSGD optimizer the batch our Poisson
sampler drew, and compares:
  1. noise off (sigma = 0): the clipped, divided update, layer by layer (equal up to float rounding);
  2. noise on (sigma = 1.1): the norm of the noise part of the update against
     lr * sigma * C / batch_size * sqrt(d), the scale both should have.
The scenario is `paper/ali_dpfl_table2_fmnist.yaml` (FashionMNIST must be installed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from emulator.config import load
from nodes.contracts.tasks import ClientTask
from nodes.data import load_federated
from nodes.training.dp_step import task_generators
from nodes.training.trainer import build_trainer, state_to_numpy, tensors

SCENARIO = "paper/ali_dpfl_table2_fmnist.yaml"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--authors", required=True, type=Path, help="checkout of XinpengLing/ALI-DPFL")
    ap.add_argument("--client", type=int, default=5)
    args = ap.parse_args()
    sys.path.insert(0, str(args.authors / "system"))
    from flcore.optimizers.dp_optimizer import DPSGD  # the authors' optimizer (step_dp)
    from flcore.trainmodel.models import FedAvgCNN  # the authors' model

    cfg = load(SCENARIO, ["policy=fedavg_dp"])
    dp = cfg.dp
    data = load_federated(cfg.data, cfg.clients.n, cfg.seed)
    trainer = build_trainer(cfg, data, torch.device("cpu"))
    w0 = state_to_numpy(trainer.model)
    x_all, y_all = tensors(data.client(args.client))
    # the batch our trainer draws in round 0 (its sampler stream, replayed)
    draw, _ = task_generators(cfg.seed, 0, args.client, "cpu")
    idx = (torch.rand(len(y_all), generator=draw) < dp.q).nonzero().squeeze(1)

    def ours(sigma: float) -> dict[str, np.ndarray]:
        task = ClientTask.dp_sgd(args.client, dp, steps=1, sigma=sigma)
        return trainer.train(0, task, w0)[0]

    def theirs(sigma: float) -> dict[str, np.ndarray]:
        model = FedAvgCNN(1, 10, 1024)
        model.load_state_dict({n: torch.from_numpy(w0[k].copy()) for n, k in zip(model.state_dict(), w0)})
        opt = DPSGD(
            l2_norm_clip=dp.clip,
            noise_multiplier=sigma,
            minibatch_size=int(dp.batch_divisor),
            microbatch_size=1,
            params=model.parameters(),
            lr=dp.lr,
        )
        loss = torch.nn.CrossEntropyLoss()
        model.train()
        opt.zero_accum_grad()
        for xs, ys in zip(x_all[idx], y_all[idx]):  # their clientdpfl.train: one sample at a time
            opt.zero_microbatch_grad()
            loss(model(xs[None].float()), ys[None].long()).backward()
            opt.microbatch_step(True, False)
        opt.step_dp()
        return {k: v.detach().numpy() for k, v in zip(w0, model.state_dict().values())}

    print(f"client {args.client}: {len(y_all)} samples, batch {len(idx)}, C = {dp.clip}, lr = {dp.lr}, divisor 64")
    a, b = ours(1e-12), theirs(0.0)  # sigma > 0 keeps our private path; 1e-12 adds no measurable noise
    print("\nnoise off | layer | |update| ours | |update| theirs | max |difference|")
    for k in w0:
        print(
            f"  {k:14s} {np.linalg.norm(a[k] - w0[k]):.6g}  {np.linalg.norm(b[k] - w0[k]):.6g}  "
            f"{np.abs(a[k] - b[k]).max():.3g}"
        )

    def flat(w: dict[str, np.ndarray]) -> np.ndarray:
        return np.concatenate([(w[k] - w0[k]).ravel() for k in w0])

    d = sum(v.size for v in w0.values())
    expected = dp.lr * dp.sigma * dp.clip / dp.batch_divisor * np.sqrt(d)
    print(f"\nnoise on (sigma = {dp.sigma}): |noise part| ours {np.linalg.norm(flat(ours(dp.sigma)) - flat(a)):.4f}, ")
    print(f"  theirs {np.linalg.norm(flat(theirs(dp.sigma)) - flat(b)):.4f}, expected {expected:.4f} (d = {d})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
