"""What `mpskit train` and `mpskit config` do, end to end: every check before a run folder exists,
then the run folder written and trained (also --resume and each torchrun rank).

May import: every package below it (mpskit.errors, mpskit.stages, mpskit.rundir, mpskit.inputs,
mpskit.plan, mpskit.engine, mpskit.run), and this package.
"""
