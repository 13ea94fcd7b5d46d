"""YAML layers -> one resolved run: the exact LLaMA-Factory arguments plus what mpskit decided.

Layers, later wins: stage preset < model preset < device rules < hardware profile's pinned args <
the user's run file and key=value words. A stage preset is a layer only where it is asked for:
`preset: NAME` (in a run file or as a word), or, with no run file, `model_preset=NAME` beside
`stage=NAME` (mpskit's own command line). A LLaMA-Factory run file, or words that name a stage alone,
mean what they say under llamafactory-cli: mpskit adds device rules and the planner's choices, and the
recipe names every key it wrote beside them (changes.py). No torch import here.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mpskit.datasets.plain_data import named_data, register_plain_data
from mpskit.errors import MpskitError, check_number, warn
from mpskit.machine.hardware import Hardware, bf16_is_fast, bf16_supported, fp16_supported, select_hardware
from mpskit.machine.launch import process_layout
from mpskit.presets import demo_data_dir, load_yaml, merge, resolve_preset_file
from mpskit.settings import quantization, seed_fork
from mpskit.settings.knobs import PLANNER_KEYS, deepspeed_file, whole_logits_when_sharded
from mpskit.settings.removed_keys import translate_removed_keys
from mpskit.settings.run_settings import RunSettings, read_run_settings
from mpskit.settings.validate import check_args
from mpskit.stages import STAGES

# mpskit's own keys: they choose presets, devices and the planner's limits, and never reach LLaMA-Factory.
MPSKIT_KEYS = ("preset", "model_preset", "hardware", "device", "run_name", "memory_budget_gb", "min_cutoff_len",
               "keep_awake", "oom_ladder", "zero")  # fmt: skip
DEVICES = ("auto", "mps", "cuda", "cpu")
DO_KEYS = ("do_train", "do_eval", "do_predict")
# files without a stage that are not run files: (keys that tell them, what they are, what runs them)
OTHER_FILES = (
    (("compute_environment", "distributed_type"), "an accelerate launch config",
     "give it to accelerate launch --config_file FILE beside a LLaMA-Factory run file"),
    (("export_dir",), "for exporting a model (export_dir)",
     "run it with llamafactory-cli export FILE, or mpskit export RUN_DIR -o DIR for a run mpskit trained"),
    (("infer_backend",), "for chatting with a model (infer_backend)",
     "run it with llamafactory-cli chat FILE, or mpskit chat RUN_DIR for a run mpskit trained"),
    (("model", "model_class", "train_dataset", "dist_config", "peft_config"), "in LLaMA-Factory's v1 format",
     "run it with USE_V1=1 llamafactory-cli train FILE; mpskit trains LLaMA-Factory's run files (stage, ...)"),
)  # fmt: skip
PARTNER_KEYS = (("warmup_ratio", "warmup_steps"), ("val_size", "eval_dataset"))
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class ResolvedRun:
    """One run as merged from its layers, paths made absolute; never changed afterwards (the
    planner makes a new one with its choice, see advice.planned)."""

    stage: str
    run_name: str
    hardware: Hardware
    device: str
    args: dict  # exactly what LLaMA-Factory reads
    model_dims: dict = field(default_factory=dict)
    layers: list[str] = field(default_factory=list)
    pinned: set[str] = field(default_factory=set)  # PLANNER_KEYS the user or the hardware profile set
    processes: tuple[int, int] = (1, 1)  # (per node, nodes): more than one launches through torchrun
    settings: RunSettings = RunSettings()  # mpskit's own: budget, cutoff floor, ladder, keeping awake
    preset: str | None = None  # the stage preset merged in; None: the user's settings are the run's
    given: dict = field(default_factory=dict)  # the user's LLaMA-Factory keys, as given
    datasets: dict = field(default_factory=dict)  # plain data files' dataset_info.json entries (plain_data.py)
    data_files: dict = field(default_factory=dict)  # the rows converted for them: file name -> JSON Lines
    auto: tuple[str, ...] = ()  # the planner knobs the user left to the planner by `KEY: auto`

    @property
    def world_size(self) -> int:
        return self.processes[0] * self.processes[1]

    @property
    def hide_mps(self) -> bool:
        """A CPU run hides MPS (and CUDA) from torch so nothing lands there (seed 000)."""
        return self.device == "cpu"


def _preset(kind: str, name: str, seen: tuple[str, ...] = ()) -> tuple[dict, dict, list[str]]:
    """(its args over those of the preset it `extends:`, its own data, the files in merge order)."""
    path = resolve_preset_file(kind, name)
    data = load_yaml(path)
    args = data.get("args") or {}
    if not isinstance(args, dict):
        raise MpskitError(f"{path}: 'args' is not a mapping", "write args: as key: value lines")
    base = data.get("extends")
    if base is None:
        return args, data, [str(path)]
    if str(base) in (*seen, name):
        raise MpskitError(f"{path}: 'extends: {base}' leads back to itself", "extend a preset that does not")
    base_args, _, files = _preset(kind, str(base), (*seen, name))
    return merge(base_args, args), data, [*files, str(path)]


DDP_TIMEOUT_S = 180_000_000  # LLaMA-Factory's examples' ddp_timeout: a large dataset's tokenizing never times out


def device_args(hw: Hardware, device: str) -> dict:
    """What the device needs: loader settings and a dtype by the device rules (docs/presets-and-settings.md)."""
    if device == "mps":
        fast_bf16 = bf16_is_fast(hw)
        return {"dataloader_num_workers": 0, "dataloader_pin_memory": False, "bf16": fast_bf16, "fp16": False}
    if device == "cuda":
        return {"bf16": hw.cuda_bf16, "fp16": not hw.cuda_bf16}
    return {"use_cpu": True, "bf16": False, "fp16": False, "dataloader_pin_memory": False}


def _choose_device(hw: Hardware, asked: str | None, use_cpu: bool) -> str:
    asked = asked or "auto"
    if asked not in DEVICES:
        raise MpskitError(f"device '{asked}' is not one of {', '.join(DEVICES)}", "use device=auto, mps, cuda or cpu")
    if use_cpu or asked == "cpu":
        return "cpu"
    if asked != "auto" and asked != hw.device:
        raise MpskitError(
            f"device '{asked}' asked for, but hardware '{hw.name}' is {hw.kind}",
            "pick a matching --hardware profile or device=auto",
        )
    return hw.device


def _check_dtype(args: dict, hw: Hardware, device: str) -> None:
    if args.get("fp16") and args.get("bf16"):
        raise MpskitError("both fp16 and bf16 are true", "set at most one of them")
    if args.get("fp16") and device == "cpu":
        warn("fp16 on the CPU: torch autocasts to float16 there, which trains but is slower than float32")
    elif args.get("fp16") and not fp16_supported(hw):
        raise MpskitError(
            f"fp16 training is not supported on {hw.kind} with torch {hw.torch}",
            "set fp16: false (MPS fp16 needs torch >= 2.8)",
        )
    if args.get("bf16") and device != "cpu" and not bf16_supported(hw):
        warn(f"bf16 does not run on {hw.name} (it needs macOS >= 14 and torch >= 2.6, or an Ampere+ GPU); using fp32")
        args["bf16"] = False
    if args.get("pure_bf16") and (device == "cpu" or not bf16_supported(hw)):  # LLaMA-Factory refuses it there
        warn(f"pure_bf16 needs an accelerator with bf16 (this run is on {device} of {hw.name}); using fp32")
        args["pure_bf16"] = False


def _checked_dims(dims, source: str) -> dict:
    """A model preset's `dims:`: a mapping of whole numbers (tied_embeddings: true or false; model_type:
    config.json's name, which says whether the lean paths run)."""
    if not isinstance(dims, dict):
        raise MpskitError(f"{source}: dims {dims!r} is not a mapping", "write dims: with hidden, layers, heads, ...")
    for key, value in dims.items():
        if key == "model_type" and not isinstance(value, str):
            raise MpskitError(f"{source}: dims.model_type {value!r} is not a name", "give config.json's model_type")
        if key not in ("tied_embeddings", "model_type"):
            check_number(f"{source}: dims.{key}", value, "int", 1, fix="give the model's shapes as whole numbers")
    return dims


