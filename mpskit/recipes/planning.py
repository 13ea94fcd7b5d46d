"""`mpskit plan`: the memory plan of a run and how long it takes."""

from __future__ import annotations

import json
import shlex
import sys

from mpskit.recipes.from_words import note_device_problems, resolve_from_words
from mpskit.settings.foodpo import check_foodpo

NOTHING_FITS = 3  # the report is printed, and no setting fits


def show_plan(words: list[str]) -> int:
    """The memory plan for a run and how long it takes; no torch import, so it answers at once (with
    --probe, after timing a few real steps). Exit code 3 when no setting fits, so scripts can tell."""
    from mpskit.datasets.dataset_checks import check_datasets
    from mpskit.engine import lf
    from mpskit.plan.advice import plan_duration, plan_run
    from mpskit.plan.plan_report import plan_as_dict, plan_lines
    from mpskit.trials.probe import check_probe_machine, probe

    as_json, probing = "--json" in words, "--probe" in words
    words = [w for w in words if w not in ("--json", "--probe")]
    run, _ = resolve_from_words(words, typed=False)
    check_foodpo(run.args)  # what config and train refuse, plan refuses too
    note_device_problems(run)
    lf.check_keys(run.args, lf.key_names())
    check_datasets(run.args, rows=False)  # names and stage as train checks them; rows only there
    if probing:
        check_probe_machine(run.hardware)
    memory_plan = plan_run(run)
    duration = plan_duration(run, memory_plan)
    timed = probe(words, memory_plan, run.world_size) if probing and memory_plan.fits else None
    if probing and not memory_plan.fits:
        print("mpskit: no probe: no setting fits", file=sys.stderr)
    if as_json:
        print(json.dumps(plan_as_dict(run, memory_plan, duration, timed), indent=2))
    else:
        command = shlex.join(["mpskit", "plan", *words, "--probe"])
        print("\n".join(plan_lines(run, memory_plan, duration, timed, command)))
    return 0 if memory_plan.fits else NOTHING_FITS
