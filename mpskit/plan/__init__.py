"""What a run needs and how long it takes: the memory model and its allocator profiles, the budget,
the planner, the duration, and what `mpskit plan` prints. The trial runs that measure steps live in
mpskit.trials.

Torch: none at module level.

May import: the shared modules at the bottom (mpskit/*.py and mpskit.rundir), the rooms of the inputs
(mpskit.machine, mpskit.datasets, mpskit.settings), and this package.
"""
