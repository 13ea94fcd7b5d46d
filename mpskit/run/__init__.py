"""One training run while it runs: attempt after attempt (the out-of-memory ladder, signals, a full
disk, records), the callbacks that stop cleanly, the memory monitor, the progress line, keeping the Mac
awake, and the plots a run leaves.

May import: mpskit.errors, mpskit.stages, mpskit.rundir, mpskit.inputs, mpskit.plan, mpskit.engine,
and this package.
"""
