"""Packages a run needs beyond LLaMA-Factory's own requirements, found before anything starts.

LLaMA-Factory and transformers import these only when a key asks for them, minutes into a run and as a
traceback. The table is theirs: the module names are the ones LLaMA-Factory's availability checks
(llamafactory/extras/packages.py) and trainers import, and transformers' `is_*_available` for the
`report_to` integrations. Looked up with importlib's find_spec: nothing is imported, no torch.
"""

from __future__ import annotations

import importlib.util

# key (true or set) -> (modules, any one of which will do; the pip package; what else to do)
FLAGS = {
    "use_adam_mini": (("adam_mini",), "adam-mini", "or set use_adam_mini: false"),
    "use_badam": (("badam",), "badam", "or set use_badam: false"),
    "use_galore": (("galore_torch",), "galore-torch", "or set use_galore: false"),
    "use_apollo": (("apollo_torch",), "apollo-torch", "or set use_apollo: false"),
    "use_swanlab": (("swanlab",), "swanlab", "or set use_swanlab: false"),
    "use_unsloth": (("unsloth",), "unsloth", "or set use_unsloth: false"),
    "use_kt": (("kt_kernel",), "ktransformers", "or set use_kt: false"),
    "mixture_of_depths": (("MoD",), "mixture-of-depth", "or leave mixture_of_depths out"),
}
# predict_with_generate scores generations with BLEU and ROUGE (llamafactory/train/sft/metric.py)
GENERATION_METRICS = (("jieba",), "jieba"), (("nltk",), "nltk"), (("rouge_chinese",), "rouge-chinese")
# report_to value -> (modules, pip package), as transformers' integrations look them up
REPORTERS = {
    "wandb": (("wandb",), "wandb"),
    "tensorboard": (("tensorboard", "tensorboardX"), "tensorboard"),
    "mlflow": (("mlflow",), "mlflow"),
    "swanlab": (("swanlab",), "swanlab"),
    "comet_ml": (("comet_ml",), "comet-ml"),
    "neptune": (("neptune",), "neptune"),
    "clearml": (("clearml",), "clearml"),
    "dvclive": (("dvclive",), "dvclive"),
    "trackio": (("trackio",), "trackio"),
    "codecarbon": (("codecarbon",), "codecarbon"),
}


def installed(modules: tuple[str, ...]) -> bool:
    return any(importlib.util.find_spec(module) is not None for module in modules)


def _reporters(value) -> list[str]:
    """report_to as transformers reads it: a name, a list of names, or a comma-separated text."""
    names = value if isinstance(value, list | tuple) else str(value or "").split(",")
    return [str(name).strip() for name in names if str(name).strip()]


def missing_packages(args: dict) -> list[tuple[str, str]]:
    """(problem, fix) for each package the arguments ask for that is not installed."""
    missing = []
    for key, (modules, package, other) in FLAGS.items():
        if args.get(key) and not installed(modules):
            missing.append(
                (f"{key} needs the {package} package, which is not installed", f"pip install {package}, {other}")
            )
    if args.get("predict_with_generate"):
        for modules, package in GENERATION_METRICS:
            if not installed(modules):
                missing.append((
                    f"predict_with_generate scores answers with {package}, which is not installed",
                    f"pip install {package}, or set predict_with_generate: false",
                ))  # fmt: skip
    for name in _reporters(args.get("report_to")):
        if name in REPORTERS and not installed(REPORTERS[name][0]):
            package = REPORTERS[name][1]
            missing.append((f"report_to: {name} needs the {package} package, which is not installed",
                            f"pip install {package}, or set report_to: none"))  # fmt: skip
    return missing
