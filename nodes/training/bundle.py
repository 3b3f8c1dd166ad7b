"""A bundle of clients trained as one computation (train.bundle = K; docs/bundles.md).

The K clients' models are stacked (one (K, ...) tensor per parameter), and each local step is one
forward and one backward pass over the K clients' Poisson batches, padded to the largest with a
mask: a padded sample's loss is multiplied by 0, so its output gradient, its per-sample norm and
its share of every clipped sum are exactly 0. Per-sample clipping is the book-keeping way of
nodes.training.dp_step (Bu et al., ICML 2023), its own functions (per_sample_terms, clip_factors,
clipped_sums) given the K axis: the ghost norm ||a_i|| ||b_i|| for Linear, the per-sample gradients of
conv_per_sample_grads for Conv2d (a stacked Conv2d runs as one convolution with a group per client).

What stays per client is what must be its own, drawn exactly as Trainer.train draws it, so that
each client's update is its K = 1 update within float32 rounding (tests/unit/test_bundle.py):
1. its sampler generator: its draws for a block of steps are one torch.rand call, the stream of its
   step-by-step draws (SamplerDraws), and a step's Poisson masks are one float32 comparison;
2. its noise generator (dp_step.task_generators): N(0, sigma^2 C^2) per parameter in order, drawn in
   place into its rows of buffers allocated once per bundle (StepNoise);
3. its post-training operations (Trainer._perturb), only for a task that has any (perturbs).
Its update's arrays are rows of one array per parameter, and its metrics are computed for all K
clients at once.

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

from nodes.contracts.tasks import ClientTask
from nodes.training.dp_step import clip_factors, clipped_sums, per_sample_terms, task_generators
from nodes.training.trainer import Trainer, perturbs

Update = tuple[dict[str, np.ndarray], dict[str, float]]  # a client's trained weights and metrics, as Trainer.train's
Seen = tuple[nn.Linear | nn.Conv2d, torch.Tensor, torch.Tensor]  # a layer, its input and its output
STACKED_LAYERS = (nn.Linear, nn.Conv2d, nn.ReLU, nn.MaxPool2d, nn.Flatten)

DRAW_BLOCK = 1 << 22  # the most sampler draws held at once (steps * samples, float32), per bundle
NORM_BLOCK = 1 << 20  # the most float64 entries of updates formed at once for their norms


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
    until: torch.Tensor  # (K,) steps, as a tensor
    lr: torch.Tensor
    clip: torch.Tensor
    std: list[float]  # sigma * C, 0 for a non-private client
    divisor: torch.Tensor
    mu: torch.Tensor
    prox: bool  # some client takes FedProx's proximal step
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


class SamplerDraws:
    """Every client's sampler draws, DRAW_BLOCK at most at a time: a (steps, sum n) float32 block, client k's
    columns holding torch.rand(steps * n) from its sampler as (steps, n) (the stream of Trainer.train's
    torch.rand(n) per step: tests/unit/test_bundle.py), +inf past its steps, so never sampled."""

    def __init__(self, h: Hyper, sizes: list[int]):
        self.h, self.sizes, self.total = h, sizes, sum(sizes)
        # Trainer.train compares a float32 tensor with q, in float32: q as a float32 per-sample vector
        self.q = torch.tensor(h.q, dtype=torch.float32).repeat_interleave(torch.tensor(sizes, dtype=torch.long))
        self.block = max(1, DRAW_BLOCK // max(1, self.total))
        self.start, self.u = 0, torch.empty(0, self.total)

    def mask(self, s: int) -> torch.Tensor:
        """Step `s`'s Poisson masks of all clients, concatenated (steps are asked for in order)."""
        if s >= self.start + len(self.u):
            self.start, self.u = s, self._draw(s, min(s + self.block, max(self.h.steps)))
        return self.u[s - self.start] < self.q

    def _draw(self, start: int, stop: int) -> torch.Tensor:
        u = torch.full((stop - start, self.total), float("inf"))
        first = 0
        for n, g, steps in zip(self.sizes, self.h.samplers, self.h.steps):
            rows = min(steps, stop) - start
            if rows > 0:
                u[:rows, first : first + n] = torch.rand(rows * n, generator=g).view(rows, n)
            first += n
        return u


