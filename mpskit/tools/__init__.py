"""What a user does around training: the demo, the tiny offline model, chat/export/eval of a finished
run, comparing and listing runs, and the doctor.

May import: everything but mpskit.cli.
"""
