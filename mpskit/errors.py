"""The error types users see: a problem and its fix, printed as one line with exit code 2 (1 for a run
that failed after it began training), and the one line for a value that is not the number it must be."""

import math


class MpskitError(Exception):
    """A user-facing error. The message names the problem and the fix, in one line."""

    exit_code = 2

    def __init__(self, problem: str, fix: str):
        super().__init__(f"{problem}; {fix}")
        self.problem = problem
        self.fix = fix


class RunFailed(MpskitError):
    """A run that failed after it began training: its summary is printed, then this line, exit 1."""

    exit_code = 1


class Interrupted(Exception):
    """Training stopped by a signal (after saving a checkpoint, when it could); the CLI prints the
    resume command."""

    def __init__(self, run_dir, checkpoint, at_step_end: bool = False):
        super().__init__(f"interrupted: {run_dir}")
        self.run_dir = run_dir
        self.checkpoint = checkpoint
        self.at_step_end = at_step_end  # a stop at the end of a step, which every process of the run took


class SignalExit(SystemExit):
    """SIGTERM or SIGHUP outside a training attempt's guard: an exit that unwinds (temporary.py), with
    the signal's name, so that a run folder made before the guard can record the stop."""

    def __init__(self, signum: int) -> None:
        import signal

        super().__init__(128 + signum)
        self.signal_name = signal.Signals(signum).name


class NextRung(Exception):  # noqa: N818 - a hand-over, not an error
    """An out-of-memory rung is recorded; the run goes on in a fresh process (the command line execs
    `mpskit train --resume RUN`), which starts with the device and the heap whole."""

    def __init__(self, run_dir):
        super().__init__(f"next rung: {run_dir}")
        self.run_dir = run_dir


def warn(message: str) -> None:
    """One-line warning on stderr (no logging setup needed, no torch import)."""
    import sys

    print(f"mpskit: warning: {message}", file=sys.stderr)


def _describe(kind: str, low, high) -> str:
    if kind == "positive":
        return f"a finite number above {low:g}" + (f" and at most {high:g}" if high is not None else "")
    what = "a whole number" if kind == "int" else "a finite number"
    return f"{what} from {low} to {high}" if high is not None else f"{what} of at least {low}"


def in_range(value, kind: str, low, high=None) -> bool:
    """A finite number of that kind within [low, high] ("positive": above low)."""
    is_number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ok = is_number and (kind != "int" or isinstance(value, int))
    return ok and (value > low if kind == "positive" else value >= low) and (high is None or value <= high)


def check_number(where: str, value, kind: str, low, high=None, fix: str = "set it to such a value") -> None:
    """One line naming `where` (a key, or a profile's field) when `value` is not such a number."""
    if not in_range(value, kind, low, high):
        raise MpskitError(f"{where}={value!r} is not {_describe(kind, low, high)}", fix)
