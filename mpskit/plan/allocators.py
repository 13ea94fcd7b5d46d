"""What an allocator adds to the tensors memory.py counts: one frozen profile per allocator.

memory.py counts bytes of tensors, the same on any device. A profile says what those bytes cost in
one allocator: factors over the tensors' bytes, the heap it keeps, its fixed cost a run. machine/
picks the profile's name (machine/allocator.py) from the device and the C library; the runtime trims
read the same switch, so a plan counts trimmed figures exactly where the run trims.

- `exact`: CUDA's caching allocator. Its counters are the tensors' bytes.
- `glibc_heap`: the CPU on glibc (Linux). Every fitted factor and heap term below was measured here.
- `unmeasured`: MPS and the macOS CPU. Nothing was measured there: the per-tensor factors are
  glibc's untrimmed ones, borrowed, with no heap terms, and `mpskit plan` says so.

An MPS measurement later becomes a profile of its own here, not edits in memory.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpskit.machine.allocator import EXACT, GLIBC_HEAP, UNMEASURED

GB = 1024**3

# Calibrated on bench/memory_accuracy.py's 51 cases (CPU, float32, glibc malloc), minimising the
# median plus the maximum relative error. Saved activations cost 1.51x their tensor bytes (many
# MB-sized tensors held at once: allocator rounding and fragmentation, small tensors the count leaves
# out); weights and the other per-parameter parts 1.11x. The vocabulary-sized buffers came out at
# 1.02x, i.e. exact. On CUDA the same factors cover autocast's cast copies of a float32 checkpoint's
# weights (bench/cuda_checks.sh).
ACTIVATION_FACTOR = 1.51
WEIGHT_FACTOR = 1.11
# A fixed cost per run beyond the tensors (tokenizer, dataset, trainer). It was 0.06 GB while the CPU's
# measure counted the shared-library pages a run faults in (run/monitor.py); without them the CPU's was
# refitted on the quick cases and the out-of-memory rung's tiny run: 0.031 GB. A GPU's measure (its
# allocator's counters) did not change, and the quick cases on an H100 fit the old figure.
GLIBC_RUN_OVERHEAD_BYTES = int(0.031 * GB)
GPU_RUN_OVERHEAD_BYTES = int(0.06 * GB)
# With checkpointing, the first backward's recomputed layers leave their freed buffers in glibc's heap
# layer after layer (RSS grows through that backward; later steps reuse only part of it), except
# buffers of MMAP_CEILING_BYTES and more, which glibc maps and unmaps on their own. About half of one
# layer's tensors below that size, times the layers, stays under the whole next step. Without
# checkpointing the freed activations of one step and the forward's temporaries leave the same kind of
# holes, about a fifth of a layer's worth per layer (glibc's counters sampled through a step).
HEAP_KEPT_FRACTION = {True: 0.52, False: 0.22}  # by gradient checkpointing
MMAP_CEILING_BYTES = 32 * 1024**2
# A quantized run on glibc trims the heap before each decoder layer (engine/quantized.py): what stays
# is a quarter of the above with checkpointing (the recomputed layers' backward between two trims),
# nothing more without, and the saved activations cost less above their bytes. Calibrated on
# bench/memory_accuracy.py --quantized (its first 11 cases; 3 more held out).
TRIMMED_HEAP_KEPT_FRACTION = {True: 0.13, False: 0.0}
TRIMMED_ACTIVATION_FACTOR = 1.15
# A 16-bit checkpoint trained without autocast (its own dtype) allocates otherwise: 16-bit activations
# beside float32 LoRA inputs. Its factors, by (trimmed, gradient checkpointing), were fitted on
# bench/real.py's cases marked `fit` (SmolLM2-135M, bf16, the CPU); the others are held out.
NATIVE_HALF_ACTIVATION_FACTOR = {False: 1.25, True: 1.1}  # by trimmed
NATIVE_HALF_HEAP_KEPT_FRACTION = {True: 0.85, False: 0.0}  # by gradient checkpointing, untrimmed
# Trimmed and checkpointed, the heap keeps at the step's peak what one layer's recomputed forward and
# backward freed since the trim before that layer, so it does not grow with the layers: multiples of
# the layer's buffers and of its linear weights dequantized (in float32 here; those over the mmap
# ceiling go back to the system). Fitted on SmolLM2's checkpointed 4-bit DPO (bench/real.py) and
# bench/qlora.py's 268M shape at batch 1 and 4; its batch 2 held out: +2.6%; the 85M shape held out:
# +8.7%. Without checkpointing a trim comes between every two layers' buffers, and nothing is kept.
TRIMMED_NATIVE_HALF_HEAP = {"layer buffers": 4.0, "dequantized weights": 0.6}
# A 16-bit checkpoint under autocast on the CPU keeps its weights as stored: they are the file's mapped
# pages and cost their bytes. The heap keeps its own share of a layer's 16-bit buffers, fitted on
# bench/qlora.py's two shapes (SFT at cutoff 256): checkpointed at batch 1 and 4 (within 6%), not
# checkpointed at batch 1 (4%). Batch 2, the bench's own, held out: within 6% and 2%.
AUTOCAST_HALF_HEAP_KEPT_FRACTION = {True: 0.22, False: 0.36}  # by gradient checkpointing
# A held-out layer's forward of a 16-bit checkpoint computed as stored holds more than the count on
# glibc: its LoRA and quantized layers compute in float32, and the heap keeps what they free through the
# pass. In multiples of the layer's buffers under the ceiling; fitted on bench/real.py's two cases whose
# held-out peak is a layer's forward, not held out. Under autocast no such copies are made.
EVAL_LAYER_HEAP = 2.6
# A held-out pass of a 16-bit checkpoint computed as stored starts from the tensors as they are (its
# weights are the file's mapped pages) and what the run holds beside them. Measured at the start of
# bench/real.py's evaluations (27 on 9 cases, after the heap was handed back): RSS above the live
# tensors 0.065-0.104 GB, median 0.081.
EVAL_OVERHEAD_BYTES = int(0.08 * GB)
# Loading a quantized base on the CPU (engine/quantized.py reads each tensor with a file read and trims
# the heap between tensors): the transients of quantizing one weight, counted as float32 copies of the
# largest linear weight, by bits. Calibrated to the highest of bench/memory_accuracy.py --quantized's 14
# cases and bench/qlora.py's bf16 shards, so the others come out over (up to 10%). On CUDA bitsandbytes
# quantizes each weight on the GPU as it arrives: the GPU's loading peak is the memory after loading
# (bench/cuda_checks.sh, 14 cases on an H200, within 0.01 GB).
LOADING_COPIES = {4: 6, 8: 3}


@dataclass(frozen=True)
class Allocation:
    """What about a run decides how its tensors are allocated (memory.py builds it from the knobs)."""

    quantized: bool
    checkpointing: bool
    native_half: bool  # a 16-bit checkpoint trained in its own dtype, without autocast
    autocast_half: bool  # a 16-bit checkpoint, unquantized, under autocast in its own dtype
    stored_as_computed: bool  # the weights are stored in the compute dtype: autocast keeps no cast copies


@dataclass(frozen=True)
class GlibcHeap:
    """What glibc's heap keeps of freed buffers: the terms memory.py adds on the Linux CPU only."""

    mmap_ceiling: int = MMAP_CEILING_BYTES
    eval_layer_heap: float = EVAL_LAYER_HEAP
    eval_overhead: int = EVAL_OVERHEAD_BYTES

    def kept(self, run: Allocation, trimmed: bool, layers: int, layer_buffers: int, dequantized: int) -> int:
        """The freed layer buffers of earlier steps the heap keeps under a step's peak. `layer_buffers`:
        one layer's buffers under the ceiling; `dequantized`: its weights dequantized, under it too."""
        if run.native_half and trimmed:
            if not run.checkpointing:
                return 0
            return int(TRIMMED_NATIVE_HALF_HEAP["layer buffers"] * layer_buffers
                       + TRIMMED_NATIVE_HALF_HEAP["dequantized weights"] * dequantized)  # fmt: skip
        if run.native_half:
            fraction = NATIVE_HALF_HEAP_KEPT_FRACTION[run.checkpointing]
        elif run.autocast_half:
            fraction = AUTOCAST_HALF_HEAP_KEPT_FRACTION[run.checkpointing]
        else:
            fraction = (TRIMMED_HEAP_KEPT_FRACTION if trimmed else HEAP_KEPT_FRACTION)[run.checkpointing]
        return int(fraction * layers * layer_buffers)