def cuda_only(args: dict, device: str) -> list[str]:
    """The options in `args` that only run on CUDA, when the device is not CUDA."""
    if device == "cuda":
        return []
    problems = []
    if args.get("deepspeed") and device != "cpu":
        problems.append(f"deepspeed ({args['deepspeed']}) shards training over CUDA GPUs or CPU processes; this run is "
                        f"on {device}")  # fmt: skip
    if args.get("fsdp"):
        problems.append(f"fsdp ({args['fsdp']}) shards over CUDA GPUs; on {device} accelerate would drop it and "
                        "train plain DDP")  # fmt: skip
    if {"tensor_model_parallel_size", "pipeline_model_parallel_size"} & set(args):
        problems.append(f"Megatron-Core parallelism (USE_MCA=1, mcore_adapter) is for CUDA; this run is on {device}")
    if args.get("fp8"):
        problems.append(f"fp8 trains on Ada and Hopper GPUs (torchao or Transformer Engine); this run is on {device}")
    if args.get("enable_liger_kernel"):
        problems.append(f"enable_liger_kernel: Liger's kernels are Triton, for CUDA; this run is on {device}")
    return problems


def _default_run_name(stage: str, model_preset: str | None, model_path: str) -> str:
    model = model_preset or Path(str(model_path).rstrip("/")).name or "model"
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{stage}-{model}").lstrip(".")


