"""`python -m road WORDS`: one `mpskit train WORDS` with the engine stubbed, counting the road it takes.

The stub stands for LLaMA-Factory's run and writes what a finished run leaves (results, trainer state,
log), so everything around the engine runs as it does for real: resolve, checks, plan, run folder,
attempt, record, summary. Printed as JSON on the last line:
  conversions  calls that turn a settings dict into a typed value (RunSpec.of, knobs.from_args,
               Knobs and OwnKnobs built directly), by caller; made from outside mpskit/settings/ or not
  entries      calls into mpskit/settings/ from the rest of the package, by caller and callee
  reads        opens of each config.json and dataset_info.json
"""

from __future__ import annotations

import collections
import dataclasses
import json
import sys
from pathlib import Path

import mpskit
from mpskit.engine import lf
from mpskit.settings import knobs, run_spec

PACKAGE = str(Path(mpskit.__file__).parent)
SETTINGS = str(Path(mpskit.__file__).parent / "settings")
CONVERSIONS = {
    run_spec.RunSpec.of.__func__.__code__: "RunSpec.of",
    knobs.from_args.__code__: "from_args",
    knobs.own_settings.__code__: "own_settings",
    knobs.Knobs.__init__.__code__: "Knobs()",
    knobs.OwnKnobs.__init__.__code__: "OwnKnobs()",
}
REPLACE = dataclasses.replace.__code__  # a typed value changed, not converted
COUNTED_FILES = ("config.json", "dataset_info.json")


def where(code) -> str:
    path = Path(code.co_filename)
    return f"{path.parent.name}/{path.name}:{code.co_name}"


def stub_run(spec, callbacks=None):
    """What a finished LLaMA-Factory run leaves in output_dir, for max_steps steps of loss 1."""
    out, steps = Path(spec.args["output_dir"]), int(spec.args["max_steps"])
    (out / "all_results.json").write_text(json.dumps({"train_runtime": 1.0, "train_loss": 1.0}))
    history = [{"loss": 1.0, "step": step} for step in range(1, steps + 1)]
    (out / "trainer_state.json").write_text(json.dumps({"global_step": steps, "max_steps": steps,
                                                         "log_history": history}))  # fmt: skip
    lines = [json.dumps({"current_steps": step, "total_steps": steps, "loss": 1.0}) for step in range(1, steps + 1)]
    (out / "trainer_log.jsonl").write_text("\n".join(lines) + "\n")
    return {}, {}, {}


def main() -> int:
    conversions, entries, reads = collections.Counter(), collections.Counter(), collections.Counter()

    def profile(frame, event, arg):
        if event != "call" or frame.f_back is None or frame.f_back.f_code is REPLACE:
            return
        code, caller = frame.f_code, frame.f_back.f_code
        outside = caller.co_filename.startswith(PACKAGE) and not caller.co_filename.startswith(SETTINGS)
        if code in CONVERSIONS:
            conversions[(CONVERSIONS[code], where(caller), outside)] += 1
        if outside and (code.co_filename.startswith(SETTINGS) or code in CONVERSIONS):
            entries[f"{where(caller)} -> {code.co_name}"] += 1

    def audit(event, args):
        if event == "open" and isinstance(args[0], str | Path) and Path(args[0]).name in COUNTED_FILES:
            reads[str(Path(args[0]).resolve())] += 1

    lf.import_engine, lf.run = (lambda: None), stub_run
    from mpskit.cli import main as mpskit_main

    sys.addaudithook(audit)
    sys.setprofile(profile)
    try:
        code = mpskit_main(["train", *sys.argv[1:]])
    except SystemExit as stop:
        code = stop.code
    finally:
        sys.setprofile(None)
    print(json.dumps({
        "exit": code,
        "conversions": [{"what": what, "caller": caller, "outside": outside, "calls": calls}
                        for (what, caller, outside), calls in sorted(conversions.items())],
        "entries": dict(sorted(entries.items())),
        "reads": reads,
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
