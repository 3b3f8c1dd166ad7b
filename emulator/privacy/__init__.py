"""Privacy accounting: the ε theorems that turn a client's DP-SGD history into epsilon (dp.accountant:
rdp, prv, pld, or a user's `EpsilonTheorem` subclass), the ledgers that the policies charge, and what
output perturbation schemes share.

Modules, lowest first: `base` (`EpsilonTheorem`, the contract every accountant keeps), `rdp`,
`numerical` (what prv and pld share), `prv` and `pld`, `registry` (`ACCOUNTANTS`: which theorem
dp.accountant names), `ledger` (`PrivacyLedger`, and `epsilon` and `max_steps` of any history),
`output_perturbation` (the classic Gaussian mechanism's constant).

Imports nodes.contracts only.
"""

from emulator.privacy.base import EpsilonTheorem, check_delta
from emulator.privacy.ledger import LedgerEntry, PrivacyHistory, PrivacyLedger, clear_caches, epsilon, max_steps
from emulator.privacy.output_perturbation import check_epsilon, gaussian_c
from emulator.privacy.registry import ACCOUNTANTS, AccountantError, theorem

__all__ = [
    "ACCOUNTANTS",
    "AccountantError",
    "EpsilonTheorem",
    "LedgerEntry",
    "PrivacyHistory",
    "PrivacyLedger",
    "check_delta",
    "check_epsilon",
    "clear_caches",
    "epsilon",
    "gaussian_c",
    "max_steps",
    "theorem",
]
