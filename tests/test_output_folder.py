"""The hidden folder a writer fills (export -o, tiny-model, get-model): made by the writer itself, never
through a link planted at its name; only folders it marked are cleared after a kill."""

import json
import os

import pytest
from conftest import ROOT, run_mpskit

from mpskit import output_folder
from mpskit.errors import MpskitError


def test_what_was_planted_at_the_partial_names_is_neither_followed_nor_moved_nor_deleted(tmp_path):
    """Links at `.m.partial-PID` for the next 3000 process numbers (the name the writer once used), a
    user's folder, a folder whose mark is a link to the victim, and one marked by a writer that is gone
    (this process's number with another start time: a number the system gave again)."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "config.json").write_text("the victim's model")
    folder = tmp_path / "pp"
    folder.mkdir()
    for number in range(os.getpid(), os.getpid() + 3000):
        (folder / f".m.partial-{number}").symlink_to(victim, target_is_directory=True)
    users, forged, killed = (folder / f".m.partial-{name}" for name in ("1", "2", "3"))
    for made in (users, forged, killed):
        made.mkdir()
    (users / "notes.txt").write_text("mine")
    (forged / output_folder.MARK).symlink_to(victim / "config.json")
    (killed / output_folder.MARK).write_text(json.dumps({"pid": os.getpid(), "started": 0.0}))
    (killed / "config.json").write_text("half written")

    made = run_mpskit("tiny-model", str(folder / "m"), "--data", str(ROOT / "data"))
    assert made.returncode == 0, made.stderr[-2000:]
    assert [path.name for path in victim.iterdir()] == ["config.json"]
    assert (victim / "config.json").read_text() == "the victim's model"
    out = folder / "m"
    assert out.is_dir() and not out.is_symlink() and (out / "config.json").is_file()
    assert not (out / output_folder.MARK).exists()
    assert (users / "notes.txt").read_text() == "mine" and (forged / output_folder.MARK).is_symlink()
    assert not killed.exists() and f"removed {killed}, left by a writer of m that was killed" in made.stderr
    assert f"left {users} and 3001 more like it alone: mpskit did not mark it" in made.stderr


def test_only_the_folder_the_writer_made_moves_into_place(tmp_path):
    partial, made = output_folder.make_partial(tmp_path, "out")
    assert json.loads((partial / output_folder.MARK).read_text())["pid"] == os.getpid()
    elsewhere = tmp_path / "elsewhere"
    os.rename(partial, elsewhere)
    partial.symlink_to(tmp_path / "victim", target_is_directory=True)  # swapped for a link meanwhile
    with pytest.raises(MpskitError, match="was replaced while mpskit wrote it"):
        output_folder.move_into_place(partial, tmp_path / "out", made)
    assert not (tmp_path / "out").exists() and partial.is_symlink()


def test_a_failed_write_removes_its_own_folder_and_nothing_else(tmp_path):
    def fail(folder):
        (folder / "config.json").write_text("{}")
        raise RuntimeError("the model would not build")

    with pytest.raises(RuntimeError):
        output_folder.fill(tmp_path / "out", "-o", "test", "fix", fail)
    assert list(tmp_path.iterdir()) == []  # the lock file goes with its writer too
