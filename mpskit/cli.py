"""`mpskit` command line. Every user error ends as one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import sys
import textwrap
from pathlib import Path
from typing import NoReturn

from mpskit import __version__
from mpskit.collector import before_exit
from mpskit.errors import Interrupted, MpskitError, NextRung
from mpskit.run.process_exit import exit_code_is, leave_after_python_exit
from mpskit.run.quiet import VERBOSE_VARIABLE, keep_running_without_a_screen
from mpskit.run.signals import STOP_SIGNALS
from mpskit.self_command import mpskit_command
from mpskit.temporary import install_sigterm_exit


def usage_run() -> str:
    """`mpskit train|config|plan --help`; mpskit's own settings with their defaults, from their fields."""
    from mpskit.settings.settings_help import usage_words

    return (
        "mpskit {train,config,plan} [RUN.yaml] [key=value | --key value ...] [--hardware NAME|FILE] "
        "[-o FILE [--force]] [--json] [--probe] [-v]\n"
        "mpskit train --resume [RUN_DIR]   continue a stopped or killed run from its last checkpoint\n"
        "    (--rebuild-record: first a new run record from the run's written arguments, when it is damaged;\n"
        "    dataset=PATH, eval_dataset=PATH: where its plain data files are now, if they moved)\n"
        "  RUN.yaml and the key=value words are what `llamafactory-cli train` accepts, plus mpskit's keys:\n"
        + textwrap.fill("preset (a stage preset under your settings), model_preset (configs/models), hardware "
                        f"(configs/hardware), device (auto|mps|cuda|cpu), run_name, and its settings: {usage_words()}.",
                        100, initial_indent="  ", subsequent_indent="  ")  # fmt: skip
        + "\n"
        "  dataset= may be a .jsonl/.json file or a folder with train.jsonl (and valid.jsonl).\n"
        "  Batch size, accumulation, checkpointing, LoRA rank, cutoff_len, dtype and flash_attn left unset or\n"
        "  set to `auto` are the planner's to choose; `mpskit plan` shows its choice. Every key: docs/usage.md.\n"
        "  -v, --verbose: LLaMA-Factory's and transformers' own logs and progress bar on screen too (they are\n"
        "  always in the run's train.log)."
    )


def cmd_detect(ns: argparse.Namespace) -> int:
    from mpskit.machine.hardware import describe, select_hardware

    hw = select_hardware(ns.hardware, probe_torch=True)
    if ns.json:
        print(json.dumps(hw.as_dict(), indent=2))
    else:
        for key, value in describe(hw):
            print(f"{key:24} {value}")
    return 0


def cmd_env(ns: argparse.Namespace) -> int:
    from mpskit.machine.hardware import hardware_notes, select_hardware
    from mpskit.machine.mps_env import export_lines

    hw = select_hardware(ns.hardware)
    for note in hardware_notes(hw):
        print(f"# note: {note}")
    print(export_lines(hw))
    return 0


def cmd_ls(ns: argparse.Namespace) -> int:
    from mpskit.presets import PRESET_KINDS, config_dir, preset_descriptions

    print(f"presets in {config_dir()} (MPSKIT_CONFIG_DIR to use your own folder)")
    for kind in PRESET_KINDS:
        key = {"stages": "stage", "models": "model_preset", "hardware": "--hardware"}[kind]
        print(f"\n{kind} ({key}):")
        for name, description in preset_descriptions(kind):
            print(f"  {name:14} {description}")
    from mpskit.tools.runs import run_lines

    lines = run_lines()
    print(f"\nruns in {Path('output').absolute()} (stage, model, last attempt, step reached, last loss):")
    print("\n".join(lines) if lines else "  none yet: mpskit train ... or make demo")
    return 0


def cmd_config(words: list[str]) -> int:
    from mpskit.recipes.config import write_config

    return write_config(words)


def cmd_plan(words: list[str]) -> int:
    from mpskit.recipes.planning import show_plan

    return show_plan(words)


def cmd_train(words: list[str]) -> int:
    keep_running_without_a_screen()
    if "--resume" in words:
        from mpskit.recipes.train import resume

        rest = [w for w in words if w not in ("--resume", "--rebuild-record")]
        folders = [w for w in rest if "=" not in w]
        data = dict(w.split("=", 1) for w in rest if "=" in w)
        if len(folders) > 1 or set(data) - {"dataset", "eval_dataset"}:
            raise MpskitError("--resume takes a run directory, and dataset=/eval_dataset= for data files that moved",
                              "mpskit train --resume [RUN_DIR] [dataset=NEWPATH]")  # fmt: skip
        resume(folders[0] if folders else None, rebuild="--rebuild-record" in words, data=data)
        return 0
    from mpskit.recipes.from_words import resolve_from_words

    run, _ = resolve_from_words(words)  # a typo is answered before the libraries load (seconds)
    from mpskit.recipes.train import train

    train(run, command=["mpskit", "train", *words])
    return 0


