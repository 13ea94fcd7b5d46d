"""What `mpskit train`, `config` and `plan` do, end to end: the run their words describe, every check
before a run folder exists (which `config` shares), then the run folder written and trained (also
--resume and each torchrun rank); `config` writes the YAML instead, `plan` shows the plan.

Torch: none at module level.

May import: every package below it (the shared modules at the bottom, mpskit.machine, mpskit.datasets,
mpskit.settings, mpskit.plan, mpskit.engine, mpskit.run, mpskit.trials), and this package.
"""
