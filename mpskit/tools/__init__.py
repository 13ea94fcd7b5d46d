"""What a user does around training: the demo, the tiny offline model, chat/export/eval of a finished
run, comparing and listing runs, and the doctor.

Torch: at module level in merge_shards (a quantized run's export) only.

May import: everything but mpskit.cli.
"""
