"""What the libraries print, kept off the terminal unless asked for.

transformers and LLaMA-Factory log every loaded config at INFO, print a tokenised training example
and a metrics block, and draw progress bars; mpskit's own progress line says what a user follows.
By default they show their warnings only; `-v` (MPSKIT_VERBOSE=1) gives everything back. Where a run
folder is given, everything they log or print is also written to its train.log, verbose or not.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

VERBOSE_VARIABLE = "MPSKIT_VERBOSE"
LIBRARIES = ("llamafactory", "transformers", "datasets", "accelerate", "peft", "trl", "huggingface_hub")
LOG_FILE = "train.log"
# Warnings that ask nothing of the user (train.log keeps them): fp32 is mpskit's choice where mixed
# precision is slower or absent; upcast_layernorm is LLaMA-Factory's advice to every quantized run, a
# setting the user may give; LLaMA-Factory passes transformers' old `torch_dtype`; the tokenizer's
# special tokens are copied into the model's config, as they should be; a row longer than the model's
# maximum is cut at cutoff_len (the plan says how many rows are); the converter's line for each row it
# skips (mpskit's own line counts them, and why).
NOISE = ("We recommend enable mixed precision training", "We recommend enable `upcast_layernorm`",
         "`torch_dtype` is deprecated", "The tokenizer has new PAD/BOS/EOS tokens",
         "Token indices sequence length is longer than", "Invalid role tag in", "Invalid message count in",
         "Skipping this abnormal example", "Dropped invalid example")  # fmt: skip
# Python warnings of the same kind, off the screen (not kept): trl's own deprecation inside
# LLaMA-Factory's DPO trainer, and torch's as DeepSpeed is imported (accelerate imports it wherever it is
# installed).
WARNINGS_NOISE = ("The `padding_value` property is deprecated", "`torch.jit.script` is deprecated",
                  # DeepSpeed's collectives, at every step of a ZeRO run
                  "`torch.distributed.all_gather_into_tensor` is deprecated",
                  "`torch.distributed.reduce_scatter_tensor` is deprecated")  # fmt: skip


def _not_noise(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(NOISE)


def is_verbose() -> bool:
    return os.environ.get(VERBOSE_VARIABLE, "") not in ("", "0")


class _Tee(io.TextIOBase):
    """A stream that writes to several (the terminal and the log file). A text stream of io's, so a
    library that asks it what streams answer (isatty, fileno, encoding) gets a stream's answer: not a
    terminal, no file descriptor."""

    def __init__(self, *streams: TextIO) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


class _Screen(io.TextIOBase):
    """A training process's stdout or stderr: once its reader has gone (EPIPE: a closed pipe, a parent
    that stopped reading; EIO: a closed terminal), what follows goes to os.devnull and the run goes on.
    A progress or signal line that cannot be shown never ends a run; train.log still has it."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        try:
            self.stream.write(text)
        except OSError:
            self._gone()
        return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError:
            self._gone()

    def _gone(self) -> None:
        """Its descriptor points at os.devnull from now on: the text left in the buffer and every later
        write (the interpreter's own at exit too) go there."""
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self.stream.fileno())
        os.close(devnull)

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return self.stream.isatty()

    @property
    def encoding(self) -> str:
        return self.stream.encoding


def keep_running_without_a_screen() -> None:
    """From now on a reader that goes away cannot end this process (see _Screen)."""
    sys.stdout, sys.stderr = _Screen(sys.stdout), _Screen(sys.stderr)


class _LogFileHandler(logging.StreamHandler):
    """train.log's handler: a line it cannot write (a full disk) is lost quietly, where logging would
    print a traceback; the run itself stops with the disk's own one-line error."""

    def handleError(self, record: logging.LogRecord) -> None:
        pass


@contextlib.contextmanager
def library_output(log_dir: Path | None = None, keep_progress_bar: bool = False) -> Iterator[TextIO | None]:
    """Within: the libraries' log lines on stderr, their warnings only unless verbose; what they print
    (LLaMA-Factory's tokenised example, transformers' metrics block) off stdout, which stays for
    mpskit's own output. With `log_dir`, all of it also goes to its LOG_FILE. `keep_progress_bar`: the
    user asked for transformers' bar (`disable_tqdm: false`), so it stays (the log dicts it prints
    under it go where prints go).
    Yields the open log file (None without `log_dir`), for mpskit's own lines."""
    from mpskit.engine.quantized import import_bitsandbytes

    import_bitsandbytes()  # before the libraries that import it, so that its import says nothing
    from llamafactory.extras import logging as lf_logging
    from transformers.utils import logging as hf_logging

    verbose = is_verbose()
    hf_logging.get_logger(), lf_logging.get_logger()  # each library's own handler is set up
    loggers = [logging.getLogger(name) for name in LIBRARIES]
    handlers = [handler for logger in loggers for handler in logger.handlers if type(handler) is logging.StreamHandler]
    with contextlib.ExitStack() as stack:
        log_file = stack.enter_context(open(log_dir / LOG_FILE, "a", encoding="utf-8")) if log_dir else None
        for handler in handlers:
            handler.setStream(sys.stderr)  # on stderr from now on: stdout is mpskit's
        if log_file:
            stack.enter_context(_also_into(log_file, loggers))
        if not verbose:
            stack.enter_context(_warnings_only(handlers, keep_progress_bar))
        terminal = sys.stderr if verbose else None
        printed = [stream for stream in (terminal, log_file) if stream] or [stack.enter_context(open(os.devnull, "w"))]
        stack.enter_context(contextlib.redirect_stdout(_Tee(*printed)))
        yield log_file


@contextlib.contextmanager
def _also_into(log_file: TextIO, loggers: list[logging.Logger]) -> Iterator[None]:
    """Within: every line the libraries log, INFO and up, also goes into LOG_FILE."""
    file_handler = _LogFileHandler(log_file)
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for logger in loggers:
        logger.addHandler(file_handler)
    for name in ("transformers", "llamafactory"):
        logging.getLogger(name).setLevel(logging.INFO)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeHandler(file_handler)


@contextlib.contextmanager
def _warnings_only(handlers: list[logging.Handler], keep_progress_bar: bool) -> Iterator[None]:
    """Within: the libraries' handlers on screen pass warnings only, without the known noise; no
    progress bars (the trainer's stays when asked for)."""
    import datasets
    from transformers.utils import logging as hf_logging

    from mpskit.engine import bends

    saved = [(handler, handler.level) for handler in handlers]
    for handler in handlers:
        handler.setLevel(logging.WARNING)
        handler.addFilter(_not_noise)
    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    with contextlib.ExitStack() as stack:
        if not keep_progress_bar:
            stack.enter_context(bends.silent_trainer())
        stack.enter_context(warnings.catch_warnings())
        for message in WARNINGS_NOISE:
            warnings.filterwarnings("ignore", message=re.escape(message))
        try:
            yield
        finally:
            for handler, level in saved:
                handler.setLevel(level)
                handler.removeFilter(_not_noise)
            hf_logging.enable_progress_bar()
            datasets.enable_progress_bars()


def log_lines(log_dir: Path, lines: list[str]) -> None:
    """mpskit's own lines, added to the run's train.log beside what the libraries wrote; a log that
    cannot be written (a full disk) loses them, and nothing else."""
    with contextlib.suppress(OSError), open(log_dir / LOG_FILE, "a", encoding="utf-8") as file:
        file.writelines(line + "\n" for line in lines)
