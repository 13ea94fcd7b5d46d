"""The bridge to LLaMA-Factory: its argument names, its YAML, its own run_exp.

Importing this module is cheap; each function imports LLaMA-Factory (and so torch) when called, so
callers can set the environment and hide devices first.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import importlib.util
import logging
import sys
import warnings
from pathlib import Path

from mpskit.collector import libraries_imported
from mpskit.datasets.token_lengths import read_tokenizer
from mpskit.errors import MpskitError
from mpskit.files import write_atomic
from mpskit.rundir.folder import args_text
from mpskit.settings.foodpo import FOODPO_KEYS
from mpskit.settings.knobs import OWN_KEYS
from mpskit.settings.run_spec import RunSpec

# mpskit's own run keys for the lean paths: kept out of the written YAML, which must also run under
# plain `llamafactory-cli train` (where LLaMA-Factory's own paths run), and recorded in mpskit.json.


def known_keys() -> set[str]:
    """Every key `llamafactory-cli train` accepts, read from LLaMA-Factory's own argument classes."""
    from llamafactory.hparams import (
        DataArguments,
        FinetuningArguments,
        GeneratingArguments,
        ModelArguments,
        TrainingArguments,
    )

    classes = (ModelArguments, DataArguments, TrainingArguments, FinetuningArguments, GeneratingArguments)
    return {f.name for cls in classes for f in dataclasses.fields(cls) if f.init}


ARGUMENT_CLASSES = ["ModelArguments", "DataArguments", "TrainingArguments", "FinetuningArguments"]
ARGUMENT_CLASSES += ["GeneratingArguments"]  # llamafactory-cli train's five, as in known_keys()
ARGUMENT_SOURCES = {"llamafactory": "hparams/*.py", "transformers": "training_args*.py"}


def key_names() -> set[str]:
    """known_keys() read from the installed sources with `ast`, without importing them (torch takes
    seconds), for `mpskit plan`. A test checks that both give the same set."""
    return set(argument_annotations())


@functools.cache
def argument_annotations() -> dict[str, str | None]:
    """Each key of llamafactory-cli train's argument classes and its type annotation as source text
    (None where the field names choices), read with `ast` from the installed sources, once a process."""
    classes: dict[tuple[str, str], tuple[list[str], dict]] = {}  # (package, name) -> (bases, fields)
    aliases: dict[tuple[str, str], list[tuple[str, str]]] = {}  # (package, local name) -> where it comes from
    for package, pattern in ARGUMENT_SOURCES.items():
        spec = importlib.util.find_spec(package)
        for path in Path(spec.submodule_search_locations[0]).glob(pattern):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom):
                    source = package if node.level else (node.module or "").split(".")[0]
                    for name in node.names:
                        aliases.setdefault((package, name.asname or name.name), []).append((source, name.name))
                elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and len(node.targets) == 1:
                    if isinstance(node.targets[0], ast.Name):
                        aliases.setdefault((package, node.targets[0].id), []).append((package, node.value.id))
                elif isinstance(node, ast.ClassDef):
                    bases = [getattr(base, "id", None) or getattr(base, "attr", "") for base in node.bases]
                    fields = dict(field for field in map(_field, node.body) if field)
                    classes[(package, node.name)] = (bases, fields)

    def fields_of(package: str, name: str, depth: int = 0) -> dict | None:
        if (package, name) in classes:
            bases, own = classes[(package, name)]
            inherited = [fields_of(package, base, depth + 1) or {} for base in reversed(bases)]
            return {key: value for fields in [*inherited, own] for key, value in fields.items()}
        for source in aliases.get((package, name), []) if depth < 10 else []:
            if source != (package, name) and (found := fields_of(*source, depth + 1)) is not None:
                return found
        return None

    return {key: value for name in ARGUMENT_CLASSES for key, value in (fields_of("llamafactory", name) or {}).items()}


def _field(node: ast.stmt) -> tuple[str, str | None] | None:
    """(name, annotation) of the dataclass init field a class-body statement declares, if any."""
    if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
        return None
    annotation = ast.unparse(node.annotation)
    if "ClassVar" in annotation:
        return None
    value = node.value
    if isinstance(value, ast.Call) and any(
        kw.arg == "init" and isinstance(kw.value, ast.Constant) and kw.value.value is False for kw in value.keywords
    ):
        return None
    return node.target.id, None if value is not None and "'choices'" in ast.unparse(value) else annotation


