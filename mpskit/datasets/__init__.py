"""The datasets a run names: read once per file and checked (dataset_info.json entries and the rows
behind them), plain data files told by their shape and registered for the run, and their token lengths.

Torch: none at module level. (dataset_checks runs the rows through LLaMA-Factory's converter, which
loads torch, inside the one function that does it, for `mpskit train`.)

May import: the shared modules at the bottom (mpskit/*.py and mpskit.rundir), and this package.
"""
