"""`mpskit plan` output: the estimate's breakdown, the budget, the verdict, the choice, alternatives."""

from __future__ import annotations

from dataclasses import replace

from mpskit.plan.duration import Probe, RunDuration, extrapolate, format_seconds
from mpskit.plan.memory import (
    GB,
    attention_fused,
    lean_attention_runs,
    lean_logits_apply,
    parameters_text,
)
from mpskit.plan.planner import Option, Plan, data_estimate
from mpskit.settings.knobs import describe
from mpskit.settings.resolve import ResolvedRun


def _gb(value: int) -> str:
    return f"{value / GB:6.2f} GB"


def plan_lines(
    run: ResolvedRun, plan: Plan, duration: RunDuration | None = None, probe: Probe | None = None,
    probe_command: str = "mpskit plan ... --probe",
) -> list[str]:
    dims, budget = plan.dims, plan.budget
    shown = plan.chosen or plan.asked
    lines = [
        f"run        {run.stage} with {run.args['model_name_or_path']} on {run.hardware.name} ({plan.device})",
        f"model      {parameters_text(dims.params())} parameters, {dims.layers} layers, hidden {dims.hidden}, "
        f"vocabulary {dims.vocab}",
        f"budget     {budget.training_bytes / GB:.2f} GB{' per process' if plan.asked.knobs.world_size > 1 else ''}"
        f" = {budget.why}",
    ]
    if plan.fits:
        used = shown.estimate.training / budget.training_bytes
        lines.append(f"verdict    fits: {shown.estimate.training / GB:.2f} GB, {used:.0%} of the budget")
        lines.append(f"chosen     {describe(shown.knobs, plan.effective_batch)}")
    else:
        lines.append("verdict    NO SETTING FITS")
        lines.append(f"asked      {describe(shown.knobs, plan.effective_batch)}")
    lines += _estimate_lines(plan, shown)
    lines.append(f"logits     {_logits_line(plan, shown)}")
    lines.append(f"attention  {_attention_line(plan, shown)}")
    lines += [f"changed    {note}" for note in plan.changes]
    if plan.alternatives:
        lines.append("also fits  (speed relative to the choice)")
        for option in plan.alternatives:
            lines.append(f"  {_alternative(option, plan)}")
    if not plan.fits:
        lines += [f"would fit  {note}" for note in (plan.over_budget, *plan.would_fit)]
    if duration:
        lines += duration_lines(duration, probe, lengths_line(plan, shown.knobs.cutoff_len), probe_command,
                                plan.device)  # fmt: skip
    return lines


def _estimate_lines(plan: Plan, shown: Option) -> list[str]:
    """The memory of the shown setting, part by part: a training step, a held-out batch, the peak."""
    lines = []
    per = f", per process of {shown.knobs.world_size}" if shown.knobs.world_size > 1 else ""
    longest = plan.longest_batch(shown.knobs)
    at = "" if longest is None or longest >= shown.knobs.cutoff_len else f", at the data's longest {longest} tokens"
    estimate = shown.estimate
    lines.append(f"estimate   (the peak of one training step{per}{at})")
    lines += [f"  {name:22} {_gb(value)}" for name, value in estimate.parts.items()]
    lines.append(f"  {'= training step':22} {_gb(estimate.step)}")
    if estimate.eval_parts:
        lines.append(f"evaluation (the peak of one held-out batch of {shown.knobs.eval_batch}, no gradients)")
        lines += [f"  {name:22} {_gb(value)}" for name, value in estimate.eval_parts.items()
                  if estimate.parts.get(name) != value]  # fmt: skip
        lines.append(f"  {'= evaluation':22} {_gb(estimate.evaluation)}  (the parts not shown as above)")
    if estimate.loading > estimate.step:
        lines.append(f"  {'(loading, quantizing)':22} {_gb(estimate.loading)}")
    lines.append(f"  {'= peak':22} {_gb(estimate.training)}  ({estimate.peak_moment})")
    where = "host RAM, outside the GPU budget" if plan.device == "cuda" else "taken out of the RAM budget already"
    lines.append(f"  {'+ framework (imports)':22} {_gb(estimate.framework)}  ({where})")
    lines.append(f"  {'+ libraries in use':22} {_gb(estimate.libraries)}  (their code the run first runs; {where})")
    if not plan.allocator.measured:  # allocators.py: nothing was measured in this allocator
        unmeasured = "MPS" if plan.device == "mps" else "a CPU without glibc"
        lines.append(f"  figures unmeasured on {unmeasured}: the Linux CPU's factors, borrowed; no heap terms")
    return lines


def lengths_line(plan: Plan, cutoff: int) -> str:
    """What the plan took the rows' lengths to be."""
    if plan.lengths is None:
        return f"every row at cutoff_len ({plan.lengths_note}): an upper bound for shorter rows"
    return plan.lengths.summary(cutoff)


