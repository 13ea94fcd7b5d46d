"""A device's step-time figures fitted to timed steps of real runs (bench/real.py's fit cases).

The duration model (duration.py) is linear in the figures a profile measures for real checkpoints:
a micro-step's fixed cost per decoder layer (`half_layer_s`), the seconds to dequantize a weight in
each pass (`quantized_weight_s`), and the work of a 16-bit checkpoint and of a quantized base against
float32's (`half_work`, `quantized_work`). The float32 rate and the fixed cost per micro-step stay the
profile's: a 16-bit checkpoint's steps cannot tell them from the others. The fit minimises the
relative error of each step (a 1 s step counts as much as a 5 s one), every figure at least 0
(scipy's non-negative least squares).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from mpskit.datasets.token_lengths import DataLengths
from mpskit.errors import MpskitError
from mpskit.machine.hardware import WORK_RATIOS
from mpskit.plan.duration import Throughput, run_duration, tokens_per_second
from mpskit.plan.memory import ModelDims
from mpskit.settings.knobs import Knobs

FITTED = ("half_layer_s", "quantized_weight_s", "half_work", "quantized_work")
# On a GPU 16-bit work costs at most 1.25 times float32's (M1 and M2 emulate bf16: duration.work_factor's
# rule), a quantized base's about as much. A fit far above that took a fixed cost for work: on an H200 the
# real model's steps took 0.21-0.45 s whatever their tokens (kernel launches; bench/real.py --hardware
# detect), and the fit made 16-bit work 10.7 times float32's and a 4-bit base's 6.1 times.
GPU_MAX_WORK_RATIO = 2.0


@dataclass(frozen=True)
class TimedStep:
    """A run's setting as the plan saw it, and its measured steady optimizer step."""

    args: dict
    stage: str
    dims: ModelDims
    knobs: Knobs
    effective_batch: int
    lengths: DataLengths | None
    seconds: float


def predicted_step_s(step: TimedStep, speed: Throughput, device: str = "cpu") -> float:
    speed_now = tokens_per_second(step.dims, step.knobs, step.stage, device, speed, True, step.lengths)
    return run_duration(step.args, step.knobs, speed_now, step.stage, step.effective_batch, 1, speed,
                        step.lengths, device).step_s  # fmt: skip


def fit_figures(steps: list[TimedStep], profile: Throughput, source: str, device: str = "cpu") -> Throughput:
    """PROFILE with the FITTED figures that bring its predictions closest to the STEPS' times; a figure
    that none of the steps exercises stays the profile's."""
    import numpy as np
    from scipy.optimize import nnls

    none_yet = replace(profile, **dict.fromkeys(FITTED, 0.0))  # what each step costs before the fitted figures
    offsets = np.array([predicted_step_s(step, none_yet, device) for step in steps])
    columns = {name: np.array([predicted_step_s(step, replace(none_yet, **{name: 1.0}), device) for step in steps])
               - offsets for name in FITTED}  # fmt: skip
    exercised = [name for name in FITTED if columns[name].any()]
    seconds = np.array([step.seconds for step in steps])
    matrix = np.column_stack([columns[name] for name in exercised]) / seconds[:, None]
    weights, _ = nnls(matrix, 1 - offsets / seconds)
    fitted = dict(zip(exercised, map(float, weights), strict=True))
    if any(fitted.get(name) == 0 for name in WORK_RATIOS):  # steps that took no longer with more work
        raise MpskitError("the timed steps do not grow with their work, so no figures fit them (a busy machine?)",
                          "time them again on a quiet machine")  # fmt: skip
    if device != "cpu" and any(fitted.get(name, 0.0) > GPU_MAX_WORK_RATIO for name in WORK_RATIOS):
        raise MpskitError(f"the timed steps on {device} are mostly a fixed cost (kernel launches, for a model this "
                          "small), so they measure no rate", "time your own setting's steps: mpskit plan --probe")
    return replace(profile, **fitted, source=source, measured=True)
