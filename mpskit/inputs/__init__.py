"""What the user gives, read and checked: presets and run files, command-line words, knob values and
ranges, removed transformers keys, hardware profiles and their MPS variables, the process layout, the
resolved run, and the datasets it names. No torch.

May import: mpskit.errors, mpskit.stages, mpskit.rundir, and this package.
"""
