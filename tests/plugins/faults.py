"""Test-only faults, injected where mpskit hands its callbacks to LLaMA-Factory (`lf.run`): out of
memory, a full disk and a kill at a chosen step (and a kill before a filled folder moves into place),
asked for by the test's environment. Nothing in mpskit/ knows of them. Every interpreter the tests
start loads this module (sitecustomize.py here, with this folder on PYTHONPATH; tests/warm.py preloads
it in its server), and so does the test process itself (conftest.py).

- MPSKIT_FAKE_OOM_AT_STEP=N: MPS's out-of-memory error during step N, in a run's first attempt only
  (the next one is the recovery), so the fallback ladder and its resume run end to end on a CPU;
- MPSKIT_FAKE_FULL_DISK_AT_STEP=N: the checkpoint save of step N cut short the way a full disk cuts it
  (a partial file in .saving/, then ENOSPC), in the first attempt only;
- MPSKIT_FAKE_KILL_AFTER_SAVE_AT_STEP=N: SIGKILL as soon as the checkpoint of step N is saved, in
  whichever attempt reaches it;
- MPSKIT_FAKE_KILL_RANK_AT_START=N: SIGKILL to rank N of several processes as its attempt starts, before
  the model and the data load (the other ranks then wait for it in their first collective);
- MPSKIT_FAKE_KILL_BEFORE_MOVE=1: SIGKILL once a folder a command fills (export, tiny-model, get-model)
  is whole under its hidden name, before it moves into place (output_folder.move_into_place);
- MPSKIT_FAKE_KILL_IN_GGUF=N: SIGKILL once N tensors of a GGUF file are written, mid-file (read as the
  interpreter starts: the writer is imported only then);
- MPSKIT_FAKE_SIGNAL_AFTER_RUN_FOLDER=SIGHUP (or another): that signal as soon as `mpskit train` has
  written its run folder, before the attempt's guard (read as the interpreter starts);
- MPSKIT_FAKE_SIGNAL_AFTER_SUMMARY=SIGTERM: that signal once the run's summary is printed;
- MPSKIT_FAKE_SIGNAL_IN_HASHING=SIGTERM: that signal as `datasets` first hashes a transform inside a
  training attempt, within its bare `except:` (read as the interpreter starts).
"""

from __future__ import annotations

import errno
import functools
import json
import os
import signal
from collections.abc import Mapping
from pathlib import Path

OOM_VARIABLE = "MPSKIT_FAKE_OOM_AT_STEP"
FULL_DISK_VARIABLE = "MPSKIT_FAKE_FULL_DISK_AT_STEP"
KILL_VARIABLE = "MPSKIT_FAKE_KILL_AFTER_SAVE_AT_STEP"
RANK_KILL_VARIABLE = "MPSKIT_FAKE_KILL_RANK_AT_START"
MOVE_KILL_VARIABLE = "MPSKIT_FAKE_KILL_BEFORE_MOVE"
GGUF_KILL_VARIABLE = "MPSKIT_FAKE_KILL_IN_GGUF"
SIGNAL_AFTER_FOLDER_VARIABLE = "MPSKIT_FAKE_SIGNAL_AFTER_RUN_FOLDER"
SIGNAL_AFTER_SUMMARY_VARIABLE = "MPSKIT_FAKE_SIGNAL_AFTER_SUMMARY"
SIGNAL_IN_HASHING_VARIABLE = "MPSKIT_FAKE_SIGNAL_IN_HASHING"


def synthetic_error(step: int) -> RuntimeError:
    """What MPS raises when it runs out of memory (mpskit's run/oom.py reads its figures)."""
    return RuntimeError(
        "MPS backend out of memory (MPS allocated: 8.93 GB, other allocations: 1.53 GB, max allowed: 12.48 GB). "
        f"Tried to allocate 256.00 MB on private pool. (synthetic, raised by {OOM_VARIABLE} at step {step})"
    )


@functools.cache
def fault_callbacks() -> dict[str, type]:
    """The faults as transformers' callbacks, defined on first use: the test process imports this module
    as it starts (`make test-fast` collects without importing torch or transformers)."""
    from transformers import TrainerCallback

    class FakeOutOfMemory(TrainerCallback):
        def __init__(self, step: int) -> None:
            self.step = step

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step + 1 == self.step:
                raise synthetic_error(self.step)
            return control

    class FakeFullDisk(TrainerCallback):
        def __init__(self, step: int) -> None:
            self.step = step

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == self.step:
                partial = os.path.join(args.output_dir, ".saving", f"checkpoint-{self.step}")
                os.makedirs(partial, exist_ok=True)
                with open(os.path.join(partial, "adapter_model.safetensors"), "wb") as file:
                    file.write(b"\0" * 64)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), partial)
            return control

    class FakeKill(TrainerCallback):
        """At the last step: the moment between the last checkpoint and the record of the end."""

        def __init__(self, step: int) -> None:
            self.step = step

        def on_save(self, args, state, control, **kwargs):
            if state.global_step == self.step:
                os.kill(os.getpid(), signal.SIGKILL)
            return control

    return {OOM_VARIABLE: FakeOutOfMemory, FULL_DISK_VARIABLE: FakeFullDisk, KILL_VARIABLE: FakeKill}


