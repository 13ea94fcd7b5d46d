"""SIGINT, SIGTERM and SIGHUP (a closed terminal) during one training attempt. No torch import: the
guard is in place before torch, transformers and LLaMA-Factory load, so a signal at any moment ends with a record.

While training, the first signal asks for a checkpoint at the end of the current step and a stop
(callbacks.StopOnSignal carries that to the trainer). Before training begins (the imports, the model
loading: nothing to save), after it, or a second time, the signal stops the attempt at once by
raising Stopped; a save it cuts off stays in .saving/ and is never taken for a checkpoint. Once the
attempt's end is being recorded (finished, stopped or failed), a signal only notes itself, to the end
of the process: the record says what happened, and an exit raised inside a library's finalizer would
only print a traceback.
"""

from __future__ import annotations

import signal
import sys

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    """A signal that stops the attempt at once. A BaseException, like KeyboardInterrupt, so that no
    `except Exception` in the libraries swallows it."""

    def __init__(self, signal_name: str, when: str) -> None:
        super().__init__(f"{signal_name} {when}")
        self.signal_name = signal_name
        self.when = when


class SignalGuard:
    """A context manager for one attempt; `phase` is set by the trainer's callbacks."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.phase = "before training began"
        self.ending = False  # the attempt's end is being recorded: signals only note themselves from then on
        self._previous: dict[int, object] = {}

    def __enter__(self) -> SignalGuard:
        for number in STOP_SIGNALS:
            self._previous[number] = signal.signal(number, self._handle)
        return self

    def deliver_held(self) -> None:
        """One that came while the out-of-memory re-exec blocked them (cli.py) is delivered here, inside
        the attempt, and recorded as its stop."""
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    def __exit__(self, *exc) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, note_only if self.ending else handler)

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.ending:
            note_only(signum, frame)
            return
        if self.phase != "training":
            self.signal_name = self.signal_name or name  # a library's bare `except:` may swallow the raise
            raise Stopped(name, self.phase)
        if self.signal_name:
            raise Stopped(name, "a second time, while stopping")
        self.signal_name = name
        print(f"\nmpskit: {name}: saving a checkpoint at the end of this step (again: stop at once)", file=sys.stderr)


class Held:
    """Within: a stop signal is kept, not acted on (signal_name: the first one's), so that what is being
    written is whole first; the one who asked acts on it after."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> Held:
        for number in STOP_SIGNALS:
            self._previous[number] = signal.signal(number, self._keep)
        return self

    def __exit__(self, *exc) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)

    def _keep(self, signum, frame) -> None:
        self.signal_name = self.signal_name or signal.Signals(signum).name


def note_only(signum, frame) -> None:
    name = signal.Signals(signum).name
    print(f"mpskit: {name} came as the run's end was recorded; it ends as recorded", file=sys.stderr)