def check_keys(args: dict, keys: set[str] | None = None) -> None:
    """Fail on the first key LLaMA-Factory (or, for stage foodpo, fooDPO) does not know, with a hint.
    `keys`: LLaMA-Factory's keys when the caller has them already (`plan`: key_names())."""
    keys = (keys or known_keys()) | set(OWN_KEYS) | (set(FOODPO_KEYS) if args.get("stage") == "foodpo" else set())
    for key in args:
        if key not in keys:
            close = difflib.get_close_matches(key, keys, n=1)
            hint = f"did you mean '{close[0]}'?" if close else "see `llamafactory-cli train -h` for the keys"
            raise MpskitError(f"unknown key '{key}'", hint)


def check_template(args: dict) -> None:
    """The template is one LLaMA-Factory registered (it fails on an unknown one only after the model
    has loaded), and the model's tokenizer has its stop words. Neither imports LLaMA-Factory."""
    template = args.get("template")
    if not template:
        return
    templates = template_stop_words()
    if template not in templates:
        close = difflib.get_close_matches(str(template), templates, n=1)
        hint = f"did you mean '{close[0]}'?" if close else "see LLaMA-Factory's data/template.py for the names"
        raise MpskitError(f"template '{template}' is not one of LLaMA-Factory's templates", hint)
    check_template_tokens(args, templates[template])


def template_stop_words() -> dict[str, list[str]]:
    """Each template LLaMA-Factory registers and its stop words: from its TEMPLATES where `train` has
    imported it already, else from its source (importing it imports torch: seconds)."""
    imported = sys.modules.get("llamafactory.data.template")
    if imported is not None:
        return {name: list(template.stop_words) for name, template in imported.TEMPLATES.items()}
    return templates_in_source()


def templates_in_source() -> dict[str, list[str]]:
    """template_stop_words() read from LLaMA-Factory's data/template.py with `ast`. A test checks them
    against its own TEMPLATES."""
    path = Path(importlib.util.find_spec("llamafactory").submodule_search_locations[0]) / "data" / "template.py"
    templates = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "register_template":
            keywords = {keyword.arg: keyword.value for keyword in node.keywords}
            stop_words = keywords.get("stop_words")
            templates[ast.literal_eval(keywords["name"])] = ast.literal_eval(stop_words) if stop_words else []
    return templates


def check_template_tokens(args: dict, stop_words: list[str]) -> None:
    """The template's stop words are tokens of the model's tokenizer. LLaMA-Factory adds missing ones
    to the tokenizer; without resize_vocab their ids point past the model's embeddings (an IndexError
    inside the model once training starts) or at rows nothing trained: another family's template."""
    model = Path(str(args.get("model_name_or_path", ""))).expanduser()
    if not stop_words or args.get("resize_vocab") or not model.is_dir():
        return
    missing = [word for word in stop_words if word not in _vocabulary(model, bool(args.get("trust_remote_code")))]
    if missing:
        raise MpskitError(
            f"template={args['template']} ends turns with {', '.join(missing)}, which {model}'s tokenizer does not "
            "have: it is another model family's template",
            "use the model's own template (qwen for Qwen), or resize_vocab=true to train new token embeddings",
        )


def _vocabulary(model: Path, trust_remote_code: bool) -> set[str]:
    """The tokenizer's tokens, added ones included: from tokenizer.json by `tokenizers` where the
    model has one (no torch), else as transformers builds the tokenizer."""
    try:
        if (model / "tokenizer.json").is_file():
            return set(read_tokenizer(model / "tokenizer.json").get_vocab(with_added_tokens=True))
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model, trust_remote_code=trust_remote_code, local_files_only=True)
        return set(tokenizer.get_vocab())
    except Exception as err:  # noqa: BLE001 - whatever the libraries raise on these files, said as one line
        first = (str(err).strip().splitlines() or [""])[0][:200]
        fix = "copy the model's tokenizer files again (tokenizer.json, tokenizer_config.json)"
        raise MpskitError(f"the tokenizer of {model} cannot be built ({type(err).__name__}: {first})", fix) from None


TRUE_WORDS, FALSE_WORDS = ("yes", "true", "t", "y", "1"), ("no", "false", "f", "n", "0")  # transformers' string_to_bool


