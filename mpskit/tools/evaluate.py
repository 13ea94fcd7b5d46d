"""`mpskit eval`: how well finished runs rank held-out preference pairs, against the base model; an
SFT run's loss on its own held-out set.

Each run is evaluated by LLaMA-Factory's own DPO workflow with training off: the run's adapter is
the policy, the base model (the adapter switched off) the reference, so `eval_rewards/accuracies`
is the share of pairs whose chosen answer gains more log-probability over the base model than the
rejected one, and `eval_rewards/margins` the mean gap, scaled by pref_beta. A fooDPO run is judged
by its own loss (each pair's beta scaled by its prompt's perplexity, its fooDPO settings), so eval
reports what its training's evaluation reported. Any LoRA run can be judged this way (SFT too), on
data it did not train on; without --dataset, an SFT run is judged by its loss on its own eval_dataset.
Each reports what the run's own evaluation reported on the same data: the adapter stays beside the
base, as it trained (bends.evaluated_as_trained). Results go to <run>/eval/<dataset>-<time>/.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import replace
from pathlib import Path

from mpskit.datasets.dataset_checks import check_datasets
from mpskit.datasets.plain_data import register_plain_data, registration_folder
from mpskit.engine import bends, lf
from mpskit.errors import MpskitError
from mpskit.recipes.checks import check_model
from mpskit.run.quiet import library_output
from mpskit.settings.foodpo import FOODPO_KEYS
from mpskit.settings.run_spec import RunSpec
from mpskit.stages import stage_of
from mpskit.tools.compare import markdown_table
from mpskit.tools.use_run import inference_args, open_trained

COLUMNS = ("run", "stage", "eval dataset", "eval_rewards/accuracies", "eval_rewards/margins", "eval_loss")
KEPT = ("dataset_dir", "cutoff_len", "per_device_eval_batch_size", "pref_beta", "pref_loss", "seed", "use_cpu",
        "train_on_prompt", "mask_history")


def evaluate_run(
    run_dir: Path, dataset: str | None = None, dataset_dir: str | None = None, allow_unfinished: bool = False
) -> dict:
    run = open_trained(run_dir, allow_unfinished)
    with run.locked("mpskit eval"):
        args = inference_args(run)  # the run's environment, MPS hidden if it was
        trained = run.yaml_args()
        stage = trained.get("stage")
        as_sft = stage == "sft" and dataset is None  # its own held-out answers, by their loss
        dataset = held_out_data(run, dataset)
        check_model(str(args["model_name_or_path"]))  # the base model: the reference, and under the adapter
        folder = re.sub(r"[^\w.+-]+", "_", dataset.replace(",", "+")).lstrip(".")  # stays inside eval/
        foodpo = {key: trained[key] for key in FOODPO_KEYS if key in trained} if stage == "foodpo" else {}
        eval_args = {
            **{key: trained[key] for key in KEPT if key in trained},
            **{key: value for key, value in args.items() if key not in ("infer_backend", "infer_dtype", *FOODPO_KEYS)},
            **foodpo,
            "stage": "sft" if as_sft else "foodpo" if stage == "foodpo" else "dpo",
            **({} if as_sft else reference(trained, args)),
            "do_train": False,
            "do_eval": True,
            "eval_dataset": dataset,
            "report_to": "none",
            **({"dataset_dir": dataset_dir} if dataset_dir else {}),
        }
        check_datasets({"stage": eval_args["stage"], "eval_dataset": dataset,
                        "dataset_dir": eval_args.get("dataset_dir", "data")})  # fmt: skip
        out = run.new_folder("eval", f"{folder}-{time.strftime('%Y%m%d-%H%M%S')}")
        eval_args["output_dir"] = str(out)
        with library_output(out):  # LLaMA-Factory prints its metrics; stdout is the table's
            spec = RunSpec.of(eval_args)
            packs = RunSpec.of(run.train_args()).packs_vocabulary  # the policy's and the reference's, as trained
            packed = replace(spec.lean, quantize_embeddings=packs)
            lf.import_engine()  # before the bends import LLaMA-Factory's modules (trl minds the order)
            with bends.evaluated_as_trained():
                lf.run(replace(spec, lean=packed))
        results = run.results(out)
    row = {"run": os.path.relpath(run.path), "stage": stage, "eval dataset": dataset}
    return {**row, **{column: results.get(column) for column in COLUMNS[3:]}}


def reference(trained: dict, args: dict) -> dict:
    """The base model as the reference; else an evaluation-only run is its own reference."""
    bits = {"ref_model_quantization_bit": args["quantization_bit"]} if "quantization_bit" in args else {}
    return {"ref_model": trained["model_name_or_path"], **bits}


def held_out_data(run, dataset: str | None) -> str:
    """The data RUN is judged on: DATASET, else a DPO, fooDPO or SFT run's own eval_dataset."""
    trained = run.yaml_args()
    stage = trained.get("stage")
    tuned_on_pairs = stage_of(stage).pairs and stage_of(stage).reference_model  # its eval_dataset: pairs
    dataset = dataset or (trained.get("eval_dataset") if tuned_on_pairs or stage == "sft" else None)
    if not dataset:
        raise MpskitError(f"{run.path} ({stage}) names no held-out preference data", "give --dataset NAME")
    return dataset


def evaluate(
    run_dirs: list[str], dataset: str | None = None, dataset_dir: str | None = None, allow_unfinished: bool = False
) -> str:
    """The Markdown table over the runs, one row each. Each run is checked before any is evaluated:
    a run that cannot be is one line before the minutes the others take, not after them. A DATASET that
    is a plain file (or a folder with valid.jsonl) is read as train reads one, and registered for this."""
    if dataset and not dataset_dir:  # with --dataset-dir, a name in its dataset_info.json
        given, entries, converted = register_plain_data({"eval_dataset": dataset}, "dpo")
        if entries:
            dataset, dataset_dir = given["eval_dataset"], str(registration_folder(entries, converted))
    for run_dir in run_dirs:
        held_out_data(open_trained(Path(run_dir), allow_unfinished), dataset)
    rows = [evaluate_run(Path(run_dir), dataset, dataset_dir, allow_unfinished) for run_dir in run_dirs]
    return markdown_table(COLUMNS, rows)