_attempts_here = 0  # training attempts this process has started


def faults_for(args: Mapping) -> list:
    """The faults the environment asks for, for the attempt about to train with ARGS."""
    global _attempts_here
    _attempts_here += 1
    record = Path(args["output_dir"]) / "mpskit.json"
    first = _attempts_here == 1 and not (record.is_file() and json.loads(record.read_text())["attempts"])
    names = (OOM_VARIABLE, FULL_DISK_VARIABLE, KILL_VARIABLE) if first else (KILL_VARIABLE,)
    return [fault_callbacks()[name](int(os.environ[name])) for name in names if os.environ.get(name)]


def install() -> None:
    """mpskit's `lf.run` with the faults added to the callbacks it is given, and output_folder's move
    with its kill (once per process)."""
    from mpskit.engine import lf

    if getattr(lf.run, "with_faults", False):
        return
    plain = lf.run

    def run_with_faults(spec, callbacks: list | None = None) -> tuple[dict, dict, dict]:
        if os.environ.get(RANK_KILL_VARIABLE) == os.environ.get("RANK", ""):
            os.kill(os.getpid(), signal.SIGKILL)
        if os.environ.get(SIGNAL_IN_HASHING_VARIABLE):
            _signal_while_datasets_hashes(getattr(signal, os.environ[SIGNAL_IN_HASHING_VARIABLE]))
        return plain(spec, callbacks=[*(callbacks or []), *faults_for(spec.args)])

    run_with_faults.with_faults = True
    lf.run = run_with_faults

    from mpskit import output_folder

    plain_move = output_folder.move_into_place

    def move_or_die(*args) -> None:  # the environment is read when it runs: warm children set it late
        if os.environ.get(MOVE_KILL_VARIABLE):
            os.kill(os.getpid(), signal.SIGKILL)
        plain_move(*args)

    output_folder.move_into_place = move_or_die

    if os.environ.get(SIGNAL_AFTER_FOLDER_VARIABLE):  # asked for at the start: the test starts its own interpreter
        _signal_after_the_run_folder(getattr(signal, os.environ[SIGNAL_AFTER_FOLDER_VARIABLE]))
    if os.environ.get(SIGNAL_AFTER_SUMMARY_VARIABLE):
        _signal_after_the_summary(getattr(signal, os.environ[SIGNAL_AFTER_SUMMARY_VARIABLE]))
    if not os.environ.get(GGUF_KILL_VARIABLE):
        return
    from mpskit.export import gguf_file

    plain_tofile = gguf_file._Streamed.tofile
    written = []

    def tofile_or_die(self, file) -> None:
        plain_tofile(self, file)
        written.append(self.tensor.name)
        if len(written) == int(os.environ.get(GGUF_KILL_VARIABLE) or 0):
            file.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    gguf_file._Streamed.tofile = tofile_or_die


def _signal_after_the_run_folder(number: int) -> None:
    """NUMBER to this process as soon as `mpskit train` has written its run folder, before the attempt."""
    from mpskit.recipes import train

    plain = train.write_run_dir

    def write_then_signal(*args, **kwargs):
        made = plain(*args, **kwargs)
        os.kill(os.getpid(), number)
        return made

    train.write_run_dir = write_then_signal


def _signal_after_the_summary(number: int) -> None:
    """NUMBER to this process once the run's summary is printed, as the process ends."""
    from mpskit.recipes import train

    plain = train._print_summary

    def print_then_signal(path) -> None:
        plain(path)
        os.kill(os.getpid(), number)

    train._print_summary = print_then_signal


install()


def _signal_while_datasets_hashes(number: int) -> None:
    """The signal once, as `datasets` hashes a transform for its cache: inside `update_fingerprint`'s
    bare `except:`, which swallows whatever the handler raises there."""
    from datasets.fingerprint import Hasher

    plain = Hasher.update

    def update(self, value) -> None:
        if callable(value) and not getattr(Hasher, "signalled", False):
            Hasher.signalled = True
            os.kill(os.getpid(), number)  # its handler runs at the next line of Python: within the `try`
        plain(self, value)

    Hasher.update = update
