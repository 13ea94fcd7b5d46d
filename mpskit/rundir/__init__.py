"""A run folder and everything mpskit keeps in it, one module each: the run record (record.py,
mpskit.json), the folder itself with its llamafactory.yaml, results and `latest` link (folder.py: the
`RunDir` a command opens once), LLaMA-Factory's trainer log (trainer_log.py) and the checkpoints
(checkpoints.py). No torch import.

`RunDir` owns these files: a module that needs one asks the RunDir it was given; nothing outside this
package names them (a test checks). The other files of a run are written by the module that makes them,
into the folder RunDir made: the plots (run/plots.py), train.log (run/quiet.py), rank-N.json of a
several-process run (run/attempts.py), and the evaluations (tools/evaluate.py, into RunDir.new_folder).
"""