@dataclass(frozen=True)
class Allocator:
    """One allocator's costs over the counted tensors."""

    name: str
    measured: bool  # False: its figures are borrowed, and `mpskit plan` says so
    trims: bool  # the run hands the heap's free pages back (glibc): trimmed figures apply
    exact_when_stored_as_computed: bool  # counters of the tensors' own bytes (CUDA)
    mapped_half_weights: bool  # 16-bit weights under autocast stay the file's mapped pages (the CPU)
    counts_autocast_lora_copies: bool  # each LoRA layer's 16-bit input copy is counted (memory.py)
    run_overhead: int
    loading_copies: dict[int, int]  # by bits: float32 copies of the largest weight while quantizing
    heap: GlibcHeap | None = None  # glibc's kept heap; None: no heap terms

    def exact(self, run: Allocation) -> bool:
        return self.exact_when_stored_as_computed and run.stored_as_computed

    def trimmed(self, run: Allocation) -> bool:
        """Whether the run trims the heap between layers: a quantized base on glibc."""
        return self.trims and run.quantized

    def weight_factor(self, run: Allocation) -> float:
        """Weights' and the other per-parameter parts' cost over their tensor bytes."""
        return 1.0 if self.exact(run) else WEIGHT_FACTOR

    def frozen_weight_factor(self, run: Allocation) -> float:
        """The frozen weights' cost over their bytes: 1 where they are the file's mapped pages."""
        return 1.0 if self.mapped_half_weights and run.autocast_half else self.weight_factor(run)

    def activation_factor(self, run: Allocation) -> float:
        """Saved activations' cost over their tensor bytes (rounding, tensors the count leaves out)."""
        if self.exact(run):
            return 1.0
        if run.native_half:
            return NATIVE_HALF_ACTIVATION_FACTOR[self.trimmed(run)]
        return TRIMMED_ACTIVATION_FACTOR if self.trimmed(run) else ACTIVATION_FACTOR