def cmd_rank(ns: argparse.Namespace) -> int:
    from mpskit.recipes.train import continue_run
    from mpskit.rundir.folder import RunDir

    keep_running_without_a_screen()
    try:
        continue_run(RunDir.open(ns.run_dir))
    except Interrupted as stop:
        if not stop.at_step_end:
            raise  # stopped alone, before or after training: torchrun ends the other ranks
    return 0  # a stop that every rank took at one step's end: the launching process says so


def cmd_chat(ns: argparse.Namespace) -> int:
    if ns.run_dir and ns.run_dir.endswith(".gguf"):
        if ns.base:
            fix = "export the run's base model as a file: mpskit export RUN --gguf q8_0 --base"
            raise MpskitError("chat --base takes a run folder, not a GGUF file", fix)
        from mpskit.tools.llama_cpp import chat_file

        chat_file(Path(ns.run_dir).expanduser(), ns.prompt, ns.max_new_tokens, ns.temperature)
        return 0
    from mpskit.tools.use_run import chat

    chat(ns.run_dir, ns.prompt, ns.max_new_tokens, ns.allow_unfinished, ns.base, ns.temperature)
    return 0


def cmd_serve(ns: argparse.Namespace) -> int:
    from mpskit.tools.llama_cpp import serve

    serve(ns.source, ns.port, ns.allow_unfinished)
    return 0


def cmd_export(ns: argparse.Namespace) -> int:
    if ns.gguf:
        from mpskit.tools.gguf_export import describe, export_gguf

        print(describe(export_gguf(ns.run_dir, ns.output, ns.gguf, ns.allow_unfinished, ns.base)), file=sys.stderr)
        return 0
    if ns.base:
        raise MpskitError("export --base writes the base model as a GGUF file", "add --gguf TYPE (q8_0, f16, ...)")
    from mpskit.tools.use_run import export

    out = export(ns.run_dir, ns.output, ns.allow_unfinished)
    print(f"mpskit: wrote {out} (loads with transformers' AutoModelForCausalLM.from_pretrained)", file=sys.stderr)
    return 0


def cmd_eval(ns: argparse.Namespace) -> int:
    from mpskit.tools.evaluate import evaluate

    print(evaluate(ns.run_dirs, ns.dataset, ns.dataset_dir, ns.allow_unfinished), end="")
    return 0


