"""How long a training step and a whole run take, before the run: a flop count per token, the
hardware's throughput figures, and the number of optimizer steps. No torch import.

The planner ranks settings by `tokens_per_second`, and `mpskit plan` turns the same figures into a
duration, so "the fastest setting" and "how long" come from one model. The figures of a profile say
where they come from; a profile not measured on its own machine says so, `mpskit plan --probe`
(probe.py) times real steps on this one instead, and `mpskit calibrate` (calibrate.py) fits this
machine's figures.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

from mpskit.datasets.dataset_checks import training_rows
from mpskit.datasets.token_lengths import DataLengths
from mpskit.machine.hardware import load_hardware
from mpskit.plan.memory import ModelDims, activation_width, native_half, sequences_per_step
from mpskit.settings.knobs import Knobs, micro_batch
from mpskit.stages import stage_of


@dataclass(frozen=True)
class Throughput:
    """A device's sustained training rate and the fixed cost of one micro-step."""

    flops_per_s: float
    step_overhead_s: float
    source: str
    measured: bool = False  # measured on the machine the profile describes
    # 16-bit work (autocast, or a 16-bit checkpoint's own dtype) against float32's, where measured; else
    # the device's rule: half on a GPU with fast 16-bit, 1.25x where it is emulated (M1/M2), 1 on a CPU
    half_work: float | None = None
    # a micro-step's fixed cost per decoder layer where a 16-bit checkpoint computes without autocast
    # (each LoRA layer casts its input to float32 and back), where measured
    half_layer_s: float = 0.0
    # seconds to dequantize one weight of a quantized base for its matmul, which each pass does again
    # (forward, backward, a recomputed forward, a reference forward), where measured; None: unmeasured,
    # and a plan gives no duration for a quantized base (ASSUMED_QUANTIZED_WORK only ranks it)
    quantized_weight_s: float | None = None
    # a quantized base's work against float32's under 16-bit activations (bitsandbytes' matmuls on the
    # dequantized weights and their backward), where measured; else the activations' own rate
    quantized_work: float | None = None


# What the planner ranks a quantized base's work by where dequantizing was never timed on the device.
ASSUMED_QUANTIZED_WORK = 1 / 0.75


# Used where a profile has no figures of its own (a detected machine, a profile written by hand).
DEFAULT_THROUGHPUT = {
    "mps": Throughput(1.6e12, 0.05, "unmeasured: mpskit's default for an Apple GPU"),
    "cuda": Throughput(3e13, 0.02, "unmeasured: mpskit's default for an NVIDIA GPU"),
}


def throughput_for(figures: dict, profile_device: str, device: str) -> Throughput:
    """The profile's figures when the run uses the profile's own device, else the device's default."""
    if figures and device == profile_device:
        return Throughput(
            float(figures["flops_per_s"]),
            float(figures["step_overhead_s"]),
            str(figures.get("source", "the hardware profile")),
            bool(figures.get("measured", False)),
            _optional_float(figures.get("half_work")),
            float(figures.get("half_layer_s", 0.0)),
            _optional_float(figures.get("quantized_weight_s")),
            _optional_float(figures.get("quantized_work")),
        )
    if device == "cpu":
        return cpu_default()
    return DEFAULT_THROUGHPUT.get(device, cpu_default())


def cpu_default() -> Throughput:
    """A CPU no profile describes: the figures measured on the `cpu` profile's machine, said as unmeasured
    here."""
    measured = throughput_for(load_hardware("cpu").throughput, "cpu", "cpu")
    return replace(measured, measured=False, source=f"unmeasured: this CPU has the cpu profile's, {measured.source}")


def _optional_float(value) -> float | None:
    return None if value is None else float(value)


def flops_per_token(dims: ModelDims, knobs: Knobs, stage: str, length: float | None = None) -> float:
    """Forward 2N per token plus attention, backward about as much again (frozen weights need no weight
    gradient; LoRA's are tiny), one more forward with checkpointing, DPO's reference forward; eager
    attention does its matrix work twice over (scores kept, softmax materialised). Lean attention
    counts as SDPA: it recomputes the scores in its backward but skips the causal half
    (bench/lean_attention.py: as fast as the CPU's fused SDPA). Attention grows with the sequence's
    `length` (cutoff_len unless the data's lengths are known). Float32 work: work_factor scales it."""
    attention_work = 1.0 if knobs.lean_attention else {"eager": 2.0, "sdpa": 1.0, "fa2": 0.9}[knobs.attention]
    length = knobs.cutoff_len if length is None else length
    layer_flops = 2 * dims.layer_params() + 4 * length * dims.hidden * attention_work
    layers = dims.layers * layer_flops
    head = 2 * dims.vocab * dims.hidden
    per_token = 2 * (layers + head) + (layers if knobs.checkpointing else 0)
    if knobs.quantize_embeddings:  # a packed output layer's gradient pass computes each chunk's logits again
        per_token += head
    if stage_of(stage).reference_model:
        per_token += layers + head  # reference forward under no_grad
    return per_token