def _user_wins(preset_args: dict, user: dict) -> dict:
    """A preset's key that transformers or LLaMA-Factory would read against the user's partner key is
    dropped: warmup_ratio overrides warmup_steps, and val_size cannot stand beside eval_dataset."""
    preset_args = dict(preset_args)
    for pair in PARTNER_KEYS:
        for key, partner in (pair, pair[::-1]):
            if key in user and partner not in user:
                preset_args.pop(partner, None)
    return preset_args


def _own_data(user: dict, stage_args: dict) -> bool:
    return "dataset" in user and user["dataset"] != stage_args.get("dataset")


def _demo_data(args: dict, user: dict, stage_args: dict) -> None:
    """A stage preset's `dataset_dir: data` is mpskit's demo data, wherever mpskit is installed. With a
    dataset of their own and no dataset_dir, users keep LLaMA-Factory's default: data/ where they run."""
    if "dataset_dir" not in user and not _own_data(user, stage_args) and args.get("dataset_dir") == "data":
        args["dataset_dir"] = str(demo_data_dir())


def _evaluation_for_own_data(args: dict, user: dict, stage_args: dict) -> None:
    """A stage preset's eval_dataset belongs to the demo dataset it names. With a dataset of their
    own, users are evaluated on what they give (eval_dataset, val_size), or not at all; `eval_dataset=`
    (unset) with no val_size leaves the preset's evaluation nothing to evaluate on. Either is said."""
    unset = "eval_dataset" in user and not user["eval_dataset"] and args.get("val_size") in (None, 0, 0.0)
    if unset and "eval_strategy" not in user and str(args.get("eval_strategy") or "no") != "no":
        args["eval_strategy"] = "no"
        warn("evaluation off: eval_dataset= leaves nothing to evaluate on (val_size=0.1 would hold rows out)")
    if "eval_dataset" not in args or "eval_dataset" in user or not _own_data(user, stage_args):
        return
    del args["eval_dataset"]
    if "eval_strategy" not in user:
        args["eval_strategy"] = "no"
    warn(
        f"evaluation off: dataset={user['dataset']} came with no eval_dataset or val_size (the preset's "
        f"{stage_args['eval_dataset']} belongs to its demo data)"
    )


RUN_NAME_MAX = 200  # a folder name (NAME_MAX, 255 bytes on macOS and Linux), with room for its suffixes


def _check_run_name(name: str) -> str:
    """A run name is one folder inside output/: no separators, no `..`, not absolute."""
    if not RUN_NAME.fullmatch(name):
        raise MpskitError(
            f"run_name {name!r} would leave output/ or is not a plain folder name",
            "use letters, digits, '.', '_' and '-', starting with a letter or digit",
        )
    if len(name) > RUN_NAME_MAX:
        raise MpskitError(f"run_name is {len(name)} characters long; a folder name takes at most {RUN_NAME_MAX}",
                          "give a shorter run_name")  # fmt: skip
    return name


