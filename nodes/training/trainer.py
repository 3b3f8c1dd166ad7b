"""Local training of one client for one round: DP-SGD with Opacus, or plain SGD when sigma = 0 and C = 0.

DP-SGD step (Abadi et al.; ALI-DPFL Alg. 1 lines 6-10): a Poisson batch at rate q, each
per-sample gradient clipped to C, summed, Gaussian noise N(0, sigma^2 C^2) added, divided
by the *expected* batch size q|D_i| (or by the fixed dp.batch_divisor, as the ALI-DPFL code
divides by its batch_size). An empty Poisson batch still takes a (pure-noise) step, as the
privacy analysis assumes, unless dp.empty_batch = skip (the ALI-DPFL code's sampler). Those two
are per-run constants the trainer is built with; everything else of the round is in the task.

Generic mechanisms switched on by task fields (the policies decide when):
* prox_mu: FedProx proximal term mu/2 ||w - w_global||^2 added to the local objective;
* report_grad_diff: ||grad F_i(w_i) - grad F_i(w)|| and ||w_i - w|| over the client's whole
  data, the per-client quantities of ALI-DPFL's mu estimate (§IV-B);
* report_last_step: the last step's parameter change and the change of the loss on its batch,
  the per-client quantities of the ALI-DPFL code's mu and Gamma estimates;
* weight_clip: the trained parameters are scaled to L2 norm <= weight_clip (Talaei eq. 7);
* update_clip: the update w_i - w is scaled to L2 norm <= update_clip (DP-FedAvg's clip, McMahan et
  al. Alg. 1, before the noise of its local-noise variant);
* output_noise: Gaussian or Laplace noise on the uploaded parameters (client-level DP: Fu
  Thm 1-2, Wei eq. 10/25, Talaei eq. 8), drawn from the task's own "output_noise" stream.

The trainer is stateless across rounds: weights, step count and the RNG key arrive in the
task, and the privacy ledger lives on the server, so any worker can run any client. It builds a
client's data when first asked for it (numpy arrays, made tensors without a copy: `tensors`) and
keeps the last ones trained (`ClientCache`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import torch

from nodes.contracts.rng import seed_int
from nodes.contracts.schema import DataConfig, Device, EmptyBatch, ModelConfig, PerSample, Scenario
from nodes.contracts.tasks import ClientTask
from nodes.data import dataset_spec
from nodes.data.cache import CACHE_BYTES, ClientCache
from nodes.data.federated import FederatedData, Samples
from nodes.data.quality import corrupted_client_data, corruption_for
from nodes.training.dp_step import SGD, PrivateStep, choose_path, task_generators
from nodes.training.malloc import keep_freed_memory
from nodes.training.model_catalog import evaluation_batch
from nodes.training.models import build_model, cross_entropy, evaluation_sum, for_inference, loss_fn

OUTPUT_NOISE = ("none", "gaussian", "laplace")

Tensors = tuple[torch.Tensor, torch.Tensor]  # (X float32, y int64)


def perturbs(task: ClientTask) -> bool:
    """Return whether Trainer._perturb may change `task`'s trained parameters, or refuse its output_noise.

    Args:
        task: The task.

    Returns:
        Whether it has a weight or update clip, or an output noise other than none.
    """
    return task.weight_clip > 0 or task.update_clip > 0 or task.output_noise != "none"


def tensors(samples: Samples) -> Tensors:
    """Return a dataset's (X, y) numpy arrays as CPU tensors sharing their memory (`torch.from_numpy`).

    Args:
        samples: The (X, y) arrays.

    Returns:
        (X, y) as tensors.
    """
    x, y = samples
    return torch.from_numpy(x), torch.from_numpy(y)


def resolve_device(name: str) -> torch.device:
    """Return the device `name` stands for in this process.

    Args:
        name: auto, cpu, cuda or cuda:N. auto is cuda where torch sees a GPU.

    Returns:
        The device: cuda names its index, 0 (torch.cuda.set_device takes no device without one).
    """
    if name == Device.AUTO:
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    return torch.device("cuda", 0) if device.type == "cuda" and device.index is None else device


def state_to_numpy(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """Return a copy of `model`'s state as numpy arrays.

    Copies in C order, whatever the tensor's memory format (channels_last conv weights): the wire's
    layout, and arrays that the next task's weights, loaded into the same model, cannot overwrite.

    Args:
        model: The model.

    Returns:
        Its state_dict's tensors as arrays, by name.
    """
    return {k: np.array(v.detach().cpu().numpy(), order="C") for k, v in model.state_dict().items()}


def load_numpy_state(model: torch.nn.Module, state: dict[str, np.ndarray]) -> None:
    """Load `state` into `model`, every tensor of its state_dict (strict).

    Args:
        model: The model.
        state: The arrays, by name, as state_to_numpy returns them and the wire carries them.
    """
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()}, strict=True)


class GlobalEvaluation:
    """The server's side of the model, in its evaluator process (nodes.worker --evaluator).

    It holds the initial model as the seed builds it, and gives any weights' (loss, accuracy) on the test set.

    Args:
        data: The run's data; it is not kept: of an image dataset, only the test set's pixels stay.
        device: Where the evaluation runs.
        model: The model's section of the scenario.
        seed: The run's seed, which initialises the model.
        batch_eval: dp.batch_eval: the evaluation's batch size (0: the model's own).
        test: data's test set as the server drew it (nodes.data.federated.ServerData), else built here.

    Attributes:
        initial: The initial model's weights, as the wire carries them.
    """

    def __init__(
        self,
        data: FederatedData,
        device: torch.device,
        *,
        model: ModelConfig,
        seed: int,
        batch_eval: int,
        test: Samples | None = None,
    ) -> None:
        """Build the initial model and keep the test set."""
        keep_freed_memory()  # as a Trainer: else each batch faults its layer outputs in again (bench.eval_batch)
        self.model = build_model(model, data.input_shape, data.num_classes, seed)
        self.initial = state_to_numpy(self.model)
        self.test = tensors(data.test() if test is None else test)
        self.loss, self.device = loss_fn(model.name), device
        self.batch = evaluation_batch(model.name, batch_eval)

    def __call__(self, weights: dict[str, np.ndarray]) -> tuple[float, float]:
        """Evaluate `weights` on the test set.

        Args:
            weights: A model, by tensor name.

        Returns:
            Its (mean loss, accuracy).
        """
        load_numpy_state(self.model, weights)
        return evaluate(self.model, *self.test, self.batch, self.loss, self.device)


class Trainer:
    """One worker's local training: a client's round of DP-SGD, or of plain SGD.

    The run's model (`model`, initialised from `seed`) and the clients' data (`data`, corrupted by
    `data_cfg.quality`), trained as each task says, with the run's dp.* settings that no task carries.
    It is stateless across rounds (the module's docstring); build_trainer builds the scenario's.

    Args:
        data: The clients' data.
        device: Where the model trains.
        model: The model's section of the scenario.
        data_cfg: The data section, whose data.quality corrupts a client's data.
        seed: The run's seed: the model's initialisation and every task's random streams.
        per_sample: dp.per_sample: how clipped per-sample gradients are formed (auto, bk or hooks).
        batch_eval: dp.batch_eval: the batch size of the full-data gradients (0: the model's own).
        batch_divisor: dp.batch_divisor: what the noisy gradient sum is divided by (0: the expected batch
            q|D_i|).
        empty_batch: dp.empty_batch: noise (an empty Poisson batch takes a noise-only step) or skip.

    Raises:
        ValueError: `per_sample` is none of those, or bk for a model it does not apply to.
    """

    def __init__(
        self,
        data: FederatedData,
        device: torch.device,
        *,
        model: ModelConfig,
        data_cfg: DataConfig,
        seed: int,
        per_sample: str,
        batch_eval: int,
        batch_divisor: float,
        empty_batch: str,
    ) -> None:
        """Build the model and its private step."""
        self.data, self.device, self.data_cfg, self.seed = data, device, data_cfg, seed
        self.batch_eval = evaluation_batch(model.name, batch_eval)
        self.batch_divisor, self.skip_empty = batch_divisor, empty_batch == EmptyBatch.SKIP
        keep_freed_memory()  # a step's temporaries are not faulted in again every step (nodes/training/malloc.py)
        self.model = build_model(model, data.input_shape, data.num_classes, seed).to(device)
        # One private step for the worker's lifetime: weights are loaded into the model each task.
        self.private = PrivateStep(self.model, choose_path(self.model, per_sample))
        # Images in channels_last, where the convolutions and max-pools run faster on CPU
        # (bench.dp_step); not under Opacus's hooks, whose conv per-sample gradients (unfold2d,
        # Opacus 1.6) are silently wrong for channels_last inputs.
        images = len(data.input_shape) == 3 and self.private.path == PerSample.BK
        self.layout = torch.channels_last if images else torch.contiguous_format
        self.model.to(memory_format=self.layout)  # type: ignore[call-overload]  # torch's stubs omit memory_format
        self.loss = loss_fn(model.name)
        self.cache = ClientCache(CACHE_BYTES)
        self.pixel_extremes = dataset_spec(data_cfg).pixel_extremes()

    def weights(self) -> dict[str, np.ndarray]:
        """Return the model's weights as the wire carries them (before any task: the initial model).

        Returns:
            The weights, by tensor name.
        """
        return state_to_numpy(self.model)

    def client_data(self, rnd: int, client: int) -> Tensors:
        """Return the client's data as it is in round `rnd`: clean, or corrupted by its data.quality rule.

        The same corruption holds for the whole phase, so it is cached per (client, rule).

        Args:
            rnd: The round.
            client: The client's id.

        Returns:
            Its (X, y) on the trainer's device.
        """
        rule = corruption_for(self.data_cfg, client, rnd).rule
        return self.cache.get((client, rule), lambda: self._build(rnd, client))

    def _build(self, rnd: int, client: int) -> Tensors:
        x, y = tensors(self.data.client(client))
        x, y, _ = corrupted_client_data(
            self.data_cfg, self.seed, client, rnd, x, y, self.data.num_classes, *self.pixel_extremes
        )
        return self._placed(x), y.to(self.device)

    def _placed(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.device).contiguous(memory_format=self.layout)

    def train(
        self, rnd: int, task: ClientTask, weights: dict[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """Train `task`'s client for one round from the global model `weights`.

        task.steps DP-SGD steps (plain SGD if sigma = clip = 0), then the task's mechanisms: the module's docstring.

        Args:
            rnd: The round, which picks the client's data (data.quality) and, with seed and client, its streams.
            task: What the client is asked to do.
            weights: The global model w, by tensor name.

        Returns:
            The trained model w_i as the wire carries it, and the metrics: steps, train_loss (the mean of the
            non-empty batches' mean loss; NaN without one), update_norm (||w_i - w||), last_step_change and
            last_step_loss_change (task.report_last_step), grad_change and param_change (task.report_grad_diff).

        Raises:
            ValueError: task.output_noise is none of none, gaussian and laplace.
        """
        load_numpy_state(self.model, weights)
        x_all, y_all = self.client_data(rnd, task.client)
        n = len(y_all)
        params = list(self.model.parameters())
        anchor = [p.detach().clone() for p in params]  # w, the global model
        grad_start = (
            full_gradient(self.model, x_all, y_all, self.batch_eval, self.loss) if task.report_grad_diff else None
        )
        sampler, noise = task_generators(self.seed, rnd, task.client, self.device)
        private = task.sigma > 0 or task.clip > 0
        divisor = self.batch_divisor or max(1.0, task.q * n)
        opt = (
            self.private.optimizer(task.lr, task.sigma, task.clip, divisor, noise) if private else SGD(params, task.lr)
        )
        losses, last = [], None
        self.model.train()
        for _ in range(task.steps):
            mask = torch.rand(n, generator=sampler) < task.q
            idx = mask.nonzero().squeeze(1).to(self.device)
            if self.skip_empty and len(idx) == 0:
                continue
            x, y = x_all[idx].contiguous(memory_format=self.layout), y_all[idx]
            if task.report_last_step:
                last = (x, y, [p.detach().clone() for p in params], self._batch_loss(x, y))
            opt.zero_grad(set_to_none=True)
            per_sample = self.loss(self.private.forward(x) if private else self.model(x), y, reduction="none")
            loss_sum = per_sample.sum()
            # Private: the clipped per-sample sum, which the optimizer noises and divides by the
            # divisor. Non-private: the same estimator without clip/noise.
            if private:
                self.private.backward(per_sample, task.clip)
            else:
                (loss_sum / divisor).backward()
            # FedProx: the proximal gradient mu (w - w_global) is data-free, so it is applied next
            # to the (clipped, noised) data step at the same w rather than through Opacus.
            prox = [task.prox_mu * (p.detach() - a) for p, a in zip(params, anchor)] if task.prox_mu > 0 else []
            opt.step()
            with torch.no_grad():
                for p, g in zip(params, prox):
                    p.sub_(task.lr * g)
            if len(y):
                losses.append(loss_sum.item() / len(y))
        metrics: dict[str, float] = {
            "steps": task.steps,
            "train_loss": float(np.mean(losses)) if losses else float("nan"),
        }
        if task.report_last_step and last is not None:
            x, y, before, loss_before = last
            metrics["last_step_change"] = _norm([p.detach() - b for p, b in zip(params, before)])
            metrics["last_step_loss_change"] = self._batch_loss(x, y) - loss_before
        if grad_start is not None:  # task.report_grad_diff
            grad_end = full_gradient(self.model, x_all, y_all, self.batch_eval, self.loss)
            metrics["grad_change"] = _norm([a - b for a, b in zip(grad_end, grad_start)])
            metrics["param_change"] = _norm([p.detach() - a for p, a in zip(params, anchor)])
        self._perturb(rnd, task, params, anchor)
        new = self.weights()
        metrics["update_norm"] = float(np.sqrt(sum(np.sum((new[k].astype(np.float64) - weights[k]) ** 2) for k in new)))
        return new, metrics

    @torch.no_grad()
    def _batch_loss(self, x: torch.Tensor, y: torch.Tensor) -> float:
        return self.loss(self.model(x), y, reduction="mean").item()

    @torch.no_grad()
    def _perturb(
        self, rnd: int, task: ClientTask, params: Sequence[torch.Tensor], anchor: Sequence[torch.Tensor]
    ) -> None:
        """Clip the parameters about to be uploaded, then add output noise, as `task` asks.

        Weight clipping, update clipping (`anchor`: the global model w), then output noise.
        """
        if task.output_noise not in OUTPUT_NOISE:
            raise ValueError(f"output_noise = {task.output_noise!r}: expected {' | '.join(OUTPUT_NOISE)}")
        if task.weight_clip > 0:
            scale = min(1.0, task.weight_clip / max(_norm(params), 1e-12))
            for p in params:
                p.mul_(scale)
        if task.update_clip > 0:
            scale = min(1.0, task.update_clip / max(_norm([p - a for p, a in zip(params, anchor)]), 1e-12))
            for p, a in zip(params, anchor):
                p.sub_(a).mul_(scale).add_(a)
        if task.output_noise == "none" or task.output_noise_scale == 0:
            return
        # Drawn on the CPU from the task's own stream: the same noise on any worker and device.
        gen = torch.Generator().manual_seed(seed_int(self.seed, "output_noise", rnd, task.client))
        for p in params:
            if task.output_noise == "gaussian":
                z = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            else:  # Laplace(0, 1) as the difference of two Exp(1) draws
                z = torch.empty(p.shape, dtype=p.dtype).exponential_(generator=gen) - torch.empty(
                    p.shape, dtype=p.dtype
                ).exponential_(generator=gen)
            p.add_(z.to(p.device), alpha=task.output_noise_scale)


def full_gradient(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch: int,
    loss: Callable[..., torch.Tensor] = cross_entropy,
) -> list[torch.Tensor]:
    """Return the gradient of the mean loss over all of (x, y) at the model's weights: no clipping, no noise.

    Args:
        model: The model.
        x: The samples.
        y: Their labels.
        batch: The samples computed at a time.
        loss: The loss function.

    Returns:
        The gradient, one tensor per parameter in model.parameters() order.
    """
    params = list(model.parameters())
    total = [torch.zeros_like(p) for p in params]
    for i in range(0, len(y), batch):
        part = loss(model(x[i : i + batch]), y[i : i + batch], reduction="sum") / max(1, len(y))
        for t, g in zip(total, torch.autograd.grad(part, params)):
            t += g
    return total


def _norm(tensors: Iterable[torch.Tensor]) -> float:
    zero = torch.zeros((), dtype=torch.float64)  # sum's start: a tensor, so that the sum is one
    return float(torch.sqrt(sum(((t.detach().double() ** 2).sum() for t in tensors), zero)).item())


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch: int,
    loss: Callable[..., torch.Tensor] = cross_entropy,
    device: torch.device | str = "cpu",
) -> tuple[float, float]:
    """Return the (mean loss, accuracy) of `model` on (x, y) on `device`.

    Args:
        model: The model.
        x: The samples.
        y: Their labels.
        batch: The samples evaluated at a time.
        loss: The model's training loss.
        device: Where the evaluation runs.

    Returns:
        The mean loss and the accuracy.
    """
    model = for_inference(model).to(device)
    if x.dim() == 4:  # conv nets: channels_last runs the CPU's convolutions faster (python -m bench.dp_step)
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # as above
    total, correct = 0.0, 0
    for i in range(0, len(y), batch):
        xb, yb = x[i : i + batch].to(device), y[i : i + batch].to(device)
        out = model(xb.contiguous(memory_format=torch.channels_last) if xb.dim() == 4 else xb)
        total += evaluation_sum(loss, out, yb).item()
        correct += (out.argmax(1) == yb).sum().item()
    return total / max(1, len(y)), correct / max(1, len(y))


def build_trainer(cfg: Scenario, data: FederatedData, device: torch.device) -> Trainer:
    """Build the scenario's trainer.

    Each task carries its round's DP-SGD settings (nodes.contracts.tasks.ClientTask); dp.batch_divisor and
    dp.empty_batch come from the setup message instead, as per-run constants, since the clock charges (and
    the tables record) every byte of a task message; dp.per_sample and dp.batch_eval say how this worker
    computes, not what.

    Args:
        cfg: The scenario.
        data: The clients' data.
        device: Where the model trains.

    Returns:
        The trainer.
    """
    dp = cfg.dp
    return Trainer(
        data,
        device,
        model=cfg.model,
        data_cfg=cfg.data,
        seed=cfg.seed,
        per_sample=dp.per_sample,
        batch_eval=dp.batch_eval,
        batch_divisor=dp.batch_divisor,
        empty_batch=dp.empty_batch,
    )