def work_factor(dims: ModelDims, knobs: Knobs, device: str, speed: Throughput, half_is_fast: bool = True) -> float:
    """The device's cost of the setting's work against float32's: 16-bit activations (autocast, or a 16-bit
    checkpoint computed in its own dtype) at the measured `half_work`, or by the device's rule (half the
    bytes moved where the GPU has fast 16-bit, assumed 1.25x where M1/M2 emulate bf16, the same on a
    CPU); a quantized base's own measured figure under 16-bit activations, what it was measured with
    (`quantized_work`: on a CPU its matmuls run at neither 16-bit's rate nor float32's), else its
    dequantizing where it was never timed (ASSUMED_QUANTIZED_WORK; where it was, fixed_cost_s counts
    it); ZeRO-3's gathering of the weights per layer (assumed 1.25x)."""
    factor = 1.0
    half = activation_width(dims, knobs) == 2
    if half:
        rule = 1.0 if device == "cpu" else 0.5 if half_is_fast else 1.25
        factor = rule if speed.half_work is None else speed.half_work
    if knobs.quantization_bit and half and speed.quantized_work is not None:
        factor = speed.quantized_work
    elif knobs.quantization_bit and speed.quantized_weight_s is None:
        factor *= ASSUMED_QUANTIZED_WORK
    return factor * (1.25 if knobs.zero_stage >= 3 else 1.0)


def duration_unmeasured(knobs: Knobs, speed: Throughput, device: str) -> str:
    """Why no duration can be backed for this setting on this device ('' where it can)."""
    if knobs.quantization_bit and speed.quantized_weight_s is None:
        return f"{knobs.quantization_bit}-bit steps have no measured figure on {device}"
    return ""


def row_tokens(knobs: Knobs, lengths: DataLengths | None) -> tuple[float, float]:
    """(the tokens of an average row, the length an average micro-batch pads each sequence to) under
    cutoff_len: the data's own lengths, or every sequence at cutoff_len where they are unknown."""
    if lengths is None:
        return knobs.cutoff_len, knobs.cutoff_len
    return lengths.mean(knobs.cutoff_len), lengths.batch_mean(knobs.cutoff_len, knobs.batch)


def tokens_per_second(dims: ModelDims, knobs: Knobs, stage: str, device: str, speed: Throughput,
                      half_is_fast: bool = True, lengths: DataLengths | None = None) -> float:  # fmt: skip
    """The rows' own tokens trained per second: a micro-step computes every sequence at the length its
    batch pads to (every one at cutoff_len where the data's lengths are unknown: an upper bound)."""
    row, padded = row_tokens(knobs, lengths)
    sequences = sequences_per_step(stage, knobs.batch)
    work = flops_per_token(dims, knobs, stage, padded) * work_factor(dims, knobs, device, speed, half_is_fast)
    work_s = sequences * padded * work / speed.flops_per_s
    return sequences * row / (fixed_cost_s(speed, stage, dims, knobs) + work_s)


def fixed_cost_s(speed: Throughput, stage: str, dims: ModelDims, knobs: Knobs) -> float:
    """A micro-step's cost that does not grow with its tokens: the profile's figure (measured on the
    tiny model, whose steps are almost all fixed cost: bench/duration.py, bench/demo_duration.py) and,
    for a 16-bit checkpoint without autocast, its per-layer figure (bench/real.py), twice over for a
    stage with a reference model (its own forward pass and the pairs' bookkeeping); and a quantized
    base's weights dequantized in each pass (quantized_weight_s), and a packed output layer's."""
    reference = stage_of(stage).reference_model
    layers = dims.layers * speed.half_layer_s if native_half(dims, knobs) else 0.0
    fixed = (speed.step_overhead_s + layers) * (2 if reference else 1)
    if knobs.quantization_bit and speed.quantized_weight_s is not None:
        passes = 2 + int(knobs.checkpointing) + int(reference)
        fixed += dims.layers * dims.layer_linear_weights() * speed.quantized_weight_s * passes
        if knobs.quantize_embeddings:  # the packed output layer, dequantized twice in training, once more for DPO
            fixed += dims.vocab * dims.hidden * speed.quantized_weight_s * (2 + int(reference))
    return fixed


