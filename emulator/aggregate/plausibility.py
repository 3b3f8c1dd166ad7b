"""`aggregate.max_update_norm`: the server's plausibility bound on each update, checked before it is
aggregated (emulator.rounds.round.client_job). An update above its bound is rejected, outcome `implausible`.

A number N bounds the norm of every decoded update (what is aggregated). `0` (auto, the default)
derives a bound from each task, one that an honest client's update exceeds with probability at most
FALSE_REJECTION. Where none derives (plain SGD without any clip, or a user's codec that bounds nothing),
only float32's own bound is left (`beyond_float32`): a model the client trained, or a residual it kept,
with a value of magnitude checkpoint.MAX_ABS (2^64) or more is implausible, since from such a weight every
squared norm, loss and gradient a worker computes is inf, however honest (and no checkpoint holds it).
Nothing below that is rejected: an unclipped run whose updates grow, honestly, goes on. `inf` turns
the check off. The run's other guard, that the global model stays finite, holds either way
(emulator.rounds.round.finite_or_stop).

The derivation (`trained_bound`), for a task of s steps at rate q, learning rate eta, clip C, noise
multiplier sigma on a client of n samples, divisor B (nodes.training.trainer: dp.batch_divisor, or the
expected batch max(1, q n)) and a model of d parameters. One step of nodes.training.trainer (either per-sample
path, nodes.training.dp_step; nodes.training.bundle alike) is plain SGD, no momentum and no weight decay:
w <- w - eta (S + sigma C z) / B - eta mu (w - w_global), where S sums the batch's per-sample
gradients, each clipped to norm <= C (factor min(1, C / (||g|| + 1e-6))), z ~ N(0, I_d) is fresh
noise, and mu is FedProx's (0 unless the task sets prox_mu). With u = w - w_global, each step is
u <- (1 - eta mu) u - eta (S + sigma C z) / B, so for 0 <= eta mu <= 2 (|1 - eta mu| <= 1) the
update after s steps is u = -(eta / B) sum_k c_k (S_k + sigma C z_k) with |c_k| <= 1, and
||u|| <= (eta C / B) X + (eta sigma C / B) ||sum_k c_k z_k||, whatever the gradients:

* X = the batches' total size, Binomial(n s, q) (each step's Poisson batch draws each sample with
  probability q; a step skipped, dp.empty_batch=skip, only lowers it). Bernstein's inequality
  (Boucheron, Lugosi & Massart, Concentration Inequalities, 2013, eq. 2.10): with mean m = n s q and
  variance v = m (1 - q), P(X >= m + a) <= exp(-a^2 / (2 (v + a/3))); a = L/3 + sqrt(L^2/9 + 2 v L)
  gives exp(-L). X <= n s always.
* sum_k c_k z_k is N(0, (sum c_k^2) I_d), the c_k fixed: sqrt(sum c_k^2) ||z|| <= sqrt(s) ||z||. The
  norm is 1-Lipschitz, so Gaussian concentration (Tsirelson-Ibragimov-Sudakov; ibid. Thm 5.6) gives
  P(||z|| >= E||z|| + t) <= exp(-t^2 / 2), and E||z|| <= sqrt(E||z||^2) = sqrt(d): t = sqrt(2 L).

Then the task's generic mechanisms (nodes.training.trainer.Trainer._perturb, in its order): a weight clip to W
gives ||s' w_T - w|| <= min(that, W) + ||w|| (s' <= 1 the scale); an update clip to U caps it at U;
output noise adds b (sqrt(d) + sqrt(2 L)) (Gaussian, std b) or b sqrt(d) ln(3 d / p) (Laplace, scale
b: P(max_i |L_i| > x) <= d exp(-x / b), a union bound). Each of the three random events gets a third
of p = FALSE_REJECTION, L = ln(3 / p): by the union bound the whole exceeds p at most.

The upload's codec (nodes.contracts.codecs) compresses P = that update plus the error-feedback residual r
the server sent (||P|| <= bound + ||r||), and its decoded update and the new residual P - decoded are
bounded by ||P||: top-k keeps a subset of P's coordinates; sign's mean |P_k| times sqrt(n_k) is
||P_k||_1 / sqrt(n_k) <= ||P_k|| per tensor (Cauchy-Schwarz), and its residual is the least-squares
one, no longer than P; QSGD's coordinate |decoded_i| <= |P_i| + ||P_k|| / s_q with s_q levels
(level <= r + 1), so ||decoded|| <= ||P|| (1 + sqrt(n_max) / s_q) and ||P - decoded|| <= ||P|| sqrt(n_max)
/ s_q, n_max the largest tensor's size. A user's codec states its own factors (`Codec.norm_factors`;
inf, no bound, where it does not). float32 rounding is covered by a relative SLACK and an absolute
one of (s + 4) 2^-20 (||w|| + bound): ulps of the weights, at each step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from emulator.aggregate.compression import Compression
from nodes.contracts.protocol import MessageType
from nodes.contracts.tasks import MAX_ABS, ClientTask, Weights
from nodes.transport.dispatch import Reply

FALSE_REJECTION = 1e-9  # the probability that an honest update exceeds its derived bound
SLACK = 1e-3  # relative: float32 rounding, of the clip factor and the noise among others
IMPLAUSIBLE = "implausible update"  # how a rejected reply's failure begins (emulator.rounds.round.is_implausible)
_EVENTS = 3  # the random terms the false-rejection probability is split among: batch sizes, DP noise, output noise


def trained_bound(task: ClientTask, n: int, d: int, divisor: float, weight_norm: float) -> float:
    """The norm an honest update of `task` (on a client of `n` samples, a model of `d` parameters whose
    global weights have norm `weight_norm`, the trainer's `divisor`) exceeds with probability at most
    FALSE_REJECTION, before its codec (the derivation is the module's); inf where none derives."""
    log_odds = math.log(_EVENTS / FALSE_REJECTION)  # L
    gaussian = math.sqrt(d) + math.sqrt(2 * log_odds)  # ||z|| of N(0, I_d), but with probability p / 3
    s, lr = task.steps, task.lr
    bound = math.inf
    if task.clip > 0 and 0 <= lr * task.prox_mu <= 2:
        trials = n * s
        mean = trials * task.q
        var = mean * (1 - task.q)
        batches = min(trials, mean + log_odds / 3 + math.sqrt(log_odds**2 / 9 + 2 * var * log_odds))
        bound = lr * task.clip * (batches + task.sigma * math.sqrt(s) * gaussian) / divisor
    if task.weight_clip > 0:
        bound = min(bound, task.weight_clip) + weight_norm
    if task.update_clip > 0:
        bound = min(bound, task.update_clip)
    b = task.output_noise_scale
    if task.output_noise == "gaussian" and b > 0:
        bound += b * gaussian
    elif task.output_noise == "laplace" and b > 0:
        bound += b * math.sqrt(d) * math.log(_EVENTS * d / FALSE_REJECTION)
    if not math.isfinite(bound):
        return math.inf
    return bound * (1 + SLACK) + (s + 4) * 2.0**-20 * (weight_norm + bound)


def codec_factors(comp: Compression, shapes: Sequence[tuple[int, ...]]) -> tuple[float, float]:
    """(decoded, residual): the most the codec's decoded update and its new residual can be, each per
    unit norm of what it compressed (the module's derivation; a codec's own `norm_factors`)."""
    return (1.0, 1.0) if comp.codec is None else comp.codec.norm_factors(shapes)


def norm(tensors: Mapping[str, np.ndarray], minus: Mapping[str, np.ndarray] | None = None) -> float:
    """The L2 norm over every tensor, in float64 (of tensors - minus where given); inf or NaN where
    a value is, without numpy's warnings."""
    with np.errstate(over="ignore", invalid="ignore"):
        total = 0.0
        for k, v in tensors.items():
            x = v.astype(np.float64) - minus[k] if minus is not None else v.astype(np.float64)
            total += float(np.dot(x.reshape(-1), x.reshape(-1)))
        return math.sqrt(total)


def beyond_float32(model: Mapping[str, np.ndarray], residual: Mapping[str, np.ndarray] | None) -> str:
    """Why a reply is implausible where no bound derives from its task: a value of the model it trained (or of
    the residual it kept) of magnitude MAX_ABS or more, which no honest training goes on from; '' if none."""
    for what, tensors in (("the model it trained", model), ("its residual", residual or {})):
        top = max((float(np.abs(v).max()) for v in tensors.values() if v.size), default=0.0)
        if not top < MAX_ABS:  # NaN too
            return (
                f"{IMPLAUSIBLE}: a value of magnitude {top:.3g} in {what}, 2^64 or more (checkpoint.MAX_ABS); "
                "no bound derives from its task (aggregate.max_update_norm=0: auto)"
            )
    return ""


class UpdateBounds:
    """One run's aggregate.max_update_norm, with what its derivation needs: the trainer's dp.batch_divisor and
    the clients' data sizes (as the trainer splits them)."""

    def __init__(self, max_update_norm: float, batch_divisor: float, sizes: Sequence[int]):
        self.fixed = max_update_norm  # 0: auto
        self.sizes, self.batch_divisor = sizes, batch_divisor
        self._model: tuple[Weights, float] | None = None  # the last global model's norm: one per round's clients

    def of(self, t: ClientTask, weights: Weights) -> float:
        """The trained update's bound, before its codec (inf: none)."""
        n = self.sizes[t.client]
        d = sum(int(w.size) for w in weights.values())
        if self._model is None or self._model[0] is not weights:
            self._model = weights, norm(weights)
        return trained_bound(t, n, d, self.batch_divisor or max(1.0, t.q * n), self._model[1])

    def problem(self, t: ClientTask, reply: Reply, weights: Weights, comp: Compression) -> str:
        """Why `reply` (checked and unpacked: its message's `model` is w + the decoded update) is
        implausible; '' if it is not."""
        if self.fixed == math.inf:
            return ""
        msg = reply.message
        assert msg is not None  # a reply without a failure has its message
        update = norm(msg["update"]) if msg.get("type") == MessageType.COMPRESSED else norm(msg["model"], weights)
        if self.fixed > 0:
            return (
                ""
                if update <= self.fixed
                else f"{IMPLAUSIBLE}: norm {update:.4g} > aggregate.max_update_norm={self.fixed:g}"
            )
        trained = self.of(t, weights)
        decoded, residual = codec_factors(comp, [w.shape for w in weights.values()])
        if trained == math.inf or decoded == math.inf:  # no bound derives, or the codec bounds nothing
            return beyond_float32(msg["model"], msg.get("residual") if comp.feedback else None)
        sent = comp.residuals.get(t.client, {}) if comp.feedback else {}
        compressed = trained + (norm(sent) if sent else 0.0)  # what the worker compressed, at most
        if not update <= compressed * decoded * (1 + SLACK):  # NaN too
            return (
                f"{IMPLAUSIBLE}: norm {update:.4g} > {compressed * decoded * (1 + SLACK):.4g}, the bound its task "
                f"derives (aggregate.max_update_norm=0: auto)"
            )
        if comp.feedback and residual < math.inf:
            kept = norm(msg["residual"])
            if not kept <= compressed * residual * (1 + SLACK):
                return (
                    f"{IMPLAUSIBLE}: its residual's norm {kept:.4g} > {compressed * residual * (1 + SLACK):.4g}, "
                    "the bound its task derives (aggregate.max_update_norm=0: auto)"
                )
        return ""
