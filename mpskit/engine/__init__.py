"""The bridge to LLaMA-Factory and what runs inside it: its keys, YAML and run_exp (lf.py), the lean
logits and lean attention paths, mpskit's trainers (lean, fooDPO, resumable), a quantized base read
tensor by tensor (quantized.py), the trainer log, and the process environment.

Torch: at module level (the rooms above import these modules only where a run, a chat or an export
needs them).

May import: the shared modules at the bottom (mpskit/*.py and mpskit.rundir), the rooms of the inputs
(mpskit.machine, mpskit.datasets, mpskit.settings), mpskit.plan, and this package.
"""
