"""Phase timing of every Python process of a test run, for bench/test_suite.py (only where
$SUITE_TIMING_DIR is set): the import of the heavy libraries, model loading (from_pretrained),
Trainer.train (and the trainer classes that ran it), and the process's whole wall time, as one JSON
file per process at its exit. A child forked from a process that has already imported the libraries
starts its own figures at zero."""

import atexit
import builtins
import json
import os
import sys
import time

HEAVY = ("torch", "transformers", "peft", "trl", "llamafactory", "datasets", "accelerate")
FOLDER = os.environ.get("SUITE_TIMING_DIR")
_figures = {}
_depth = [0]  # inside a timed call: calls within it are not timed again


def _start(forked: bool = False) -> None:
    _figures.update(start=time.time(), import_s=0.0, load_s=0.0, train_s=0.0, forked=forked, trainers=[])


def _timed(kind: str, function):
    def timed(*args, **kwargs):
        if _depth[0]:
            return function(*args, **kwargs)
        _depth[0] += 1
        began = time.time()
        try:
            return function(*args, **kwargs)
        finally:
            _figures[kind] += time.time() - began
            _depth[0] -= 1

    return timed


def _time_model_load_and_training() -> None:
    from transformers import Trainer, modeling_utils

    load = modeling_utils.PreTrainedModel.from_pretrained.__func__
    modeling_utils.PreTrainedModel.from_pretrained = classmethod(_timed("load_s", load))
    train = _timed("train_s", Trainer.train)

    def named_train(self, *args, **kwargs):  # which trainer trained: LLaMA-Factory's, or mpskit's subclass
        _figures["trainers"].append(f"{type(self).__module__}.{type(self).__qualname__}")
        return train(self, *args, **kwargs)

    Trainer.train = named_train


def _write() -> None:
    # multiprocessing's helpers idle between runs (the forkserver of the tests' warm runner, its resource
    # tracker): what they cost is their import
    helper = any(f"multiprocessing.{name}" in sys.modules for name in ("forkserver", "resource_tracker"))
    server = sys.argv == ["-c"] and helper and "pytest" not in sys.modules
    wall = _figures["import_s"] if server and not _figures["forked"] else time.time() - _figures["start"]
    test = os.environ.get("PYTEST_CURRENT_TEST", "")
    figures = dict(_figures, wall_s=wall, pid=os.getpid(), argv=sys.argv, test=test)
    try:
        with open(os.path.join(FOLDER, f"{os.getpid()}-{time.time_ns()}.json"), "w") as file:
            json.dump(figures, file)
    except OSError:
        pass


if FOLDER:
    _start()
    _real_import = builtins.__import__
    _patched = []

    def _import(name, globals=None, locals=None, fromlist=(), level=0):
        if _depth[0] or level or name.split(".")[0] not in HEAVY or (name in sys.modules and not fromlist):
            return _real_import(name, globals, locals, fromlist, level)
        module = _timed("import_s", _real_import)(name, globals, locals, fromlist, level)
        if not _patched and "transformers.trainer" in sys.modules:
            _patched.append(True)
            _time_model_load_and_training()
        return module

    builtins.__import__ = _import
    os.register_at_fork(after_in_child=lambda: _start(forked=True))
    atexit.register(_write)
