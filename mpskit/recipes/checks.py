"""The checks before a run that read files, the disk or the hub, and the planned run they lead to.

`mpskit config` and `mpskit train` both start here, so they check and plan the same way. No torch.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
from dataclasses import replace
from pathlib import Path

from mpskit.datasets.dataset_checks import check_conversion, check_datasets
from mpskit.engine import lf
from mpskit.errors import MpskitError, warn
from mpskit.files import read_json
from mpskit.machine.hardware import nvidia_gpus
from mpskit.machine.hub import hub_cache_dir, hub_offline, looks_like_hub_id
from mpskit.machine.launch import check_rendezvous
from mpskit.machine.optional_packages import missing_packages
from mpskit.plan import advice
from mpskit.plan.memory import GB, checkpoint_bytes, trainable_params
from mpskit.plan.planner import Plan
from mpskit.presets import preset_model_dir
from mpskit.rundir.checkpoints import checkpoint_step, incomplete_reason
from mpskit.settings import quantization
from mpskit.settings.foodpo import check_foodpo
from mpskit.settings.knobs import from_args
from mpskit.settings.resolve import ResolvedRun, cuda_only, other_file


def prepare(run: ResolvedRun, need_weights: bool = True) -> tuple[ResolvedRun, Plan | None]:
    """All checks that need no torch (model, datasets, fooDPO settings), then the planned run: the
    planner's choice of the free knobs in its arguments. No plan when the model's dims are unknown;
    refused when nothing fits. Without `need_weights` (writing a config), a hub model that is not
    downloaded is a warning."""
    check_model(str(run.args["model_name_or_path"]), need_weights)
    check_llama_pro(run.args)
    check_lora_target(run.args)
    check_datasets(run.args)
    check_resume_from(run.args.get("resume_from_checkpoint"), run.args)
    check_foodpo(run.args)
    try:
        planned, memory_plan = advice.planned(run)
    except MpskitError as err:
        warn(f"no memory plan: {err.problem}")
        if run.auto:
            warn(f"{', '.join(f'{key}=auto' for key in run.auto)}: no plan chooses them here, so LLaMA-Factory's "
                 "defaults stand (flash_attn: auto included); set them yourself to choose")
            if "flash_attn" in run.auto:  # LLaMA-Factory's own value too
                run = replace(run, args={**run.args, "flash_attn": "auto"})
        return run, None
    if not memory_plan.fits:
        need = memory_plan.asked.estimate.training / GB
        raise MpskitError(
            f"no setting fits: the run needs about {need:.1f} GB, the budget is "
            f"{memory_plan.budget.training_bytes / GB:.1f} GB ({memory_plan.budget.why})",
            "what would fit: " + "; ".join(memory_plan.would_fit) + " (see `mpskit plan`)",
        )
    _warn_on_steps_past_the_data(memory_plan, run.world_size)
    return planned, memory_plan


def _warn_on_steps_past_the_data(memory_plan: Plan, world_size: int) -> None:
    """An optimizer step that asks for more rows than the training set holds takes them all, once each:
    every step is a whole epoch, and the run has far fewer steps than its settings suggest."""
    rows = memory_plan.lengths.rows if memory_plan.lengths else None
    per_step = memory_plan.effective_batch * world_size
    if rows and per_step > rows:
        warn(f"an optimizer step takes {per_step} rows (batch x gradient_accumulation_steps) and the training "
             f"set holds {rows}: each step is one whole epoch; lower gradient_accumulation_steps, or give more rows")


def check_trains(args: dict) -> None:
    """`mpskit train` trains: a file that predicts, evaluates, exports or chats is run by the command made
    for it, and a file that does none of these would load the model and stop."""
    if args.get("do_train"):
        return
    if args.get("do_predict") or args.get("do_eval"):
        what = "predicts" if args.get("do_predict") else "evaluates"
        raise MpskitError(
            f"this run {what} and does not train (do_train is not true)",
            "run the file with llamafactory-cli train FILE, or use mpskit eval RUN_DIR for a run mpskit trained",
        )
    if other := other_file(args):
        raise MpskitError(f"this file is {other[0]} and does not train", other[1])
    raise MpskitError(
        "nothing to train: do_train is not true (LLaMA-Factory would load the model and stop)",
        "add do_train: true, or preset: NAME for one of mpskit's stage presets",
    )


def check_packages(args: dict) -> None:
    """Packages the arguments ask for (report_to: wandb, use_galore, ...) are installed."""
    missing = missing_packages(args)
    if missing:
        raise MpskitError(*missing[0])


def check_with_engine(args: dict) -> None:
    """The checks that ask LLaMA-Factory itself: its templates (from its sources) and the dataset rows
    through its own converter (this imports it, and torch). Its keys are checked before, from its
    sources (lf.key_names)."""
    lf.check_template(args)
    check_conversion(args)


def check_model(model: str, need_weights: bool = True) -> None:
    """A local directory with config.json, or a hub id already in the local cache (or reachable)."""
    path = Path(os.path.expanduser(model))
    fix = (
        "set MODEL_PATH (model_name_or_path) to a local model directory, or model_preset=smollm2-135m for the real "
        "model `make demo` trains offline (fetched once by make install)"
    )
    if not path.exists() and path == preset_model_dir():
        if need_weights:
            raise MpskitError(f"the demo model {model} is not built yet", "build it there: mpskit tiny-model")
        warn(f"the demo model {model} is not built yet: build it before `mpskit train` (mpskit tiny-model)")
        return
    if path.is_file() and path.suffix == ".gguf":
        raise MpskitError(f"{model} is a GGUF file; LLaMA-Factory trains a Hugging Face model folder",
                          f"convert it once: mpskit get-model {model}, then model_name_or_path={path.with_suffix('')}")
    if path.exists():
        if not (path / "config.json").is_file():
            raise MpskitError(f"model directory {model} has no config.json", fix)
        try:
            config = read_json(path / "config.json")
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise MpskitError(f"{path / 'config.json'} is not valid JSON", "restore the model's config.json") from err
        if not isinstance(config, dict):
            raise MpskitError(f"{path / 'config.json'} holds a {type(config).__name__}, not an object",
                              "restore the model's config.json (an object with model_type and the shapes)")  # fmt: skip
        quantized = config.get("quantization_config")
        if isinstance(quantized, dict) and quantized.get("quant_method") == "bitsandbytes":
            raise MpskitError(f"{path / 'config.json'} says the model is saved quantized by bitsandbytes",
                              "train its 16-bit original with quantization_bit=4 (quantized as it loads)")  # fmt: skip
        if not isinstance(config.get("model_type"), str):
            raise MpskitError(f"{path / 'config.json'} names no model_type, by which transformers builds the model",
                              "restore the model's config.json (Qwen2.5's says model_type: qwen2)")  # fmt: skip
        if need_weights:
            _check_model_files(path)
        return
    if not looks_like_hub_id(model):
        raise MpskitError(f"model {model} not found", fix)
    if (hub_cache_dir() / f"models--{model.replace('/', '--')}").is_dir():
        return
    if not need_weights:
        warn(f"{model} is not downloaded: download it before `mpskit train` (hf download {model})")
    elif hub_offline() or not _hub_reachable(model):
        raise MpskitError(f"model {model} is not a local directory and the hub cannot be reached", fix)


def check_llama_pro(args: dict) -> None:
    """LLaMA Pro trains every n-th block (n = freeze_trainable_layers): the model's layers must divide
    by it, or LLaMA-Factory stops once the model has loaded."""
    config = Path(os.path.expanduser(str(args["model_name_or_path"]))) / "config.json"
    if not args.get("use_llama_pro") or not config.is_file():
        return
    layers = read_json(config).get("num_hidden_layers")
    every = args.get("freeze_trainable_layers", 2)
    if isinstance(layers, int) and isinstance(every, int) and every > 0 and layers % every:
        raise MpskitError(
            f"use_llama_pro: the model's {layers} layers do not divide by freeze_trainable_layers={every}",
            "set freeze_trainable_layers to a divisor of the model's layers",
        )


def check_lora_target(args: dict) -> None:
    """Each name in lora_target is a linear layer of the model (peft matches a module's name or its
    dotted end), told from the weights' names and shapes in a local model's safetensors headers. peft
    refuses a wrong name only once the model has loaded, after the run folder is written."""
    value = args.get("lora_target")
    if args.get("finetuning_type", "lora") != "lora" or value in (None, "all") or not isinstance(value, str):
        return
    path = Path(os.path.expanduser(str(args["model_name_or_path"])))
    modules = _weight_dims(path) if path.is_dir() else {}
    in_blocks = [name for name, dims in modules.items() if dims == 2 and any(p.isdigit() for p in name.split("."))]
    linear = sorted({name.rsplit(".", 1)[-1] for name in in_blocks})
    for target in (name.strip() for name in value.split(",") if name.strip()):
        found = [dims for name, dims in modules.items() if name == target or name.endswith("." + target)]
        if modules and not found:
            raise MpskitError(f"lora_target={value}: {path.name} has no module '{target}'",
                              f"name its linear layers ({', '.join(linear)}) or write lora_target=all")  # fmt: skip
        if found and 2 not in found:
            raise MpskitError(f"lora_target={value}: '{target}' is not a linear layer of {path.name}",
                              f"name its linear layers ({', '.join(linear)}) or write lora_target=all")  # fmt: skip


def _weight_dims(path: Path) -> dict[str, int]:
    """Each module of a local model folder that has a weight -> the weight's dimensions, from the
    safetensors files' headers ({} for a model in other formats). A header that does not read is one
    line: loading would fail on it minutes later."""
    from safetensors import SafetensorError, safe_open

    modules = {}
    for file in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(file, framework="numpy") as weights:
                for key in weights.keys():
                    if key.endswith(".weight"):
                        modules[key.removesuffix(".weight")] = len(weights.get_slice(key).get_shape())
        except (SafetensorError, OSError) as err:
            fix = "copy the model's weights again"
            raise MpskitError(f"{file} is not a readable safetensors file ({err})", fix) from None
    return modules


MODEL_WEIGHTS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.pt", "*.gguf")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def _check_model_files(path: Path) -> None:
    """A local model folder has weights and a tokenizer besides config.json: without them loading
    fails minutes later, after the run folder is written."""
    if not any(any(path.glob(pattern)) for pattern in MODEL_WEIGHTS):
        raise MpskitError(
            f"model directory {path} has no weights (*.safetensors, *.bin)", "copy the whole model folder"
        )
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise MpskitError(
            f"model directory {path} has no tokenizer ({', '.join(TOKENIZER_FILES[:2])})",
            "copy the whole model folder",
        )
    _weight_dims(path)  # every safetensors header reads and covers its file


def _hub_reachable(model: str) -> bool:
    import urllib.request

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        with urllib.request.urlopen(f"{endpoint}/api/models/{model}", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def check_resume_from(checkpoint: str | None, args: dict) -> None:
    """A `resume_from_checkpoint` the user gives is a complete checkpoint folder whose adapter has the
    run's LoRA rank (its weights are loaded into the run's adapter)."""
    if not checkpoint:
        return
    path = Path(str(checkpoint)).expanduser()
    why = incomplete_reason(path) if path.is_dir() else "not a folder"
    if why:
        raise MpskitError(
            f"resume_from_checkpoint {path}: {why}", "give a complete checkpoint-N folder, or leave it out"
        )
    step, max_steps = checkpoint_step(path), args.get("max_steps")
    if step is not None and isinstance(max_steps, int) and 0 < max_steps <= step:
        raise MpskitError(
            f"resume_from_checkpoint {path} is at step {step}, and this run ends at max_steps={max_steps}: "
            "it would train nothing and end past its last step",
            f"set max_steps above {step}, or leave resume_from_checkpoint out",
        )
    try:
        saved_rank = json.loads((path / "adapter_config.json").read_text(encoding="utf-8")).get("r")
    except (OSError, ValueError, AttributeError):
        return  # not a LoRA checkpoint
    rank = from_args(args).lora_rank  # LLaMA-Factory's default where the run sets none
    if args.get("finetuning_type", "lora") == "lora" and saved_rank is not None and saved_rank != rank:
        raise MpskitError(
            f"resume_from_checkpoint {path} holds a LoRA adapter of rank {saved_rank}; this run's lora_rank is {rank}",
            f"set lora_rank={saved_rank}, or leave resume_from_checkpoint out",
        )


def check_device(run: ResolvedRun) -> None:
    """The profile's device is on this machine (an MPS run needs a Mac with Apple silicon, a CUDA run an
    NVIDIA GPU), several nodes are told where to meet, and the run has no CUDA-only option off CUDA.
    `mpskit plan` and `config` may name any profile and write such options, with a warning; `train` runs
    here."""
    if run.device == "mps" and (platform.system() != "Darwin" or platform.machine() != "arm64"):
        where = f"{platform.system()} {platform.machine()}"
        raise MpskitError(
            f"hardware '{run.hardware.name}' trains on MPS, which this machine ({where}) does not have",
            "train with --hardware cpu (or no --hardware: mpskit detects this machine)",
        )
    check_rendezvous(run.processes[1])
    if run.device == "cpu" and run.args.get("deepspeed") and run.processes == (1, 1):
        raise MpskitError("deepspeed on the CPU shards over several processes, and this run has one",
                          "set NPROC_PER_NODE=2 (or more), or leave deepspeed out")  # fmt: skip
    problems = cuda_only(run.args, run.device)
    if problems:
        raise MpskitError(problems[0], "leave it out here, or train on a CUDA machine (`mpskit plan` shows what fits)")
    if quantized := quantization.device_problems(run.args, run.device, run.hardware):
        raise MpskitError(*quantized[0])
    if run.device == "cuda" and not nvidia_gpus():
        raise MpskitError(
            f"hardware '{run.hardware.name}' trains on CUDA, but nvidia-smi finds no NVIDIA GPU here",
            "train with --hardware cpu (or no --hardware: mpskit detects this machine)",
        )
    for key, package, extra in _engine_packages(run.args):
        if importlib.util.find_spec(package) is None:
            raise MpskitError(
                f"{key} needs the {package} package, which is not installed",
                f"pip install 'mpskit[{extra}]', or leave the key out",
            )


def _engine_packages(args: dict) -> list[tuple[str, str, str]]:
    """(option, the package it imports, mpskit's extra that installs it) for each such option in `args`
    (bitsandbytes, which runs everywhere, is quantization.device_problems')."""
    wanted = [
        ("deepspeed", "deepspeed", "distributed", bool(args.get("deepspeed"))),
        ("enable_liger_kernel", "liger_kernel", "cuda", bool(args.get("enable_liger_kernel"))),
    ]
    return [(key, package, extra) for key, package, extra, used in wanted if used]


def check_disk(run: ResolvedRun, memory_plan: Plan | None, root: str | Path = "output") -> None:
    """The run directory can be created, and its disk holds two checkpoints and the final weights (of the
    planned setting; unknown without a plan, which `prepare` has said)."""
    target = Path(str(run.args.get("output_dir") or root)).expanduser().resolve()
    existing = next(p for p in (target, *target.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise MpskitError(f"cannot create the run directory under {existing}", "set output_dir to a writable folder")
    if memory_plan is None:
        return
    dims, knobs = memory_plan.dims, memory_plan.chosen.knobs
    # two checkpoints, the final weights, logs
    need = 2 * checkpoint_bytes(dims, knobs) + trainable_params(dims, knobs) * 4 + 100 * 1024**2
    free = shutil.disk_usage(existing).free
    if free < need:
        raise MpskitError(
            f"{existing} has {free / GB:.1f} GB free; checkpoints need about {need / GB:.1f} GB",
            "free disk space, or set output_dir to a larger disk (and save_total_limit to keep fewer checkpoints)",
        )
