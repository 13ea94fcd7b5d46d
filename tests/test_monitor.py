"""The memory monitor hands the heap's free pages back before every evaluation, whatever asks for it:
a step's end (eval_strategy=steps), an epoch's end (eval_strategy=epoch, the stage presets'), or the
end of training (LLaMA-Factory's do_eval). Otherwise an evaluation is measured on top of the heap the
training steps left, and holds it."""

from types import SimpleNamespace

from transformers import TrainerControl

from mpskit.run import monitor


def test_the_heap_is_handed_back_before_every_evaluation_and_only_then(monkeypatch):
    trims = []
    monkeypatch.setattr(monitor, "trim_heap", lambda: trims.append(1))
    watch = monitor.MemoryMonitor("cpu")
    args, state = SimpleNamespace(eval_on_start=False), SimpleNamespace()
    try:
        watch.on_train_begin(args, state, TrainerControl())
        watch.on_step_end(args, state, TrainerControl())
        watch.on_epoch_end(args, state, TrainerControl())
        assert trims == []
        watch.on_step_end(args, state, TrainerControl(should_evaluate=True))
        assert len(trims) == 1
        watch.on_epoch_end(args, state, TrainerControl(should_evaluate=True))
        assert len(trims) == 2
        watch.on_train_end(args, state, TrainerControl())
        assert len(trims) == 3
    finally:
        watch.stop()
