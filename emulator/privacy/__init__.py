"""Privacy accounting: the ε theorems that turn a client's DP-SGD history into epsilon (dp.accountant:
rdp, prv, pld), the ledgers that the policies charge, and what output perturbation schemes share.

Modules, lowest first: `base` (what every accountant shares), `rdp`, `prv` and `pld` (one theorem each),
`numerical` (what prv and pld share), `ledger` (`PrivacyLedger`, and `epsilon` and `max_steps` of any
history), `output_perturbation` (the classic Gaussian mechanism's constant).

Imports nodes.contracts only.
"""

from emulator.privacy.base import check_delta
from emulator.privacy.ledger import (
    ACCOUNTANTS,
    LedgerEntry,
    PrivacyHistory,
    PrivacyLedger,
    clear_caches,
    epsilon,
    max_steps,
)
from emulator.privacy.output_perturbation import check_epsilon, gaussian_c

__all__ = [
    "ACCOUNTANTS",
    "LedgerEntry",
    "PrivacyHistory",
    "PrivacyLedger",
    "check_delta",
    "check_epsilon",
    "clear_caches",
    "epsilon",
    "gaussian_c",
    "max_steps",
]
