"""The error types users see: a problem and its fix, printed as one line with exit code 2 (1 for a run
that failed after it began training)."""


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

    def __init__(self, run_dir, checkpoint):
        super().__init__(f"interrupted: {run_dir}")
        self.run_dir = run_dir
        self.checkpoint = checkpoint


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