def other_file(user: dict) -> tuple[str, str] | None:
    """(what the file is, what runs it) for a file made for another command than training."""
    return next(((what, fix) for keys, what, fix in OTHER_FILES if set(keys) & set(user)), None)


COMPATIBLE_STAGES = ({"dpo", "foodpo"},)  # fooDPO trains on the DPO preset's pairs and settings too


def _check_preset_stage(named: str | None, preset: str | None, preset_stage: str | None) -> None:
    """stage= and a stage preset that trains another stage (a run file's `stage: dpo` with `preset: sft`)."""
    if not (named and preset_stage) or named == preset_stage:
        return
    if any({named, preset_stage} <= pair for pair in COMPATIBLE_STAGES):
        return
    raise MpskitError(f"stage={named} and preset={preset} disagree: that preset trains stage {preset_stage}",
                      "give one of them (a preset brings its stage; a stage brings its own preset)")  # fmt: skip


def _check_stage(stage, user: dict) -> str:
    if not stage:
        if other := other_file(user):
            raise MpskitError(f"this file is {other[0]} and names no stage to train", other[1])
        raise MpskitError("no stage given", f"add stage=... (one of {', '.join(STAGES)}) or preset=NAME")
    if stage == "ppo":
        raise MpskitError(
            "stage ppo is not run by mpskit: it needs a trained reward model and generates at every step",
            "train the reward model with stage=rm here, then run PPO with llamafactory-cli train",
        )
    seed_fork.check_stage(str(stage))
    if str(stage) not in STAGES:
        close = difflib.get_close_matches(str(stage), STAGES, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise MpskitError(f"unknown stage '{stage}'", f"{hint}mpskit trains {', '.join(STAGES)}")
    return str(stage)


def _zero_config(stage: object, user: dict) -> str:
    """`zero=2` or `zero=3`: mpskit's DeepSpeed config of that stage, as `deepspeed: FILE` would name it."""
    if str(stage) not in ("2", "3"):
        raise MpskitError(f"zero={stage!r} is not a ZeRO stage mpskit ships", "set zero=2 or zero=3")
    if user.get("deepspeed"):
        raise MpskitError(f"zero={stage} beside deepspeed={user['deepspeed']}: two DeepSpeed configs",
                          "keep one of them")  # fmt: skip
    return deepspeed_file(int(str(stage)))


def _stage_preset(own: dict, user: dict, run_file: bool) -> str | None:
    """The stage preset asked for: `preset`, or with no run file, the stage beside a model_preset."""
    if own.get("preset"):
        return str(own["preset"])
    if not run_file and own.get("model_preset") and user.get("stage"):
        return str(user["stage"])
    return None


def resolve(user: dict, hardware: str | None = None, probe_torch: bool = False, run_file: bool = False) -> ResolvedRun:
    """Merge presets and the user's choices into one run. `user` is the run file plus overrides;
    `run_file`: they came from a LLaMA-Factory run file."""
    user = translate_removed_keys(user)
    own = {key: user.pop(key) for key in MPSKIT_KEYS if key in user and key != "run_name"}
    auto = tuple(key for key, value in user.items() if value == "auto")
    for key in auto:
        if key not in PLANNER_KEYS:
            raise MpskitError(f"'{key}: auto' is not a planner knob", f"auto works for {', '.join(PLANNER_KEYS)}")
        del user[key]
    seed_fork.check_keys(user)
    if "zero" in own:
        user["deepspeed"] = _zero_config(own["zero"], user)
    given = dict(user)
    named = _check_stage(user["stage"], user) if user.get("stage") else None
    preset = _stage_preset(own, user, run_file)
    stage_args, _, layers = _preset("stages", preset) if preset else ({}, {}, [])
    _check_preset_stage(named, preset, stage_args.get("stage"))
    asked = named or stage_args.get("stage")  # none: the training data's (plain files), else refused
    user, datasets, data_files = register_plain_data(user, _check_stage(asked, user) if asked else None)
    stage = _check_stage(user.get("stage") or stage_args.get("stage"), user)
    if not asked and not run_file:  # the stage of the data's rows brings its preset, as stage= would
        preset = stage
        stage_args, _, layers = _preset("stages", preset)
        print(f"mpskit: the {stage} preset sets what you did not ({Path(layers[-1]).name}: learning rate, "
              "steps, logging...)", file=sys.stderr)
    model_args, dims = {}, {}
    if own.get("model_preset"):
        model_args, model_data, model_files = _preset("models", str(own["model_preset"]))
        dims = _checked_dims(model_data.get("dims") or {}, model_files[-1])
        layers += model_files

    hw = select_hardware(hardware or own.get("hardware"), probe_torch=probe_torch)
    layers.append(hw.source)
    device = _choose_device(hw, own.get("device"), bool(user.get("use_cpu")))
    processes = process_layout(hw)
    distributed = {}
    if processes != (1, 1):  # rank 0 tokenizes the data while the others wait: LLaMA-Factory's examples' timeout
        distributed = {"ddp_timeout": DDP_TIMEOUT_S, **({"ddp_backend": "gloo"} if device == "cpu" else {})}
    trains = {} if preset or run_file or any(key in user for key in DO_KEYS) else {"do_train": True}
    presets = _user_wins(merge(stage_args, model_args), user)
    args = merge(presets, trains, device_args(hw, device), distributed, hw.args, user)
    args["stage"] = stage
    if preset:
        _demo_data(args, user, stage_args)
        _evaluation_for_own_data(args, user, stage_args)
    check_args(args)
    whole_logits_when_sharded(args, user)
    _warn_on_training_data_evaluated(given, args)
    quantization.check_settings(args)
    if device == "mps" and args.get("dataloader_num_workers"):
        warn(f"dataloader_num_workers={args['dataloader_num_workers']} on MPS: worker processes fail there; using 0")
        args["dataloader_num_workers"] = 0
    if not args.get("model_name_or_path"):
        raise MpskitError("no model given", "set model_name_or_path=PATH or model_preset=NAME (see configs/models/)")
    _check_dtype(args, hw, device)
    if stage == "foodpo" and "pref_beta_scale" not in args:
        warn("stage foodpo without pref_beta_scale: every pair's beta is pref_beta, which trains exactly DPO; "
             "set pref_beta_scale=0.05 (the foodpo preset's) for a beta scaled by each prompt's perplexity")
    if device == "cpu":  # accelerate starts DeepSpeed only without use_cpu (its ranks see no GPU: launch.py)
        args["use_cpu"] = not args.get("deepspeed")
    named = user.get("run_name")
    run_name = (
        _check_run_name(str(named))
        if named
        else _default_run_name(stage, own.get("model_preset"), args["model_name_or_path"])
    )
    return ResolvedRun(
        stage=stage,
        run_name=run_name,
        hardware=hw,
        device=device,
        args=absolute_paths(args),
        model_dims=dims,
        layers=layers,
        pinned={key for key in PLANNER_KEYS if key in user or key in hw.args},
        processes=processes,
        settings=read_run_settings(own),
        preset=preset,
        given=given,
        datasets=datasets,
        data_files=data_files,
        auto=auto,
    )


def _warn_on_training_data_evaluated(given: dict, args: dict) -> None:
    """The same data (a name or a file, as the user gave it) to train and to evaluate on: the
    held-out figures are not held out."""
    trained = named_data(given.get("dataset", args.get("dataset")))
    same = trained & named_data(given.get("eval_dataset", args.get("eval_dataset")))
    if same:
        warn(f"{', '.join(sorted(same))} is both trained and evaluated on: the eval figures are not held out")


def absolute_paths(args: dict) -> dict:
    """Paths that exist relative to here become absolute, so the written YAML runs from anywhere
    (links kept as the user named them; an absolute path stays as it is)."""
    args = dict(args)
    for key in ("dataset_dir", "model_name_or_path", "adapter_name_or_path", "deepspeed", "resume_from_checkpoint"):
        value = args.get(key)
        if isinstance(value, str) and Path(value).expanduser().exists():
            args[key] = os.path.abspath(os.path.expanduser(value))
    return args
