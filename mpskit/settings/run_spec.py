"""What one training attempt runs: LLaMA-Factory's arguments and mpskit's own settings, one frozen value.

mpskit's own keys arrive mixed with LLaMA-Factory's (a run file, words, the planner's knobs).
`RunSpec.of` splits them, checked: the lean paths' switches (knobs.OwnKnobs) and, for
`stage: foodpo`, fooDPO's beta settings (foodpo.FooDPOConfig), each with its one default. From there
two translations: `engine_args` is what LLaMA-Factory's `run_exp` receives, `yaml_args` and
`record_args` are what the run folder keeps (llamafactory.yaml and the record's mpskit_args), from
which every attempt, a resumed one too, rebuilds the same value (RunDir.train_args, then `of`).
No torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType

from mpskit.settings.foodpo import FooDPOConfig, split_foodpo_args
from mpskit.settings.knobs import OwnKnobs, own_settings, split_own


@dataclass(frozen=True)
class RunSpec:
    args: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))  # llamafactory.yaml's keys
    lean: OwnKnobs = OwnKnobs()
    foodpo: FooDPOConfig | None = None  # stage foodpo only

    @classmethod
    def of(cls, args: dict) -> RunSpec:
        """The spec a mixed set of arguments asks for; fooDPO's settings checked (one line if bad)."""
        lf_args, own = split_own(args)
        foodpo = split_foodpo_args(lf_args)[1] if lf_args.get("stage") == "foodpo" else None
        return cls(MappingProxyType(lf_args), own_settings(own), foodpo)

    @property
    def packs_vocabulary(self) -> bool:
        """Whether the base loads with its embeddings and output layer packed too (quantize_embeddings on a
        quantized base): training, chat and eval alike."""
        return bool(self.lean.quantize_embeddings) and self.args.get("quantization_bit") is not None

    def yaml_args(self) -> dict:
        """llamafactory.yaml's arguments: LLaMA-Factory's keys, and for fooDPO its stage and keys (so
        plain llamafactory-cli refuses the file rather than run DPO)."""
        return dict(self.args)

    def record_args(self) -> dict:
        """The record's mpskit_args: every own knob, defaults included."""
        return dataclasses.asdict(self.lean)

    def engine_args(self) -> dict:
        """What `run_exp` receives: fooDPO runs LLaMA-Factory's DPO workflow (its trainer swapped in)."""
        return split_foodpo_args(self.args)[0] if self.foodpo is not None else dict(self.args)
