"""`mpskit plan --probe`: a few real steps of the planned setting, timed on this machine.

A fresh `mpskit train` process, in a temporary folder of its own, trains the chosen setting (pinned,
so nothing is re-planned) on the first examples of the run's own dataset for one warm-up step and
PROBE_STEPS timed ones, with no evaluation or checkpoint; the run's memory monitor times each
optimizer step. A whole run is then the warm-up step plus the median timed step for each step after
it (duration.extrapolate), and the time to start is what the process took beyond its steps.
"""

from __future__ import annotations

import sys
import time

from mpskit.errors import MpskitError
from mpskit.machine.hardware import Hardware, detect
from mpskit.plan.duration import Probe
from mpskit.plan.planner import Plan
from mpskit.rundir.folder import RunDir
from mpskit.settings.knobs import to_args
from mpskit.temporary import private_folder
from mpskit.trials.measure import TIMED_ONLY, train_in_fresh_process

PROBE_STEPS = 3


def check_probe_machine(hw: Hardware) -> None:
    """A probe times this machine: a profile of another kind of machine cannot be probed here."""
    if hw.source == "this machine":
        return
    here = detect()
    if here.kind != hw.kind:
        raise MpskitError(
            f"--probe times this machine ({here.kind}), and profile {hw.name} describes a {hw.kind} machine",
            f"drop --probe for {hw.name}'s own figures, or run the probe on that machine",
        )


def probe(words: list[str], plan: Plan, world_size: int = 1) -> Probe:
    """Train the plan's chosen setting for 1 + PROBE_STEPS steps in a fresh process and time it."""
    setting = to_args(plan.chosen.knobs, plan.effective_batch)  # lean_logits as the words say: no search moves it
    pinned = [f"{key}={str(value).lower() if isinstance(value, bool) else value}" for key, value in setting.items()]
    steps = 1 + PROBE_STEPS
    overrides = [
        *pinned,
        f"max_steps={steps}",
        f"max_samples={plan.effective_batch * world_size * steps}",  # only what the steps read is prepared
        "val_size=0",
        "do_predict=false",
        "load_best_model_at_end=false",
        "resume_from_checkpoint=",
        *TIMED_ONLY,
    ]
    out = private_folder("mpskit-probe-") / "run"  # removed at exit, SIGTERM included (temporary.py)
    print(f"mpskit: probe: training {steps} steps of the chosen setting in a fresh process", file=sys.stderr)
    started = time.perf_counter()
    fix = "run `mpskit train` with the same words to see the whole message"
    train_in_fresh_process([*words, *overrides, f"output_dir={out}"], "the probe", fix)
    wall_s = time.perf_counter() - started
    step_seconds = RunDir.open(out).record.memory.measured.step_seconds
    return Probe(step_seconds, max(wall_s - sum(step_seconds), 0.0))
