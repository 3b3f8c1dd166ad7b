"""A bundle of clients trained as one computation (train.bundle = K; docs/bundles.md).

The K clients' models are stacked (one (K, ...) tensor per parameter), and each local step is one
forward and one backward pass over the K clients' Poisson batches, padded to the largest with a
mask: a padded sample's loss is multiplied by 0, so its output gradient, its per-sample norm and
its share of every clipped sum are exactly 0. Per-sample clipping is the book-keeping way of
nodes.dp_step (Bu et al., ICML 2023) batched over clients: the ghost norm ||a_i|| ||b_i|| for
Linear, the per-sample gradients of nodes.dp_step.conv_per_sample_grads for Conv2d (a stacked
Conv2d runs as one convolution with a group per client). What stays per client is what must be
its own: the sampler's and the noise's generators, seeded and drawn exactly as Trainer.train
draws them (the sampler's mask every step; N(0, sigma^2 C^2) per parameter in order, from the
key ^ 0x5EED stream), and the post-training operations (Trainer._perturb), so that each client's
update is its K = 1 update within float32 rounding (tests/unit/test_bundle.py).

Per-client step counts (per-client tau, partial work) and dp.empty_batch = skip mask the clients
that do not step; FedProx's proximal step and the per-client lr, sigma, C and divisor are (K,)
vectors. A task that reports its full-data gradients or last step (report_grad_diff,
report_last_step: ALI-DPFL), a model with other layers than Linear, Conv2d, ReLU, MaxPool2d and
Flatten, fall back to Trainer.train, client by client; a bundle whose batched pass raises fails each of its clients.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from nodes.dp_step import CLIP_EPS, conv_per_sample_grads
from nodes.rng import seed_int
from nodes.tasks import ClientTask
from nodes.trainer import Trainer

Update = tuple[dict[str, np.ndarray], dict[str, float]]  # a client's trained weights and metrics, as Trainer.train's
Seen = tuple[nn.Linear | nn.Conv2d, torch.Tensor, torch.Tensor]  # a layer, its input and its output
STACKED_LAYERS = (nn.Linear, nn.Conv2d, nn.ReLU, nn.MaxPool2d, nn.Flatten)


def bundle_problem(model: nn.Module) -> str:
    """Why `model` cannot be trained stacked ('' if it can): a Sequential of STACKED_LAYERS only."""
    layers = list(model.children())
    other = sorted({type(m).__name__ for m in layers if not isinstance(m, STACKED_LAYERS)})
    if not isinstance(model, nn.Sequential) or other:
        return f"a bundle trains Sequential models of Linear, Conv2d, ReLU, MaxPool2d, Flatten, not {other}"
    if any(isinstance(m, nn.Conv2d) and (m.groups != 1 or m.padding_mode != "zeros") for m in layers):
        return "a bundle trains Conv2d layers of groups = 1 and zero padding only"
    if list(model.state_dict()) != [n for n, _ in model.named_parameters()]:
        return "a bundle trains models whose state is their parameters only"
    return ""


def own_pass(task: ClientTask) -> bool:
    """Whether `task` is trained on its own (Trainer.train): it reports full-data or last-step quantities."""
    return task.report_grad_diff or task.report_last_step


@dataclass
class Hyper:
    """The bundle's tasks' DP-SGD settings as (K,) vectors, and their generators."""

    steps: list[int]
    lr: torch.Tensor
    clip: torch.Tensor
    std: list[float]  # sigma * C, 0 for a non-private client
    divisor: torch.Tensor
    mu: torch.Tensor
    private: torch.Tensor  # bool
    q: list[float]
    samplers: list[torch.Generator]
    noises: list[torch.Generator]


@dataclass
class Batch:
    """One step's padded batches: (K * B, ...) samples, client k's at rows k * B to k * B + counts[k]."""

    x: torch.Tensor
    y: torch.Tensor
    valid: torch.Tensor  # (K * B,) float: 1 for a sample, 0 for padding
    counts: torch.Tensor  # (K,) samples of each client


class BundleTrainer:
    """Trains a bundle of tasks with the worker's Trainer (its model, data, seed and dp.* constants)."""

    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        self.problem = bundle_problem(trainer.model)
        self.names = list(trainer.model.state_dict())
        self.layers = list(trainer.model.children())

    def train(self, rnd: int, tasks: Sequence[ClientTask], weights: dict[str, np.ndarray]) -> list[Update | Exception]:
        """Each task's (weights, metrics), or the exception that failed it, in the tasks' order."""
        stacked = [t for t in tasks if not (self.problem or own_pass(t))]
        done: dict[int, Update | Exception] = {}
        if len(stacked) > 1:
            try:
                done = dict(zip((t.client for t in stacked), self.train_stacked(rnd, stacked, weights)))
            except Exception as e:  # the bundle's pass failed: each of its clients' failure
                done = {t.client: e for t in stacked}
        return [done[t.client] if t.client in done else self._alone(rnd, t, weights) for t in tasks]

    def _alone(self, rnd: int, task: ClientTask, weights: dict[str, np.ndarray]) -> Update | Exception:
        try:
            return self.trainer.train(rnd, task, weights)
        except Exception as e:  # reported as this client's failure, as at K = 1
            return e

    def train_stacked(
        self, rnd: int, tasks: Sequence[ClientTask], weights: dict[str, np.ndarray]
    ) -> list[Update | Exception]:
        """Every task stacked (none may need its own pass): each one's update, or its post-training failure."""
        tr, k = self.trainer, len(tasks)
        data = [tr.client_data(rnd, t.client) for t in tasks]
        x_all = torch.cat([x.contiguous() for x, _ in data])
        y_all = torch.cat([y for _, y in data])
        sizes = torch.tensor([len(y) for _, y in data])
        anchor = [torch.from_numpy(np.array(weights[n])).to(tr.device) for n in self.names]  # w, the global model
        params = [a.unsqueeze(0).repeat(k, *([1] * a.dim())) for a in anchor]
        hyper = self._hyper(rnd, tasks, [len(y) for _, y in data])
        losses = torch.zeros(max(hyper.steps), k, dtype=torch.float64)
        stepped = torch.zeros(max(hyper.steps), k, dtype=torch.bool)
        for s in range(max(hyper.steps)):
            batch = self._sample(s, hyper, x_all, y_all, sizes)
            active = torch.tensor([s < n for n in hyper.steps]) & ~(tr.skip_empty & (batch.counts == 0))
            loss_sum = self._step(params, anchor, batch, active, hyper)
            losses[s], stepped[s] = loss_sum.double() / batch.counts.clamp(min=1), active & (batch.counts > 0)
        return [
            self._result(rnd, t, [p[i] for p in params], anchor, weights, losses[:, i], stepped[:, i])
            for i, t in enumerate(tasks)
        ]

    def _hyper(self, rnd: int, tasks: Sequence[ClientTask], sizes: list[int]) -> Hyper:
        tr, dev = self.trainer, self.trainer.device
        keys = [seed_int(tr.seed, "train", rnd, t.client) for t in tasks]
        private = [t.sigma > 0 or t.clip > 0 for t in tasks]
        return Hyper(
            steps=[t.steps for t in tasks],
            lr=torch.tensor([t.lr for t in tasks], dtype=torch.float32, device=dev),
            clip=torch.tensor([t.clip for t in tasks], dtype=torch.float32, device=dev),
            std=[t.sigma * t.clip if p else 0.0 for t, p in zip(tasks, private)],
            divisor=torch.tensor(
                [tr.batch_divisor or max(1.0, t.q * n) for t, n in zip(tasks, sizes)], dtype=torch.float32, device=dev
            ),
            mu=torch.tensor([t.prox_mu for t in tasks], dtype=torch.float32, device=dev),
            private=torch.tensor(private, device=dev),
            q=[t.q for t in tasks],
            samplers=[torch.Generator().manual_seed(key) for key in keys],
            noises=[torch.Generator(device=dev).manual_seed(key ^ 0x5EED) for key in keys],
        )

    def _sample(self, s: int, h: Hyper, x_all: torch.Tensor, y_all: torch.Tensor, sizes: torch.Tensor) -> Batch:
        """Step `s`'s Poisson batches, each drawn from its client's sampler as Trainer.train draws it (a
        client past its steps draws nothing), padded to the largest: one gather for all clients."""
        k = len(h.steps)
        masks = [
            torch.rand(int(n), generator=g) < q if s < steps else torch.zeros(int(n), dtype=torch.bool)
            for n, g, q, steps in zip(sizes, h.samplers, h.q, h.steps)
        ]
        idx = torch.cat(masks).nonzero().squeeze(1)
        ends = sizes.cumsum(0)
        owner = torch.bucketize(idx, ends, right=True)
        counts = torch.bincount(owner, minlength=k)
        width = max(1, int(counts.max()))  # an all-empty step still has a (masked) row per client
        first = counts.cumsum(0) - counts  # each client's first sample's position in idx
        rows = owner * width + torch.arange(len(idx)) - first[owner]
        dev = self.trainer.device
        x = x_all.new_zeros((k * width, *x_all.shape[1:]))
        y = y_all.new_zeros((k * width, *y_all.shape[1:]))
        valid = torch.zeros(k * width, dtype=torch.float32)
        x[rows], y[rows], valid[rows] = x_all[idx], y_all[idx], 1.0
        return Batch(x.to(dev), y.to(dev), valid.to(dev), counts)

    def _step(
        self,
        params: list[torch.Tensor],
        anchor: list[torch.Tensor],
        batch: Batch,
        active: torch.Tensor,
        h: Hyper,
    ) -> torch.Tensor:
        """One DP-SGD step of every active client (ALI-DPFL Alg. 1 lines 6-10, FedProx's proximal step
        after it, as Trainer.train takes them); the (K,) losses summed over each client's batch."""
        k = len(h.steps)
        sums, per_sample = self._clipped_sums(params, batch, h, k)
        noised = self._noise(params, active, h)
        act = active.to(params[0].device)
        lr = torch.where(act, h.lr, torch.zeros_like(h.lr))
        with torch.no_grad():
            prox = [_bcast(h.mu, p) * (p - a) for p, a in zip(params, anchor)] if bool((h.mu > 0).any()) else []
            for p, g, z in zip(params, sums, noised):
                grad = (g + z) / _bcast(h.divisor, g) if z is not None else g / _bcast(h.divisor, g)
                p.add_(grad * -_bcast(lr, p))
            for p, g in zip(params, prox):
                p.sub_(_bcast(lr, p) * g)
        return per_sample.detach().view(k, -1).sum(1).cpu()

    def _noise(self, params: list[torch.Tensor], active: torch.Tensor, h: Hyper) -> list[torch.Tensor | None]:
        """Each active private client's N(0, std^2) per parameter, from its own generator in parameter order
        (nodes.dp_step.NoisedMean's draws); None for a parameter no client noises."""
        drawn = [i for i, std in enumerate(h.std) if std and bool(active[i])]
        if not drawn:
            return [None] * len(params)
        noise = [torch.zeros_like(p) for p in params]
        for i in drawn:
            for z, p in zip(noise, params):
                z[i] = torch.normal(0, h.std[i], p.shape[1:], device=p.device, generator=h.noises[i])
        return list(noise)

    def _clipped_sums(
        self, params: list[torch.Tensor], batch: Batch, h: Hyper, k: int
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Each client's sum of its samples' gradients, each clipped to its C (a private client's), and the
        masked per-sample losses."""
        leaves = [p.detach().requires_grad_() for p in params]
        with torch.enable_grad():
            out, seen = self._forward(leaves, batch.x, k)
            per_sample = self.trainer.loss(out, batch.y, reduction="none") * batch.valid
            backprops = torch.autograd.grad(per_sample.sum(), [o for _, _, o in seen])
        squared = torch.zeros(batch.valid.shape[0], dtype=torch.float32, device=batch.valid.device)
        grads: list[tuple[nn.Module, torch.Tensor, torch.Tensor | None]] = []
        for (m, a, _), b in zip(seen, backprops):
            if isinstance(m, nn.Linear):
                b_squared = torch.linalg.vector_norm(b, dim=1).square()
                squared += torch.linalg.vector_norm(a, dim=1).square() * b_squared  # ghost norm
                if m.bias is not None:
                    squared += b_squared
                grads.append((m, a, b))
            else:
                assert isinstance(m, nn.Conv2d)
                weight, bias = conv_per_sample_grads(m, a, b)
                squared += torch.linalg.vector_norm(weight, dim=1).square()
                if bias is not None:
                    squared += torch.linalg.vector_norm(bias, dim=1).square()
                grads.append((m, weight, bias))
        clip = h.clip.repeat_interleave(len(squared) // k)
        private = h.private.repeat_interleave(len(squared) // k)
        factors = torch.where(private, (clip / (squared.sqrt() + CLIP_EPS)).clamp(max=1.0), torch.ones_like(squared))
        return _summed(grads, factors, k), per_sample

    def _forward(self, params: list[torch.Tensor], x: torch.Tensor, k: int) -> tuple[torch.Tensor, list[Seen]]:
        """The stacked models on the (K * B, ...) batch, recording each Linear and Conv2d layer's input and output."""
        seen: list[Seen] = []
        it = iter(params)
        for m in self.layers:
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                w, b = next(it), next(it) if m.bias is not None else None
                out = _linear(x, w, b, k) if isinstance(m, nn.Linear) else _conv(m, x, w, b, k)
                seen.append((m, x.detach(), out))
                x = out
            else:
                x = m(x)
        return x, seen

    def _result(
        self,
        rnd: int,
        task: ClientTask,
        params: list[torch.Tensor],
        anchor: list[torch.Tensor],
        weights: dict[str, np.ndarray],
        losses: torch.Tensor,
        stepped: torch.Tensor,
    ) -> Update | Exception:
        """Client `task.client`'s update after its steps: its post-training operations, metrics as Trainer.train's."""
        try:
            with torch.no_grad():
                self.trainer._perturb(rnd, task, params, anchor)
            new = {n: np.array(p.detach().cpu().numpy(), order="C") for n, p in zip(self.names, params)}
        except Exception as e:  # this client's failure, as at K = 1
            return e
        kept = losses[stepped].tolist()
        metrics: dict[str, float] = {
            "steps": task.steps,
            "train_loss": float(np.mean(kept)) if kept else float("nan"),
            "update_norm": float(np.sqrt(sum(np.sum((new[n].astype(np.float64) - weights[n]) ** 2) for n in new))),
        }
        return new, metrics


def _bcast(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A (K,) vector shaped to multiply a (K, ...) tensor client by client."""
    return v.view(-1, *([1] * (like.dim() - 1)))


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, k: int) -> torch.Tensor:
    """K Linear layers (w: (K, out, in)) on their clients' rows of x: (K * B, in) -> (K * B, out)."""
    xs = x.view(k, -1, x.shape[1])
    out = torch.bmm(xs, w.transpose(1, 2)) if b is None else torch.baddbmm(b.unsqueeze(1), xs, w.transpose(1, 2))
    return out.reshape(-1, w.shape[1])


def _conv(m: nn.Conv2d, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, k: int) -> torch.Tensor:
    """K Conv2d layers (w: (K, cout, cin, kh, kw)) as one convolution with a group per client."""
    n, cin, height, width = x.shape
    grouped = x.reshape(k, n // k, cin, height, width).transpose(0, 1).reshape(n // k, k * cin, height, width)
    out = F.conv2d(
        grouped, w.reshape(-1, *w.shape[2:]), None if b is None else b.reshape(-1), m.stride, m.padding, m.dilation, k
    )
    _, _, ho, wo = out.shape
    return out.view(n // k, k, -1, ho, wo).transpose(0, 1).reshape(n, -1, ho, wo)


def _summed(
    grads: list[tuple[nn.Module, torch.Tensor, torch.Tensor | None]], factors: torch.Tensor, k: int
) -> list[torch.Tensor]:
    """Each client's clipped sum per parameter, in parameter order, as (K, ...) tensors."""
    sums: list[torch.Tensor] = []
    for m, u, v in grads:
        f = factors.view(k, 1, -1)
        if isinstance(m, nn.Linear):
            assert v is not None
            scaled = (v * factors[:, None]).view(k, -1, v.shape[1])
            sums.append(torch.bmm(scaled.transpose(1, 2), u.view(k, -1, u.shape[1])))
            if m.bias is not None:
                sums.append(scaled.sum(1))
        else:
            assert isinstance(m, nn.Conv2d)
            cout, cin, kh, kw = m.weight.shape
            weight = torch.bmm(f.to(u.dtype), u.view(k, -1, u.shape[1])).view(k, cout, kh, kw, cin)
            sums.append(weight.permute(0, 1, 4, 2, 3).contiguous())
            if m.bias is not None and v is not None:
                sums.append(torch.bmm(f.to(v.dtype), v.view(k, -1, cout)).view(k, cout))
    return sums
