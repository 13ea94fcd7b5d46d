"""Every place mpskit bends a library it runs on, listed once with the versions it was checked on,
and installed from here.

A bend replaces one name in a library's module so that the library's own code path runs mpskit's
piece: LLaMA-Factory's workflows build mpskit's trainers, transformers' loader reads a 4-bit base
tensor by tensor, and so on. Each is narrow, and each breaks silently when a new version renames or
reshapes what it replaces, so `check` compares the installed versions with the ones a bend was
checked on, and `training_bends` warns of any difference in the bends it installs before a run
trains. (Two more changes use the libraries' public hooks, not a replaced name: lean attention sets
an attention function on the model itself, and quantized.trim_between_layers registers a global
forward hook.)

Imports torch and the libraries only inside the functions that install.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from mpskit.errors import warn

if TYPE_CHECKING:
    from mpskit.engine.lean_attention import LeanAttention
    from mpskit.engine.lean_trainers import LeanPath
    from mpskit.settings.foodpo import FooDPOConfig
    from mpskit.settings.run_spec import RunSpec


@dataclass(frozen=True)
class Bend:
    targets: tuple[str, ...]  # "module:name", each replaced
    package: str  # the distribution the targets belong to
    checked: str  # the versions of it the bend was checked on (a PEP 440 specifier)
    why: str


LOG = Bend(("llamafactory.train.tuner:LogCallback",), "llamafactory", "==0.9.5",
           "the trainer log keeps every metric logged, DPO's rewards and fooDPO's beta too (trainer_log.py)")
RESUMABLE = Bend(("llamafactory.train.pt.workflow:CustomTrainer", "llamafactory.train.rm.workflow:PairwiseTrainer",
                  "llamafactory.train.kto.workflow:CustomKTOTrainer"), "llamafactory", "==0.9.5",
                 "the pt, rm and kto trainers save whole checkpoints and resume exactly (resumable.py)")
LEAN = Bend(("llamafactory.train.sft.workflow:CustomSeq2SeqTrainer", "llamafactory.train.dpo.trainer:CustomDPOTrainer"),
            "llamafactory", "==0.9.5",
            "the SFT and DPO workflows build mpskit's lean trainers, fooDPO's for stage: foodpo (lean_trainers.py)")
READ_ON_DEMAND = Bend(("transformers.modeling_utils:safe_open",), "transformers", "==5.6.0",
                      "a base quantized as it loads is read tensor by tensor, never memory-mapped (quantized.py)")
TRAINING_LAYOUT = Bend(("bitsandbytes.nn.modules:has_avx512bf16",), "bitsandbytes", "==0.50.2",
                       "4-bit layers keep their training layout through a held-out evaluation (quantized.py)")
VOCAB_LOADER = Bend(("transformers.core_model_loading:set_param_for_module",), "transformers", "==5.6.0",
                    "quantize_embeddings packs the embeddings and the output layer as they load (quantized_vocab.py)")
NO_ACCELERATOR = Bend(("torch.backends.mps:is_available", "torch.backends.mps:is_built"), "torch", ">=2.11,<2.15",
                      "a run on the CPU sees no MPS device, so nothing lands on it (hide_accelerators)")
SILENT = Bend(("transformers.trainer:DEFAULT_PROGRESS_CALLBACK", "transformers.trainer:PrinterCallback"),
              "transformers", "==5.6.0",
              "the trainer prints no progress bar or log lines where mpskit prints its own (run/quiet.py)")
AS_TRAINED = Bend(("llamafactory.model.adapter:PeftModel",
                   "llamafactory.train.sft.workflow:SFTDataCollatorWith4DAttentionMask"), "llamafactory", "==0.9.5",
                  "mpskit eval computes as the run's own evaluation did: the adapter beside its base, never merged "
                  "into it; SFT batches padded to a multiple of 8")
CPU_GATHERS = Bend(("deepspeed.comm.comm:all_gather_into_tensor", "deepspeed.comm.comm:all_gather",
                    "deepspeed.comm:all_gather_into_tensor", "deepspeed.comm:all_gather"), "deepspeed", "==0.18.4",
                   "on the CPU, ZeRO-3 reads no weight before its gather wrote it (cpu_gathers.py)")
BENDS = (LOG, RESUMABLE, LEAN, READ_ON_DEMAND, TRAINING_LAYOUT, VOCAB_LOADER, NO_ACCELERATOR, SILENT,
         AS_TRAINED, CPU_GATHERS)  # fmt: skip


def check(bends: tuple[Bend, ...] = BENDS) -> list[str]:
    """One line for each bend whose library is installed at a version it was not checked on."""
    problems = []
    for bend in bends:
        try:
            installed = Version(importlib.metadata.version(bend.package))
        except (importlib.metadata.PackageNotFoundError, InvalidVersion):
            continue  # not installed (bitsandbytes on an Intel Mac): the bend is never installed either
        if installed not in SpecifierSet(bend.checked):
            problems.append(f"mpskit replaces {', '.join(bend.targets)}, checked on {bend.package}{bend.checked}; "
                            f"this is {installed}: if the run fails there, install the tested versions (make install)")
    return problems


def current(target: str) -> object:
    """What TARGET ("module:name") is now."""
    module_name, name = target.split(":")
    return getattr(importlib.import_module(module_name), name)


@contextlib.contextmanager
def replaced(target: str, value: object) -> Iterator[None]:
    """Within: TARGET ("module:name") is VALUE; what it was comes back after."""
    module_name, name = target.split(":")
    module = importlib.import_module(module_name)
    before = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, before)


def trainers(lean: LeanPath, attention: LeanAttention, foodpo: FooDPOConfig | None) -> tuple:
    """What LLaMA-Factory's SFT and DPO workflows build in a run (LEAN): the lean trainers, and for
    stage: foodpo the fooDPO trainer."""
    from mpskit.engine import lean_trainers

    lean_trainers.check_seam()
    sft = functools.partial(lean_trainers.LeanSFTTrainer, lean=lean, attention=attention)
    if foodpo is None:
        return sft, functools.partial(lean_trainers.LeanDPOTrainer, lean=lean, attention=attention)
    from mpskit.engine.foodpo_trainer import FooDPOTrainer

    return sft, functools.partial(FooDPOTrainer, lean=lean, attention=attention, foodpo=foodpo)


@contextlib.contextmanager
def training_bends(spec: RunSpec) -> Iterator[tuple]:
    """Within: every bend a training run of SPEC needs (the 4-bit ones for a quantized base). Gives
    the run's lean paths (lean_trainers.LeanPath, lean_attention.LeanAttention), whose reports say
    which path ran, and the report of the engine that ran (engine_ran.py)."""
    from mpskit.engine import cpu_gathers, engine_ran, lean_trainers, quantized, resumable
    from mpskit.engine.lean_attention import LeanAttention
    from mpskit.engine.trainer_log import FullLogCallback
    from mpskit.stages import stage_of

    quantized_base = spec.args.get("quantization_bit") is not None
    packed = (VOCAB_LOADER,) if spec.packs_vocabulary else ()
    quantized_bends = (READ_ON_DEMAND, TRAINING_LAYOUT, *packed) if quantized_base else ()
    # DeepSpeed on the CPU accelerator (machine/launch.py sets it for a run's ranks on the CPU)
    cpu_deepspeed = (CPU_GATHERS,) if spec.args.get("deepspeed") and os.environ.get("DS_ACCELERATOR") == "cpu" else ()
    for problem in check((LOG, RESUMABLE, LEAN, *quantized_bends, *cpu_deepspeed)):
        warn(problem)
    lean_stage = stage_of(spec.args.get("stage")).lean
    lean = lean_trainers.LeanPath(bool(spec.lean.lean_logits) and lean_stage)
    # auto (None) lean attention runs only where the planner turned it on
    attention = LeanAttention(bool(spec.lean.lean_attention) and lean_stage)
    with contextlib.ExitStack() as stack:
        engine = stack.enter_context(engine_ran.watched())
        stack.enter_context(replaced(LOG.targets[0], FullLogCallback))
        for target in RESUMABLE.targets:
            stack.enter_context(replaced(target, resumable.resumable(current(target))))
        for target, trainer in zip(LEAN.targets, trainers(lean, attention, spec.foodpo), strict=True):
            stack.enter_context(replaced(target, trainer))
        if quantized_base:
            quantized.import_bitsandbytes()
            stack.enter_context(replaced(READ_ON_DEMAND.targets[0], quantized.SafeFileOnDemand))
            stack.enter_context(replaced(TRAINING_LAYOUT.targets[0], lambda: False))
            stack.enter_context(quantized.trim_between_layers())
        stack.enter_context(packed_vocabulary(spec))
        for target in (CPU_GATHERS.targets if cpu_deepspeed else ()):
            stack.enter_context(replaced(target, cpu_gathers.to_the_end(current(target))))
        yield lean, attention, engine


@contextlib.contextmanager
def packed_vocabulary(spec: RunSpec) -> Iterator[None]:
    """Within, where SPEC packs its vocabulary: models load with their embeddings and output layer
    packed in its quantization_bit (quantize_embeddings), for training, chat and eval alike."""
    if not spec.packs_vocabulary:
        yield
        return
    from mpskit.engine.quantized_vocab import packing_loader

    target = VOCAB_LOADER.targets[0]
    bits, quant_type = int(spec.args["quantization_bit"]), str(spec.args.get("quantization_type", "nf4"))
    loader = packing_loader(current(target), bits, quant_type)
    with replaced(target, loader):
        yield


@contextlib.contextmanager
def evaluated_as_trained() -> Iterator[None]:
    """Within: an evaluation-only run computes what the run's own held-out evaluation computed.
    LLaMA-Factory loads a model for it with the LoRA adapter merged into the base's weights, which
    rounds the adapter's change to bf16 where the base is stored so (a DPO margin 8% off the run's
    own): the adapter stays a PeftModel here, in its float32. And its SFT workflow pads batches to a
    multiple of 8 only when training, which moves a bf16 model's loss by 1e-3: here it pads as then."""
    from peft import PeftModel

    class Unmerged:
        @staticmethod
        def from_pretrained(model, adapter, **kwargs):
            loaded = PeftModel.from_pretrained(model, adapter, **kwargs)
            loaded.merge_and_unload = lambda *args, **kwargs: loaded
            return loaded

    padded_in_training = current(AS_TRAINED.targets[1])

    class PaddedAsInTraining(padded_in_training):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "pad_to_multiple_of": 8})

    for problem in check((AS_TRAINED,)):
        warn(problem)
    with replaced(AS_TRAINED.targets[0], Unmerged), replaced(AS_TRAINED.targets[1], PaddedAsInTraining):
        yield


@contextlib.contextmanager
def silent_trainer() -> Iterator[None]:
    """Within: the trainer's progress bar and printed log lines are a callback that does nothing."""
    from transformers import TrainerCallback

    with contextlib.ExitStack() as stack:
        for target in SILENT.targets:
            stack.enter_context(replaced(target, TrainerCallback))
        yield


def hide_accelerators() -> None:
    """Make torch, transformers, accelerate and LLaMA-Factory see no MPS or CUDA device, for the rest
    of this process.

    They all ask `torch.backends.mps.is_available()` / `is_built()` at call time, so replacing those
    two functions before transformers or llamafactory are imported keeps the model, the batches and
    the optimizer state on the CPU. CUDA is hidden the usual way, before torch initialises it.
    """
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    torch.backends.mps.is_available = _no_device
    torch.backends.mps.is_built = _no_device


@functools.lru_cache
def _no_device() -> bool:
    """Stands in for torch's own lru_cache'd checks (torch._dynamo reads their __wrapped__)."""
    return False
