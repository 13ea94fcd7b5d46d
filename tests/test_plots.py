"""The run's plots say only what was measured (mpskit/run/plots.py): no plot from one point, "flat"
where the loss moved less than the noise of its first steps, every attempt in memory.png. The plots
of real runs are checked in test_e2e.py and test_foodpo_e2e.py; here, logged histories of each kind."""

import json

from mpskit.run import plots
from mpskit.run.plots import loss_title, plot_memory, plot_training
from mpskit.rundir.record import Attempt, RunRecord


def _history(tmp_path, losses: list[float], **extra) -> None:
    rows = [{"step": 5 * (i + 1), "loss": loss, **extra} for i, loss in enumerate(losses)]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": rows}))


def test_a_run_with_one_logged_point_draws_no_loss_plot_and_says_so(tmp_path):
    _history(tmp_path, [0.69])
    assert plot_training(tmp_path, "dpo of tiny") == [
        "1 logged training loss point: no loss.png (set logging_steps lower to log more)"
    ]
    assert not (tmp_path / "loss.png").exists()


def test_a_flat_loss_is_called_flat_and_a_falling_one_is_not():
    flat = loss_title("dpo", [0.69312, 0.69311, 0.69310, 0.69310, 0.69309, 0.69308, 0.69307, 0.69306])
    assert flat == "dpo: loss, flat: -5e-05 against the first steps' noise 0.0069"
    assert loss_title("dpo", [0.58, 0.22]) == "dpo: loss"  # the demo's 10 DPO steps: no verdict from 2 points
    assert loss_title("dpo", [0.69, 0.69, 0.69, 0.69]) == "dpo: loss"  # nor from 4
    assert loss_title("sft", [7.0, 6.9, 6.7, 6.6, 6.5, 6.4, 6.3, 6.2]) == "sft: loss"
    # noisy around one level: the change is under the first steps' spread
    assert ", flat:" in loss_title("sft", [2.0, 2.6, 1.9, 2.5, 2.1, 2.4, 2.0, 2.5])


def test_a_preference_run_gets_loss_and_reward_plots(tmp_path):
    _history(tmp_path, [0.69 - 0.01 * i for i in range(40)], **{"rewards/accuracies": 0.5, "rewards/margins": 0.1})
    assert plot_training(tmp_path, "dpo of tiny") == []
    assert (tmp_path / "loss.png").stat().st_size > 10_000 and (tmp_path / "rewards.png").stat().st_size > 10_000


def test_memory_plot_shows_every_attempt_that_left_samples_and_where_one_ended_early(tmp_path, monkeypatch):
    def attempt(number: int, resumed_from: str | None) -> Attempt:
        samples = [[t / 10, 0.05 + 0.01 * (t % 3)] for t in range(40)]
        measured = {"device": "cpu", "training_gb": 0.07, "samples_gb": samples, "train_began_s": 1.0,
                    "eval_spans_s": [[2.0, 2.4]]}  # fmt: skip
        return Attempt(number, resumed_from=resumed_from, measured=measured)

    attempts = [attempt(1, None), Attempt(2, outcome="error: disk full"), attempt(3, "checkpoint-4")]
    attempts[0].outcome = "out of memory"
    drawn = []
    monkeypatch.setattr(plots._pyplot(), "close", drawn.append)  # the figure, to read what it shows
    assert plot_memory(tmp_path, attempts, 0.08, 20.0, "sft of tiny, 4-bit base") == tmp_path / "memory.png"
    [axis] = [axis for axis in drawn[0].axes if axis.get_title()]
    assert "4-bit base" in axis.get_title() and "(1 of 3 attempts left no samples)" in axis.get_title()
    assert [text.get_text() for text in axis.texts if "out of memory" in text.get_text()] == [" out of memory"]
    assert plot_memory(tmp_path / "none", [Attempt(1)], 0.08, 20.0, "sft of tiny") is None


def test_a_plot_title_names_a_quantized_base():
    record = RunRecord(run_name="r", stage="sft", device="mps",
                       llamafactory_args={"model_name_or_path": "/m/Qwen2.5-7B", "quantization_bit": 4})  # fmt: skip
    assert plots.run_title(record) == "sft of Qwen2.5-7B, 4-bit base on mps"
