"""One training run while it runs: attempt after attempt (the out-of-memory ladder, signals, a full
disk, records), the callbacks that stop cleanly, the memory monitor, the progress line, keeping the Mac
awake, and the plots a run leaves.

Torch: at module level in callbacks, monitor and progress (TrainerCallbacks), which an attempt
imports once the engine is imported.

May import: the shared modules at the bottom (mpskit/*.py and mpskit.rundir), the rooms of the inputs
(mpskit.machine, mpskit.datasets, mpskit.settings), mpskit.plan, mpskit.engine, and this package.
"""