def optimizer_steps(args: dict, examples: int | None, world_size: int = 1) -> int | None:
    """The steps the trainer will run: max_steps when set, else epochs x ceil(batches / accumulation),
    as transformers' Trainer counts them. None when the dataset's size is unknown."""
    if int(args.get("max_steps") or -1) > 0:
        return int(args["max_steps"])
    if not examples:
        return None
    batch = micro_batch(args)
    accumulation = int(args.get("gradient_accumulation_steps", 1))
    batches = math.ceil(examples / (batch * world_size))
    per_epoch = max(math.ceil(batches / accumulation), 1)
    return math.ceil(float(args.get("num_train_epochs", 3.0)) * per_epoch)


def train_examples(args: dict, rows: int) -> int:
    """What val_size leaves for training of `rows` examples, as `datasets`' train_test_split counts."""
    val = float(args.get("val_size") or 0)
    held_out = math.ceil(rows * val) if val < 1 else int(val)
    return max(rows - held_out, 0)


@dataclass(frozen=True)
class RunDuration:
    """A run's predicted length: one optimizer step, and how many the trainer will run."""

    step_s: float
    steps: int | None  # None: the dataset's size is unknown (not a local JSON file) and max_steps unset
    examples: int | None
    epochs: float | None  # None when max_steps sets the steps
    throughput: Throughput
    unmeasured: str = ""  # why the step's time cannot be backed (duration_unmeasured); '' where it can

    @property
    def total_s(self) -> float | None:
        return None if self.steps is None or self.unmeasured else self.step_s * self.steps

    def as_dict(self) -> dict:
        return {
            "predicted_step_s": None if self.unmeasured else round(self.step_s, 4),
            "predicted_s": None if self.total_s is None else round(self.total_s, 2),
            "steps": self.steps,
            "examples": self.examples,
            "epochs": self.epochs,
            "source": self.throughput.source,
            "measured_figures": self.throughput.measured,
            "unmeasured": self.unmeasured,
        }


def run_duration(args: dict, knobs: Knobs, tokens_per_s: float, stage: str, effective: int, world_size: int,
                 throughput: Throughput, lengths: DataLengths | None = None, device: str = "cpu"
                 ) -> RunDuration:  # fmt: skip
    """The chosen setting's optimizer step (accumulation x micro-steps at the planner's speed) and
    the steps the trainer runs over the run's datasets; no step time where the device never measured
    the setting's kind of step (duration_unmeasured)."""
    accumulation = max(effective // knobs.batch, 1)
    step_s = accumulation * sequences_per_step(stage, knobs.batch) * row_tokens(knobs, lengths)[0] / tokens_per_s
    rows = training_rows(args)
    examples = train_examples(args, rows) if rows else None
    batches = {**args, "per_device_train_batch_size": knobs.batch, "gradient_accumulation_steps": accumulation}
    epochs = None if int(args.get("max_steps") or -1) > 0 else float(args.get("num_train_epochs", 3.0))
    return RunDuration(step_s, optimizer_steps(batches, examples, world_size), examples, epochs, throughput,
                       duration_unmeasured(knobs, throughput, device))  # fmt: skip


def steady_step_s(step_seconds: list[float]) -> float:
    """A step once warmed up: the median of the steps after the first (which also compiles, allocates
    and fills caches), or the first where it is the only one."""
    return statistics.median(step_seconds[1:] or step_seconds)


def extrapolate(step_seconds: list[float], steps: int) -> float:
    """A whole run from timed steps: the first (warm-up) as it was, the steady step for each after it."""
    if steps <= len(step_seconds):
        return sum(step_seconds[:steps])
    return step_seconds[0] + (steps - 1) * steady_step_s(step_seconds)


def format_seconds(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.2f} s" if seconds < 1 else f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours < 48 else f"{seconds / 86400:.1f} days"


@dataclass(frozen=True)
class Probe:
    """What `mpskit plan --probe` measured (trials/probe.py): real steps of the planned setting here."""

    step_seconds: list[float]  # every optimizer step, the warm-up step first
    startup_s: float  # process start to first step, and the end of the run

    @property
    def step_s(self) -> float:
        return steady_step_s(self.step_seconds)

    def as_dict(self) -> dict:
        return {
            "step_seconds": self.step_seconds,
            "step_s": round(self.step_s, 4),
            "startup_s": round(self.startup_s, 1),
        }
