"""Trial runs: real training steps in processes of their own, measured (memory and time), and the
duration model's figures fitted to them. `mpskit plan --probe`, `mpskit calibrate`, `mpskit doctor` and
the benches start them; each spawns `mpskit train`.

Torch: none at module level.

May import: the shared modules at the bottom (mpskit/*.py and mpskit.rundir), the rooms of the inputs
(mpskit.machine, mpskit.datasets, mpskit.settings), mpskit.plan, and this package.
"""
