"""The out-of-memory ladder keeps the experiment first: which knobs it may move, and how."""

from mpskit.settings.knobs import Knobs, ladder_knobs, next_rung

WRITTEN = {"per_device_train_batch_size", "gradient_accumulation_steps", "lora_rank", "cutoff_len",
           "disable_gradient_checkpointing"}  # fmt: skip


def test_rungs_that_keep_the_experiment_move_even_where_the_user_wrote_them():
    assert ladder_knobs(WRITTEN, None) == {"checkpointing", "batch"}
    assert ladder_knobs(set(), None) == {"checkpointing", "batch", "lora_rank", "cutoff_len"}


def test_oom_ladder_is_the_users_consent_for_rank_and_cutoff():
    assert ladder_knobs(WRITTEN, "adapt") == {"checkpointing", "batch", "lora_rank", "cutoff_len"}
    assert ladder_knobs(set(), "keep") == {"checkpointing", "batch"}


def test_the_micro_batch_rung_keeps_the_effective_batch():
    free = {"batch"}
    for batch, effective in [(8, 8), (6, 6), (5, 5), (3, 6), (12, 24)]:
        knobs, said = next_rung(Knobs(batch=batch, cutoff_len=512), effective, free, 256)
        assert knobs.batch < batch and effective % knobs.batch == 0, (batch, effective, knobs.batch)
        assert knobs.batch == max(b for b in range(1, batch // 2 + 1) if effective % b == 0)
        assert "same effective batch" in said
    assert next_rung(Knobs(batch=1, cutoff_len=512), 8, free, 256) is None
