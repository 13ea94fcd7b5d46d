"""What `mpskit train` does, end to end: every check before a run folder exists (which `mpskit config`
shares: the command line writes its YAML), then the run folder written and trained (also --resume and
each torchrun rank).

Torch: none at module level.

May import: every package below it (mpskit.errors, mpskit.stages, mpskit.rundir, mpskit.inputs,
mpskit.plan, mpskit.engine, mpskit.run), and this package.
"""
