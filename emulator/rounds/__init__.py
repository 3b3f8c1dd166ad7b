"""One round: the policy plans, the clients train, the clock replays their traffic (`round`: `play_round`,
`RoundRecord`); buffered mode's clients in flight (`flights`); the round, byte and time budgets
(`budgets`).

Imports the layers below it (up to emulator.policies) and nodes.
"""
