"""What the user chose, read and checked: run files and command-line words, knob values and ranges,
removed transformers keys, the seed fork's keys, 4-bit settings, fooDPO's and mpskit's own settings
with their help, the resolved run (presets, the machine and the datasets joined), and the RunSpec (what
one training attempt runs: LLaMA-Factory's arguments and mpskit's own settings, split once).

Torch: none at module level.

May import: the shared modules at the bottom (mpskit/*.py and mpskit.rundir), mpskit.machine,
mpskit.datasets, and this package.
"""
