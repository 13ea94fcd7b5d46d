"""`python -m mpskit.cli ...` without paying for the import of torch, transformers, peft, trl and
LLaMA-Factory in every test.

A forkserver (multiprocessing's) imports those libraries once, before any run, and forks one child
per command. The child is a process of its own, as a fresh interpreter would be: it takes the
command's working folder, environment, arguments and standard streams, runs `mpskit.cli` as
`python -m` does, and its exit code is the command's. The libraries hold no state from a run, since
the server imported them and ran nothing; every run still trains through the real LLaMA-Factory.
What a child shares with its siblings, unlike fresh interpreters: the string-hash seed and what the
libraries read from the environment as they were imported (huggingface_hub's HF_* settings, say; the
tests set those once, for all). Tests about processes
themselves (signals, kills, a full disk mid-run, a terminal, the import of torch) start their own
interpreter with subprocess.

Where CUDA is available each command runs in a fresh interpreter instead: the preloaded libraries
initialise CUDA as they are imported there, and a process forked after that cannot use CUDA ("Cannot
re-initialize CUDA in forked subprocess").
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path

from mpskit.machine.hardware import nvidia_gpus

# LLaMA-Factory's training entry imports torch, transformers, peft, trl, datasets and accelerate in its
# own order (trl imported before it cannot import its DPOTrainer any more).
PRELOAD = ["llamafactory.train.tuner", "faults"]  # then the tests' faults (plugins/faults.py), into mpskit's lf.run
_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload(PRELOAD)
FRESH_INTERPRETERS = bool(nvidia_gpus())  # asked of nvidia-smi: the test process imports no torch to collect


def _exit_code(stop: SystemExit) -> int:
    """What the interpreter makes of sys.exit(value)."""
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code
    print(stop.code, file=sys.stderr)
    return 1


def _as_main_process() -> None:
    """multiprocessing as a fresh interpreter has it: this process is the main one ("MainProcess", no
    parent; transformers' collators seed by it) and new processes start by the default method (the
    forkserver's "forkserver" would refuse a DataLoader worker's local functions)."""
    process = multiprocessing.current_process()
    process._name, process._identity, process._parent_pid, process._parent_name = "MainProcess", (), None, None
    multiprocessing.process._parent_process = None
    multiprocessing.set_start_method(None, force=True)


def _run_child(module: str, words: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """In the forked child: become `python -m MODULE WORDS` run in `cwd` with `env`."""
    for path, fd in ((out, 1), (err, 2)):
        file = os.open(path, os.O_WRONLY)
        os.dup2(file, fd)
        os.close(file)
    _as_main_process()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # the libraries' import asked for it: read TMPDIR again, as a new process does
    sys.path.insert(0, cwd)  # as `python -m` puts the working folder first
    sys.argv = ["-m", *words]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as stop:
        code = _exit_code(stop)
    except BaseException:
        traceback.print_exc()
        code = 1
    threading._shutdown()  # what the interpreter does at exit: wait for threads, then atexit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def run(module: str, words: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """`python -m MODULE WORDS` in a forked warm child, as subprocess.run(capture_output=True, text=True)
    reports a command; subprocess.TimeoutExpired after `timeout` seconds (the child killed)."""
    command = [sys.executable, "-m", module, *words]
    if FRESH_INTERPRETERS:
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="mpskit-warm-") as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        out.touch()
        err.touch()
        child = _context.Process(target=_run_child, args=(module, words, str(cwd), env, str(out), str(err)))
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired(words, timeout, out.read_text(), err.read_text())
        return subprocess.CompletedProcess(command, child.exitcode, out.read_text(), err.read_text())
