"""`mpskit config`: the LLaMA-Factory YAML a run would train with, on stdout or into -o's file, after
every check `train` makes that needs no weights."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from mpskit.errors import warn
from mpskit.recipes.from_words import note_device_problems, resolve_from_words


def write_config(words: list[str]) -> int:
    from mpskit.datasets.plain_data import registration_folder
    from mpskit.engine import lf
    from mpskit.files import check_file_target
    from mpskit.machine.optional_packages import missing_packages
    from mpskit.recipes.changes import say_changes
    from mpskit.recipes.checks import prepare
    from mpskit.rundir.folder import new_run_dir

    force = "--force" in words
    run, output = resolve_from_words([word for word in words if word != "--force"])
    note_device_problems(run)
    if output:
        check_file_target(Path(output), force)
    run, _ = prepare(run, need_weights=False)
    lf.check_keys(run.args, lf.key_names())
    lf.check_template(run.args)  # the rows through LLaMA-Factory's converter: at `mpskit train` (it imports torch)
    for problem, fix in missing_packages(run.args):  # a config may be written for another machine
        warn(f"{problem} here ({fix})")
    args = dict(run.args)
    if run.datasets:  # the checks' registration goes at exit: the YAML names one that stays
        args["dataset_dir"] = str(registration_folder(run.datasets, run.data_files, keep=True))
        warn(f"dataset_dir {args['dataset_dir']} registers the plain data files for this YAML (delete it when "
             "done); mpskit train registers them in the run folder itself")  # fmt: skip
    args.setdefault("output_dir", str(new_run_dir(run.run_name, run.args.get("output_dir"))))
    say_changes(run, args)
    if output:
        _write(args, run, Path(output), force)
    else:
        print(lf.yaml_text(args), end="")
    return 0


def _write(args: dict, run, output: Path, force: bool) -> None:
    """The YAML written to OUTPUT, one writer at a time; mpskit's own keys, which llamafactory-cli would
    refuse in the file, are said to be given again."""
    from mpskit.engine import lf
    from mpskit.files import cannot_write, check_file_target, writing
    from mpskit.settings.knobs import OWN_KEYS

    with writing(output, "-o", "mpskit config"):
        check_file_target(output, force)  # again, under the lock: another writer may have been first
        try:
            lf.write_yaml(args, output)
        except OSError as err:
            raise cannot_write(output, err, "-o") from None
    print(f"mpskit: wrote {output}", file=sys.stderr)
    own = [f"{key}={str(args[key]).lower()}" for key in OWN_KEYS if key in run.pinned and key in args]
    own += [f"{f.name}={str(getattr(run.settings, f.name)).lower()}" for f in dataclasses.fields(run.settings)
            if getattr(run.settings, f.name) != f.default]  # fmt: skip
    if own:
        words = " ".join(own)
        warn(f"{words}: mpskit's own keys, not in {output}; give them again: mpskit train {output} {words}")
