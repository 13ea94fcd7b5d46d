"""What `config`, `plan` and `train` share before they part: the run their words describe."""

from __future__ import annotations

from mpskit.errors import warn


def resolve_from_words(words: list[str], typed: bool = True):
    """The run the words describe, and -o's file. `typed`: word values typed as llamafactory-cli types
    them (lf.typed_words); `plan` reads them as YAML scalars, which gives the same numbers."""
    from mpskit.settings.resolve import resolve
    from mpskit.settings.run_words import read_run_words

    given = read_run_words(words)
    if typed and given.word_texts:
        from mpskit.engine import lf

        given.values.update(lf.typed_words(given.word_texts))
    return resolve(given.values, hardware=given.hardware, run_file=bool(given.run_file)), given.output


def note_device_problems(run) -> None:
    """`config` and `plan` write and plan options the run's device cannot run, with a note; `train`
    refuses them there (checks.check_device)."""
    from mpskit.settings.quantization import device_problems
    from mpskit.settings.resolve import cuda_only

    for problem in cuda_only(run.args, run.device):
        warn(f"{problem}: this config is for a CUDA machine")
    for problem, fix in device_problems(run.args, run.device, run.hardware):
        warn(f"{problem} ({fix})")
