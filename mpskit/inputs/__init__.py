"""What the user gives, read and checked: presets and run files, command-line words, knob values and
ranges, removed transformers keys, hardware profiles and their MPS variables, the process layout, the
resolved run, the datasets it names (plain data files told by their shape and registered), the
optional packages its keys need, the seed fork's keys, fooDPO's settings, and the RunSpec (what one
training attempt runs: LLaMA-Factory's arguments and mpskit's own settings, split once).

Torch: none at module level. (dataset_checks runs the rows through LLaMA-Factory's converter, which
loads torch, inside the one function that does it, for `mpskit train`.)

May import: mpskit.errors, mpskit.stages, mpskit.rundir, and this package.
"""
