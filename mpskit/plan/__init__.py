"""What a run needs and how long it takes: the memory model, the budget, the planner, the duration,
what `mpskit plan` prints, and the measured steps behind them (probe, measure; each trains in a
process of its own).

Torch: none at module level.

May import: the shared modules at the bottom (mpskit/*.py and mpskit.rundir), the rooms of the inputs
(mpskit.machine, mpskit.datasets, mpskit.settings), and this package.
"""