class StepNoise:
    """The bundle's Gaussian noise: a (K, ...) buffer per parameter, allocated once. Each step draws each
    active private client's N(0, std^2) in place into its rows, from its generator in parameter order
    (nodes.training.dp_step.NoisedMean's torch.normal draws: the same stream, tests/unit/test_bundle.py); the rows
    of every other client are 0."""

    def __init__(self, params: list[torch.Tensor], h: Hyper):
        self.h = h
        self.buffers = [torch.zeros_like(p) for p in params] if any(h.std) else []
        self.rows = [[z[i] for z in self.buffers] for i in range(len(h.std))]  # client i's rows: contiguous
        self.noised: list[int] = []  # the clients whose rows hold noise

    def draw(self, active: list[bool]) -> list[torch.Tensor] | None:
        """This step's noise per parameter, or None where no client draws any."""
        drawn = [i for i, std in enumerate(self.h.std) if std and active[i]]
        for i in set(self.noised).difference(drawn):
            for row in self.rows[i]:
                row.zero_()
        self.noised = drawn
        for i in drawn:
            std, generator = self.h.std[i], self.h.noises[i]
            for row in self.rows[i]:
                row.normal_(0, std, generator=generator)
        return self.buffers if drawn else None


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
        x_pad = torch.cat([*(x.contiguous() for x, _ in data), data[0][0].new_zeros((1, *data[0][0].shape[1:]))])
        y_pad = torch.cat([*(y for _, y in data), data[0][1].new_zeros(1)])
        sizes = [y.shape[0] for _, y in data]
        anchor = [torch.from_numpy(np.array(weights[n])).to(tr.device) for n in self.names]  # w, the global model
        params = [a.unsqueeze(0).repeat(k, *([1] * a.dim())) for a in anchor]
        hyper = self._hyper(rnd, tasks, sizes)
        draws, noise, ends = SamplerDraws(hyper, sizes), StepNoise(params, hyper), torch.tensor(sizes).cumsum(0)
        losses = torch.zeros(max(hyper.steps), k, dtype=torch.float64)
        stepped = torch.zeros(max(hyper.steps), k, dtype=torch.bool)
        for s in range(max(hyper.steps)):
            batch = self._sample(draws.mask(s), ends, x_pad, y_pad)
            active = (hyper.until > s) & ~(tr.skip_empty & (batch.counts == 0))
            loss_sum = self._step(params, anchor, batch, active, hyper, noise.draw(active.tolist()))
            losses[s], stepped[s] = loss_sum.double() / batch.counts.clamp(min=1), active & (batch.counts > 0)
        return self._results(rnd, tasks, params, anchor, weights, losses, stepped)

    def _hyper(self, rnd: int, tasks: Sequence[ClientTask], sizes: list[int]) -> Hyper:
        tr, dev = self.trainer, self.trainer.device
        generators = [task_generators(tr.seed, rnd, t.client, dev) for t in tasks]  # as Trainer.train
        private = [t.sigma > 0 or t.clip > 0 for t in tasks]
        mu = [t.prox_mu for t in tasks]
        return Hyper(
            steps=[t.steps for t in tasks],
            until=torch.tensor([t.steps for t in tasks]),
            lr=torch.tensor([t.lr for t in tasks], dtype=torch.float32, device=dev),
            clip=torch.tensor([t.clip for t in tasks], dtype=torch.float32, device=dev),
            std=[t.sigma * t.clip if p else 0.0 for t, p in zip(tasks, private)],
            divisor=torch.tensor(
                [tr.batch_divisor or max(1.0, t.q * n) for t, n in zip(tasks, sizes)], dtype=torch.float32, device=dev
            ),
            mu=torch.tensor(mu, dtype=torch.float32, device=dev),
            prox=any(m > 0 for m in mu),
            private=torch.tensor(private, device=dev),
            q=[t.q for t in tasks],
            samplers=[sampler for sampler, _ in generators],
            noises=[noise for _, noise in generators],
        )

    def _sample(self, mask: torch.Tensor, ends: torch.Tensor, x_pad: torch.Tensor, y_pad: torch.Tensor) -> Batch:
        """A step's Poisson batches from all clients' concatenated masks (`ends`: each client's end in them),
        padded to the largest: one gather for all clients from (x_pad, y_pad), whose last row is the padding."""
        k = len(ends)
        idx = mask.nonzero().squeeze(1)
        owner = torch.bucketize(idx, ends, right=True)
        counts = torch.bincount(owner, minlength=k)
        width = max(1, int(counts.max()))  # an all-empty step still has a (masked) row per client
        first = counts.cumsum(0) - counts  # each client's first sample's position in idx
        padding = y_pad.shape[0] - 1
        rows = owner * width + torch.arange(idx.shape[0]) - first.index_select(0, owner)
        source = torch.full((k * width,), padding, dtype=torch.long).index_copy_(0, rows, idx)
        dev = self.trainer.device
        valid = (source != padding).to(torch.float32)
        x, y = x_pad.index_select(0, source.to(x_pad.device)), y_pad.index_select(0, source.to(y_pad.device))
        return Batch(x.to(dev), y.to(dev), valid.to(dev), counts)

    def _step(
        self,
        params: list[torch.Tensor],
        anchor: list[torch.Tensor],
        batch: Batch,
        active: torch.Tensor,
        h: Hyper,
        noised: list[torch.Tensor] | None,
    ) -> torch.Tensor:
        """One DP-SGD step of every active client (ALI-DPFL Alg. 1 lines 6-10, FedProx's proximal step
        after it, as Trainer.train takes them), `noised` the step's noise; the (K,) losses summed over
        each client's batch."""
        k = len(h.steps)
        sums, per_sample = self._clipped_sums(params, batch, h, k)
        act = active.to(params[0].device)
        lr = torch.where(act, h.lr, torch.zeros_like(h.lr))
        with torch.no_grad():
            prox = [_bcast(h.mu, p) * (p - a) for p, a in zip(params, anchor)] if h.prox else []
            for j, (p, g) in enumerate(zip(params, sums)):
                grad = (g + noised[j]) / _bcast(h.divisor, g) if noised else g / _bcast(h.divisor, g)
                p.add_(grad * -_bcast(lr, p))
            for p, g in zip(params, prox):
                p.sub_(_bcast(lr, p) * g)
        return per_sample.detach().view(k, -1).sum(1).cpu()

    def _clipped_sums(
        self, params: list[torch.Tensor], batch: Batch, h: Hyper, k: int
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Each client's sum of its samples' gradients, each clipped to its C (a private client's), and the
        masked per-sample losses."""
        leaves = [p.detach().requires_grad_() for p in params]
        with torch.enable_grad():
            out, seen = self._forward(leaves, batch.x, k)
            per_sample = self.trainer.loss(out, batch.y, reduction="none") * batch.valid
            squared, per_layer = per_sample_terms(seen, per_sample)
        clipped = clip_factors(squared.view(k, -1), h.clip[:, None])
        factors = torch.where(h.private[:, None], clipped, torch.ones_like(clipped))
        return [s.contiguous() for s in clipped_sums(per_layer, factors)], per_sample

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

    def _results(
        self,
        rnd: int,
        tasks: Sequence[ClientTask],
        params: list[torch.Tensor],
        anchor: list[torch.Tensor],
        weights: dict[str, np.ndarray],
        losses: torch.Tensor,
        stepped: torch.Tensor,
    ) -> list[Update | Exception]:
        """Each client's update after its steps, or its failure: its post-training operations (for a task
        that has any), its weights as rows of one C-ordered array per parameter, metrics as Trainer.train's."""
        failed: dict[int, Exception] = {}
        with torch.no_grad():
            for i, task in enumerate(tasks):
                try:
                    if perturbs(task):
                        self.trainer._perturb(rnd, task, [p[i] for p in params], anchor)
                except Exception as e:  # this client's failure, as at K = 1
                    failed[i] = e
        stack = [np.ascontiguousarray(p.detach().cpu().numpy()) for p in params]  # fresh tensors: no copy needed
        norms = _update_norms(stack, [weights[n] for n in self.names]).tolist()
        kept = torch.where(stepped, losses, torch.zeros_like(losses))
        train_loss = (kept.sum(0) / stepped.sum(0)).tolist()  # the mean of each client's losses, nan of none
        return [
            failed[i]
            if i in failed
            else (
                {n: a[i] for n, a in zip(self.names, stack)},
                {"steps": task.steps, "train_loss": train_loss[i], "update_norm": norms[i]},
            )
            for i, task in enumerate(tasks)
        ]


def _update_norms(stack: list[np.ndarray], global_model: list[np.ndarray]) -> np.ndarray:
    """Each client's ||w_i - w|| in float64, as Trainer.train's update_norm (`stack`: each parameter's (K, ...)
    weights), NORM_BLOCK entries at most at a time."""
    squares = np.zeros(len(stack[0]))
    for a, w in zip(stack, global_model):
        block = max(1, NORM_BLOCK // max(1, w.size))
        for i in range(0, len(a), block):
            d = a[i : i + block].astype(np.float64) - w
            squares[i : i + block] += np.square(d).reshape(len(d), -1).sum(1)
    return np.sqrt(squares)


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