PROFILES = {
    EXACT: Allocator(EXACT, measured=True, trims=False, exact_when_stored_as_computed=True,
                     mapped_half_weights=False, counts_autocast_lora_copies=True,
                     run_overhead=GPU_RUN_OVERHEAD_BYTES, loading_copies={4: 0, 8: 0}),
    GLIBC_HEAP: Allocator(GLIBC_HEAP, measured=True, trims=True, exact_when_stored_as_computed=False,
                          mapped_half_weights=True, counts_autocast_lora_copies=True,
                          run_overhead=GLIBC_RUN_OVERHEAD_BYTES, loading_copies=LOADING_COPIES, heap=GlibcHeap()),
    # borrowed: glibc's untrimmed factors and loading copies, a GPU's fixed cost (the larger), no heap terms
    UNMEASURED: Allocator(UNMEASURED, measured=False, trims=False, exact_when_stored_as_computed=False,
                          mapped_half_weights=False, counts_autocast_lora_copies=False,
                          run_overhead=GPU_RUN_OVERHEAD_BYTES, loading_copies=LOADING_COPIES),
}  # fmt: skip


def usual_allocator(device: str) -> Allocator:
    """The profile of `device` on the machines mpskit meets most: Linux for the CPU."""
    return PROFILES[{"cuda": EXACT, "cpu": GLIBC_HEAP}.get(device, UNMEASURED)]