def typed_words(texts: dict[str, str | None]) -> dict:
    """Command-line word values typed as `llamafactory-cli train --key value` types them. Keys it does
    not know (mpskit's, misspelt ones), `stage` (mpskit adds foodpo to its choices), the planner's
    `auto` and empty values (`eval_dataset=` unsets, as OmegaConf reads it; HfArgumentParser would
    keep "") are left out, for the caller's own reading and key check.

    A key whose field is plainly str, int, float or bool (optional or not) is typed here with the
    function HfArgumentParser itself would call (str, int, float, its string_to_bool), from the
    annotation read with `ast`; anything else (choices, lists, unions, an unconvertible value) goes
    through LLaMA-Factory's own HfArgumentParser, which imports torch (seconds) and words its errors."""
    annotations = argument_annotations()
    wanted = {
        key: text for key, text in texts.items() if key in annotations and key != "stage" and text not in ("auto", "")
    }
    typed, rest = {}, {}
    for key, text in wanted.items():
        value = _typed_plainly(_plain_type(annotations[key]), text)
        if value is None:
            rest[key] = text
        else:
            typed[key] = value
    return {**typed, **(_typed_by_llamafactory(rest) if rest else {})}


def _plain_type(annotation: str | None) -> str | None:
    """'str', 'int', 'float' or 'bool' for such a field, Optional or `| None` included ('bool or None':
    HfArgumentParser takes a bare flag for a plain bool only); else None."""
    text = (annotation or "").replace(" ", "")
    bare = text.replace("|None", "").replace("None|", "")
    if bare.startswith("Optional[") and bare.endswith("]"):
        bare = bare[len("Optional[") : -1]
    if bare == "bool" and text != "bool":
        return "bool or None"
    return bare if bare in ("str", "int", "float", "bool") else None


def _typed_plainly(kind: str | None, text: str | None):
    """The value, or None where HfArgumentParser must decide (and word the error)."""
    if kind in ("bool", "bool or None") and not (text is None and kind != "bool"):
        low = "true" if text is None else text.lower()
        return True if low in TRUE_WORDS else False if low in FALSE_WORDS else None
    if kind is None or text is None:
        return None
    try:
        return {"str": str, "int": int, "float": float}[kind](text)
    except ValueError:
        return None


def _typed_by_llamafactory(texts: dict[str, str | None]) -> dict:
    from llamafactory.hparams.parser import _TRAIN_ARGS
    from transformers import HfArgumentParser

    def refuse(message: str):
        raise MpskitError(f"command line: {message}", "see `llamafactory-cli train -h` for each key's values")

    parser = HfArgumentParser(_TRAIN_ARGS)
    parser.error = refuse
    words = [f"--{key}" if text is None else f"--{key}={text}" for key, text in texts.items()]
    namespace, _ = parser.parse_known_args(words)
    return {key: getattr(namespace, key) for key in texts}


def yaml_text(args: dict) -> str:
    """llamafactory.yaml's text: every argument but mpskit's lean-path switches."""
    return args_text(RunSpec.of(args).yaml_args())


def write_yaml(args: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, yaml_text(args))
    return path


def import_engine():
    """Import LLaMA-Factory's training entry point (and with it torch, transformers, peft, trl, and
    bitsandbytes where it is installed), outside the cycle collector (collector.py)."""
    with libraries_imported():
        from mpskit.engine.quantized import import_bitsandbytes

        import_bitsandbytes()  # first: peft and LLaMA-Factory import it too, and it speaks as it is imported
        _import_deepspeed()
        from llamafactory.train.tuner import run_exp

    return run_exp


def _import_deepspeed() -> None:
    """Where DeepSpeed is installed, accelerate imports it in every run as it unwraps the model: after the
    memory monitor's baseline, with torch's deprecation warnings and DeepSpeed's choice of accelerator on
    the screen. It is imported here with the other libraries instead, and says nothing; so does torch's
    extension builder, which DeepSpeed's CPU ranks load as they start (it looks for CUDA's compiler)."""
    if importlib.util.find_spec("deepspeed") is None:
        return
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            import deepspeed  # noqa: F401
            import torch.utils.cpp_extension  # noqa: F401
    finally:
        logging.disable(logging.NOTSET)


def run(spec: RunSpec, callbacks: list | None = None) -> tuple[dict, dict]:
    """Train through LLaMA-Factory's own entry point, exactly as `llamafactory-cli train` does, within
    the bends a run needs (bends.py lists them: the full trainer log, resumable trainers for pt, rm and
    kto, the lean trainers for SFT and DPO, fooDPO's for `stage: foodpo`, which runs as LLaMA-Factory's
    DPO workflow, and a quantized base's reading and layout).
    Returns what each lean path did, lean logits' and lean attention's, and the engine that ran (for
    mpskit.json).
    """
    from mpskit.engine.bends import training_bends

    run_exp = import_engine()
    with training_bends(spec) as (lean, attention, engine):
        run_exp(spec.engine_args(), callbacks=callbacks or [])
    return lean.report, attention.report, engine