def duration_lines(duration: RunDuration, probe: Probe | None, lengths: str, probe_command: str = "",
                   device: str = "cpu") -> list[str]:  # fmt: skip
    """The predicted step and run, the rows' lengths and figures behind them, what the probe measured.
    Calibrating is named where the real model's steps measure a rate: not on CUDA, where they are kernel
    launches (time_fit.GPU_MAX_WORK_RATIO)."""
    steps = "steps unknown (the dataset is not a local JSON file): set max_steps for a total"
    if duration.steps is not None:
        how = f" ({duration.examples} examples, {duration.epochs:g} epochs)" if duration.epochs else " (max_steps)"
        steps = f"{duration.steps} steps{how}"
        steps += f": {format_seconds(duration.total_s)}" if duration.total_s is not None else ""
    if duration.unmeasured:
        lines = [f"duration   unknown: {duration.unmeasured}, so no figure backs a step's time; {steps}",
                 f"  time 4 real steps of this setting on the machine: {probe_command}", f"  {lengths}"]  # fmt: skip
        return lines if probe is None else lines + probe_lines(duration, probe)
    lines = [
        f"duration   {format_seconds(duration.step_s)} per optimizer step, {steps}",
        f"  figures {duration.throughput.source}",
        f"  {lengths}",
    ]
    if not duration.throughput.measured and device != "cuda":
        lines.append("  `mpskit calibrate`, run on that machine, fits its figures to real steps (a few minutes, once)")
    if probe is None:
        return lines + ["  `mpskit plan --probe` times real steps of this setting here"]
    return lines + probe_lines(duration, probe)


def probe_lines(duration: RunDuration, probe: Probe) -> list[str]:
    """What the probe measured, and the whole run from it."""
    lines = [
        f"probe      {format_seconds(probe.step_s)} per optimizer step measured here (median of "
        f"{len(probe.step_seconds) - 1}, after a {format_seconds(probe.step_seconds[0])} warm-up step)"
    ]
    if duration.steps is not None:
        total = extrapolate(probe.step_seconds, duration.steps)
        lines.append(f"  {duration.steps} steps: {format_seconds(total)}, plus about {format_seconds(probe.startup_s)} "
                     "to load and save")  # fmt: skip
    return lines


def lean_saving(plan: Plan, option: Option, path: str) -> int | None:
    """Bytes a lean path (`lean_logits` or `lean_attention`) saves over what it replaces for this
    setting; None where it does not run."""
    if path == "lean_logits":
        runs = lean_logits_apply(option.knobs, plan.stage, plan.dims)
    else:
        runs = lean_attention_runs(option.knobs, plan.device, plan.dims)
    if not runs:
        return None
    plain_knobs = replace(option.knobs, **{path: False})
    plain = data_estimate(plan.dims, plain_knobs, plan.stage, plan.device, plan.lengths, plan.allocator)
    return plain.training - option.estimate.training


def _logits_line(plan: Plan, option: Option) -> str:
    saving = lean_saving(plan, option, "lean_logits")
    if saving is not None:
        return f"lean logits: -{saving / GB:.2f} GB against whole logits (lean_logits=false)"
    if option.knobs.lean_logits:
        return "whole logits: lean logits need sft, dpo or foodpo with LoRA"
    return "whole logits (lean_logits=false)"


def _attention_line(plan: Plan, option: Option) -> str:
    saving = lean_saving(plan, option, "lean_attention")
    attention = option.knobs.attention
    fused = attention_fused(attention, plan.device)
    if saving is None and fused:
        return f"{attention}: fused on {plan.device}, no heads x s x s matrices (lean attention off)"
    if saving is None:
        return f"{attention}: keeps the heads x s x s attention matrices (lean_attention=false)"
    replaced = "fused SDPA" if fused else {"eager": "eager attention"}.get(attention, "SDPA's math path")
    return f"lean attention: {'-' if saving >= 0 else '+'}{abs(saving) / GB:.2f} GB against {replaced}"


def _alternative(option: Option, plan: Plan) -> str:
    speed = option.speed / plan.chosen.speed
    return f"{describe(option.knobs, plan.effective_batch)}: {option.estimate.training / GB:.2f} GB, x{speed:.2f}"


def plan_as_dict(run: ResolvedRun, plan: Plan, duration: RunDuration | None = None, probe: Probe | None = None) -> dict:
    def option(o: Option | None) -> dict | None:
        if o is None:
            return None
        return {"knobs": vars(o.knobs), "estimate": o.estimate.as_dict(), "relative_speed": o.speed / plan.asked.speed}

    return {
        "stage": run.stage,
        "hardware": run.hardware.name,
        "device": plan.device,
        "model": str(run.args["model_name_or_path"]),
        "params": plan.dims.params(),
        "budget_gb": round(plan.budget.training_bytes / GB, 3),
        "budget": plan.budget.why,
        "fits": plan.fits,
        "effective_batch": plan.effective_batch,
        "asked": option(plan.asked),
        "chosen": option(plan.chosen),
        "alternatives": [option(o) for o in plan.alternatives],
        "changes": list(plan.changes),
        "would_fit": [plan.over_budget, *plan.would_fit] if plan.over_budget else [],
        "duration": duration.as_dict() if duration else None,
        "lengths": plan.lengths.as_dict((plan.chosen or plan.asked).knobs.cutoff_len) if plan.lengths else None,
        "lengths_note": plan.lengths_note,
        "probe": _probe_dict(probe, duration) if probe else None,
        "lean_logits_saving_gb": _gb_or_none(lean_saving(plan, plan.chosen or plan.asked, "lean_logits")),
        "lean_attention_saving_gb": _gb_or_none(lean_saving(plan, plan.chosen or plan.asked, "lean_attention")),
    }


def _gb_or_none(value: int | None) -> float | None:
    return None if value is None else round(value / GB, 3)


def _probe_dict(probe: Probe, duration: RunDuration) -> dict:
    total = None if duration.steps is None else round(extrapolate(probe.step_seconds, duration.steps), 1)
    return {**probe.as_dict(), "predicted_s": total}
