"""The machine a run trains on: its hardware profile (detected, or a preset), the MPS variables of an
Apple GPU, the process layout of a launch, the Hugging Face cache and hub, and the optional packages a
run's keys need.

Torch: none at module level.

May import: the shared modules at the bottom (mpskit/*.py and mpskit.rundir), and this package.
"""
