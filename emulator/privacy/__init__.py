"""Privacy accounting: the ε theorems (RDP, PRV, PLD) and the ledgers that the policies charge
(`accountants`).

Imports nodes.contracts only.
"""