def _allow_unfinished(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-unfinished", action="store_true", help="use the adapter of a run that stopped early")


def cmd_tiny_model(ns: argparse.Namespace) -> int:
    from mpskit.tools.tiny import build_tiny_model, ensure_preset_model

    if ns.directory:
        out, built = build_tiny_model(ns.directory, ns.data), True
    else:
        out, built = ensure_preset_model(ns.data)
    print(f"mpskit: tiny model {'written to' if built else 'already in'} {out}")
    return 0


def cmd_get_model(ns: argparse.Namespace) -> int:
    from mpskit.tools.get_model import get_model

    out, made = get_model(ns.source, ns.output)
    print(f"mpskit: model {'written to' if made else 'already in'} {out}")
    return 0


def cmd_calibrate(ns: argparse.Namespace) -> int:
    from mpskit.trials.calibrate import calibrate, report

    print("\n".join(report(*calibrate())))
    return 0


def cmd_doctor(ns: argparse.Namespace) -> int:
    from mpskit.tools.doctor import run_doctor

    return run_doctor(ns.hardware, ns.model)


def cmd_demo(ns: argparse.Namespace) -> int:
    from mpskit.tools.demo import run_demo

    return run_demo(ns.hardware)


def cmd_compare(ns: argparse.Namespace) -> int:
    from mpskit.tools.compare import compare

    out = compare(ns.run_dirs, ns.out)
    print((out / "comparison.md").read_text(), end="")
    print(f"mpskit: wrote {out}/comparison.csv, comparison.md, comparison.png", file=sys.stderr)
    return 0


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"{text!r} is not a temperature from 0 to 100")
    return value


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number from 1 to 65535")
    return int(text)


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as mpskit's one line instead of a usage block."""

    def error(self, message: str):
        command = self.prog.removeprefix("mpskit").strip()
        raise MpskitError(f"{command}: {message}" if command else message, f"see `{self.prog} --help`")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mpskit", description="LLM fine-tuning that fits: SFT, DPO, fooDPO.")
    parser.add_argument("--version", action="version", version=f"mpskit {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="the libraries' own logs on screen too (or MPSKIT_VERBOSE=1)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, helptext in (
        ("detect", "describe this machine (or a --hardware profile)"),
        ("env", "print export lines for the MPS/tokenizer environment, each with its reason"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--hardware", help="profile name in configs/hardware or a YAML file ($MPSKIT_HARDWARE)")
        if name == "detect":
            p.add_argument("--json", action="store_true")
    usage = usage_run()
    for name, helptext in (
        ("plan", "memory, budget, the fastest setting that fits and how long it takes (--json, --probe)"),
        ("config", "write the LLaMA-Factory YAML for a run (-o FILE, or stdout)"),
        ("train", "train through LLaMA-Factory's run_exp; writes output/<run>/<timestamp>/"),
    ):
        p = sub.add_parser(name, help=helptext, usage=usage, add_help=False)
        p.add_argument("words", nargs=argparse.REMAINDER)
    sub.add_parser("ls", help="list the stage, model and hardware presets with their descriptions")
    _add_run_folder_commands(sub)
    _add_model_commands(sub)
    p = sub.add_parser("compare", help="table (CSV, Markdown) and plot over finished DPO/fooDPO runs")
    p.add_argument("--out", required=True, help="folder for comparison.csv, comparison.md, comparison.png")
    p.add_argument("run_dirs", nargs="+")
    p = sub.add_parser("rank")  # started by torchrun: one process of a written run directory; not in --help
    p.add_argument("run_dir")
    sub.add_parser("calibrate", help="time real steps of the real model here; plans on this machine take its figures")
    p = sub.add_parser("doctor", help="versions, MPS settings, and the memory model against measured steps")
    p.add_argument("--hardware")
    p.add_argument("--model", help="a local model directory (default: a freshly built tiny model)")
    p = sub.add_parser("demo", help="SFT, DPO, fooDPO on a real small model, offline; prints a table and chats")
    p.add_argument("--hardware")
    sub.metavar = "{" + ",".join(name for name in sub.choices if name != "rank") + "}"
    return parser


def _add_run_folder_commands(sub) -> None:
    """chat, eval and export: what reads a written run folder."""
    p = sub.add_parser("chat", help="chat with a run's adapter (default: the newest run) through LLaMA-Factory, "
                       "or with a GGUF file through llama.cpp")  # fmt: skip
    p.add_argument("run_dir", nargs="?", help="a run folder, or FILE.gguf")
    p.add_argument("--prompt", help="answer this once and exit (else a loop on standard input)")
    p.add_argument("--max-new-tokens", type=_positive_int, default=256)
    p.add_argument("--temperature", type=_temperature, help="0: always the likeliest token (default: the "
                   "engine's sampling)")  # fmt: skip
    p.add_argument("--base", action="store_true", help="the run's base model without its adapter, to compare")
    _allow_unfinished(p)
    p = sub.add_parser("serve", help="an OpenAI-compatible endpoint on 127.0.0.1 through llama.cpp, for a GGUF "
                       "file or a run (exported to a temporary q8_0 file)")  # fmt: skip
    p.add_argument("source", help="FILE.gguf or a run folder")
    p.add_argument("--port", type=_port, default=8080, help="default: 8080")
    _allow_unfinished(p)
    p = sub.add_parser("eval", help="held-out preference accuracy and reward margin of runs against the base model")
    p.add_argument("run_dirs", nargs="+")
    p.add_argument("--dataset", help="data to judge on (default: the run's own eval_dataset; SFT by its loss)")
    p.add_argument("--dataset-dir", help="the folder with its dataset_info.json (default: the run's)")
    _allow_unfinished(p)
    p = sub.add_parser("export", help="merge a run's LoRA into a standalone Hugging Face model folder, or a GGUF file")
    p.add_argument("run_dir", nargs="?")
    p.add_argument("-o", "--output", required=True, help="a new (or empty) folder")
    p.add_argument("--gguf", metavar="TYPE", help="a GGUF file for llama.cpp, LM Studio and Ollama, and its "
                   "Modelfile: f16, bf16, q8_0, q5_1, q5_0, q4_1 or q4_0")  # fmt: skip
    p.add_argument("--base", action="store_true", help="with --gguf: the run's base model without its adapter")
    _allow_unfinished(p)


def _add_model_commands(sub) -> None:
    """tiny-model and get-model: what makes a model folder."""
    p = sub.add_parser("tiny-model", help="build the offline demo model (random weights) into DIR")
    p.add_argument("directory", nargs="?", help="default: where the tiny preset looks (once; kept after)")
    p.add_argument("--data", help="folder with the demo datasets (default: data/)")
    p = sub.add_parser("get-model", help="fetch a real model once (a model preset's fetch:), or convert a GGUF file")
    p.add_argument("source", help="a model preset with fetch: (smollm2-135m), or FILE.gguf")
    p.add_argument("-o", "--output", help="default: the preset's model_name_or_path; beside a .gguf file, its name")


def _go_on_in_a_fresh_process(run_dir) -> NoReturn:
    """After an out-of-memory rung this process becomes `mpskit train --resume RUN`: the same process
    (a waiting shell, caffeinate -w and the lock note's number stay right) with nothing of the failed
    attempt left in the device or the heap. What an exit runs (temporary folders go) runs first."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    atexit._run_exitfuncs()  # os.execv runs no atexit handler itself
    # a signal in the moment of the exec waits, blocked, until the new process's guard can record it
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    command = mpskit_command("train", "--resume", str(run_dir))
    os.execv(command[0], command)


def main(argv: list[str] | None = None) -> int:
    """The command line; a Ctrl-C at any moment, even while a summary or an error line prints, is one line."""
    command_line = argv is None
    words = [word for word in sys.argv[1:] if word not in ("-v", "--verbose")]
    if command_line and words[:1] in (["train"], ["rank"]):
        leave_after_python_exit()  # a run's process: no C library's exit in its peak (process_exit.py)
    code = None
    try:
        code = _main(argv)
    except KeyboardInterrupt:
        print("\nmpskit: interrupted", file=sys.stderr)
        code = 130
    finally:
        if command_line:  # the command line's own process: its exit need not walk the libraries' objects
            before_exit()
            exit_code_is(code)
    return code


HANDLERS = {
    "detect": cmd_detect,
    "env": cmd_env,
    "ls": cmd_ls,
    "chat": cmd_chat,
    "serve": cmd_serve,
    "export": cmd_export,
    "eval": cmd_eval,
    "tiny-model": cmd_tiny_model,
    "get-model": cmd_get_model,
    "demo": cmd_demo,
    "doctor": cmd_doctor,
    "calibrate": cmd_calibrate,
    "rank": cmd_rank,
    "compare": cmd_compare,
}


def _main(argv: list[str] | None) -> int:
    if argv is None:  # the command line: a SIGTERM unwinds, so temporary folders go (temporary.py)
        install_sigterm_exit()
        argv = sys.argv[1:]
    if "-v" in argv or "--verbose" in argv:  # any command; the libraries read it where they run
        os.environ[VERBOSE_VARIABLE] = "1"
        argv = [word for word in argv if word not in ("-v", "--verbose")]
    run_commands = {"plan": cmd_plan, "config": cmd_config, "train": cmd_train}
    if argv[:1] and argv[0] in run_commands and any(w in ("-h", "--help") for w in argv[1:]):
        print("usage: " + usage_run())
        return 0
    try:
        if argv[:1] and argv[0] in run_commands:  # argparse cannot pass `--stage foodpo` words through
            return run_commands[argv[0]](argv[1:])
        ns = build_parser().parse_args(argv)
        return HANDLERS[ns.command](ns)
    except MpskitError as err:
        print(f"mpskit: error: {err}", file=sys.stderr)
        return err.exit_code
    except NextRung as rung:
        _go_on_in_a_fresh_process(rung.run_dir)
    except Interrupted as stop:
        if stop.checkpoint:
            where = f"stopped; the newest complete checkpoint is {stop.checkpoint.name}; resume with"
        else:
            where = "stopped before any checkpoint was saved; start it again with"
        print(f"mpskit: {where}: mpskit train --resume {stop.run_dir}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `mpskit ls | head`: the reader stopped reading; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # what a shell reports for a writer stopped by SIGPIPE
    except Exception as err:  # noqa: BLE001 - a library's error outside a training run (chat, eval, export...)
        from mpskit.run.boundary import keep_traceback, one_line

        keep_traceback(err, None)  # on stderr with -v
        print(f"mpskit: error: {one_line(err)[0]}; rerun with -v for the whole traceback", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
