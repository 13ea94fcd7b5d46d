"""The same presets on several processes: the CUDA planner knobs, ZeRO configs, and a real
two-process DDP run on this CPU (gloo) for SFT, DPO and fooDPO through torchrun and mpskit's entry point."""

import dataclasses
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_mpskit

from mpskit.machine.hardware import load_hardware
from mpskit.plan.memory import ModelDims, estimate
from mpskit.plan.planner import PlanRequest, plan
from mpskit.settings.knobs import Knobs

# one at a time: each torchrun takes a free port on loopback
pytestmark = pytest.mark.xdist_group("torchrun")

QWEN25_3B = ModelDims(hidden=2048, layers=36, heads=16, kv_heads=2, ffn=11008, vocab=151936, model_type="qwen2")
ARGS = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "cutoff_len": 512, "lora_rank": 8,
        "bf16": True}  # fmt: skip


def test_qlora_only_when_16_bit_weights_cannot_fit():
    cuda = load_hardware("cuda-24gb")
    assert plan(PlanRequest("sft", ARGS, cuda, "cuda", QWEN25_3B, budget_gb=20)).chosen.knobs.quantization_bit is None
    tight = plan(PlanRequest("sft", ARGS, cuda, "cuda", QWEN25_3B, budget_gb=6))
    assert tight.chosen.knobs.quantization_bit == 4
    assert any("QLoRA" in note for note in tight.changes)
    mac = plan(PlanRequest("sft", ARGS, load_hardware("m3-max-64gb"), "mps", QWEN25_3B, budget_gb=6))
    assert mac.chosen.knobs.quantization_bit == 4  # bitsandbytes quantizes on MPS too
    intel = plan(PlanRequest("sft", ARGS, load_hardware("intel-mac"), "cpu", QWEN25_3B, budget_gb=6))
    assert intel.chosen is None or intel.chosen.knobs.quantization_bit is None  # no bitsandbytes build there


def test_zero_stage_per_rank_memory():
    node = load_hardware("cuda-8x80gb")
    full = {**ARGS, "finetuning_type": "full"}
    roomy = plan(PlanRequest("sft", full, node, "cuda", QWEN25_3B, world_size=8, budget_gb=79))
    assert roomy.chosen.knobs.zero_stage == 2  # the faster stage when both fit
    tight = plan(PlanRequest("sft", full, node, "cuda", QWEN25_3B, world_size=8, budget_gb=12))
    assert tight.chosen.knobs.zero_stage == 3
    assert tight.chosen.estimate.parts["weights"] < roomy.chosen.estimate.parts["weights"] / 7


def test_config_for_eight_80gb_gpus_names_a_zero_config_and_bf16(tiny_model, tmp_path):
    out = tmp_path / "lf.yaml"
    result = run_mpskit(
        "config", "preset=foodpo", "model_preset=qwen2.5-3b", f"model_name_or_path={tiny_model}",
        f"dataset_dir={ROOT / 'data'}", "--hardware", "cuda-8x80gb", "-o", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    written = yaml.safe_load(out.read_text())
    assert written["bf16"] is True and written["fp16"] is False
    assert written["deepspeed"].startswith(str(ROOT / "mpskit" / "configs" / "deepspeed"))  # shipped in the package
    zero = json.loads(Path(written["deepspeed"]).read_text())
    assert zero["zero_optimization"]["stage"] in (2, 3)


def test_plan_shows_per_process_memory_for_eight_gpus():
    result = run_mpskit("plan", "preset=foodpo", "model_preset=qwen2.5-3b", "--hardware", "cuda-8x80gb")
    assert result.returncode == 0, result.stderr
    assert "budget     79.00 GB per process" in result.stdout
    assert "per process of 8" in result.stdout and "ZeRO-2" in result.stdout


@pytest.mark.e2e
@pytest.mark.parametrize("stage", ["sft", pytest.param("dpo", marks=pytest.mark.slow),
                                   pytest.param("foodpo", marks=pytest.mark.slow)])  # fmt: skip
def test_two_processes_train_through_torchrun_on_this_cpu(tmp_path, tiny_model, stage):
    words = [f"preset={stage}", f"model_name_or_path={tiny_model}", f"dataset_dir={ROOT / 'data'}", "template=qwen",
             "cutoff_len=128", "num_train_epochs=1", "logging_steps=2", "device=cpu"]  # fmt: skip
    result = run_mpskit("train", *words, cwd=tmp_path, env={"NPROC_PER_NODE": "2"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 processes: torch.distributed.run" in result.stderr
    run_dir = (tmp_path / "output" / f"{stage}-model" / "latest").resolve()
    ranks = [json.loads((run_dir / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world_size"] == 2 for r in ranks)
    assert all(r["outcome"] == "finished" and r["measured"]["training_gb"] > 0 for r in ranks)
    assert all(r["lean_logits"]["training"] == "lean" for r in ranks)  # the lean path under DDP
    written = yaml.safe_load((run_dir / "llamafactory.yaml").read_text())
    assert written["ddp_backend"] == "gloo"
    adapters = [p for p in run_dir.rglob("adapter_model.safetensors") if not p.parent.name.startswith("checkpoint")]
    assert adapters == [run_dir / "adapter_model.safetensors"]
    state = json.loads((run_dir / "trainer_state.json").read_text())
    per_step = written["per_device_train_batch_size"] * written["gradient_accumulation_steps"] * 2
    samples = 264  # both demo training sets, SFT and preference pairs, hold 264 examples
    assert state["global_step"] == math.ceil(samples / per_step)
    rows = [json.loads(line) for line in (run_dir / "trainer_log.jsonl").read_text().splitlines()]
    assert all(math.isfinite(row["loss"]) for row in rows if "loss" in row)
    if stage == "foodpo":
        assert any("dynamic_beta" in row for row in rows)


@pytest.mark.parametrize("given", [{}, {"MASTER_ADDR": "127.0.0.1"}])
def test_several_nodes_without_a_meeting_point_are_refused_in_one_line(tiny_model, tmp_path, given):
    """Each node would otherwise pick a random port of its own, and the rendezvous would hang."""
    words = ["preset=sft", f"model_name_or_path={tiny_model}", f"dataset_dir={ROOT / 'data'}", "device=cpu"]
    env = {"NNODES": "2", "NODE_RANK": "0", "MASTER_ADDR": "", "MASTER_PORT": "", **given}
    result = run_mpskit("train", *words, cwd=tmp_path, env=env)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert "NNODES=2 without" in lines[0] and "MASTER_PORT:" in lines[0] and "the same on every node" in lines[0]
    assert not (tmp_path / "output").exists()


def two_cpu_processes(cwd: Path, tiny_model: Path, name: str, *extra: str) -> tuple[Path, str]:
    """A short LoRA SFT run over 2 CPU processes (torchrun, gloo) in CWD: its folder, and what it said.
    Whole logits (lean_logits=false), as ZeRO-3 computes them, so every engine computes alike."""
    words = ["preset=sft", f"model_name_or_path={tiny_model}", f"dataset_dir={ROOT / 'data'}", "template=qwen",
             "cutoff_len=128", "max_steps=4", "logging_steps=1", "device=cpu", "lean_logits=false"]  # fmt: skip
    result = run_mpskit("train", *words, *extra, f"run_name={name}", cwd=cwd, env={"NPROC_PER_NODE": "2"})
    assert result.returncode == 0, result.stderr[-3000:]
    return (cwd / "output" / name / "latest").resolve(), result.stderr


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, tiny_model) -> Path:
    run, said = two_cpu_processes(tmp_path_factory.mktemp("ddp"), tiny_model, "ddp")
    assert "trained with DDP over 2 processes, gloo" in said
    for number in (0, 1):
        engine = json.loads((run / f"rank-{number}.json").read_text())["engine"]
        assert engine["distributed_type"] == "MULTI_CPU" and engine["wrapped_model"] == "DistributedDataParallel"
        assert not engine["deepspeed"] and engine["zero_stage"] is None and engine["world_size"] == 2
    return run


@pytest.mark.e2e
@pytest.mark.slow  # make test keeps ZeRO-3 on CPU ranks in the stop-signal test
@pytest.mark.parametrize("zero", [3, 2])
def test_deepspeed_zero_on_two_cpu_processes_trains_as_ddp_does(tmp_path, tiny_model, ddp_run, zero):
    """DeepSpeed's CPU accelerator over gloo, through `mpskit train` and torchrun: each rank records the engine
    that ran and holds half of what ZeRO splits; the losses and the adapter are DDP's (ZeRO-3 once started
    from uninitialized weights in half the runs: engine/cpu_gathers.py), and the adapter in one process
    scores the held-out set as the two ranks did."""
    from safetensors.torch import load_file

    run, said = two_cpu_processes(tmp_path, tiny_model, f"zero{zero}", f"zero={zero}")  # mpskit's ds_zN.json
    assert f"trained with DeepSpeed ZeRO-{zero} over 2 processes, gloo" in said
    noise = [line for line in said.splitlines() if line.strip() and not line.startswith("mpskit: ")]
    assert not noise, noise  # torchrun's banner and torch's warnings under DeepSpeed stay off the screen
    for number in (0, 1):
        engine = json.loads((run / f"rank-{number}.json").read_text())["engine"]
        assert engine["distributed_type"] == "DEEPSPEED" and engine["zero_stage"] == zero, engine
        assert engine["backend"] == "gloo" and engine["world_size"] == 2
        assert engine["wrapped_model"] == "DeepSpeedEngine"
        assert engine["states_share"] == pytest.approx(0.5, abs=0.05)  # the optimizer's float32 states, split
        assert engine.get("weights_share") == (pytest.approx(0.5, abs=0.05) if zero == 3 else None)
        assert engine.get("weights_share_range") == ([pytest.approx(0.5, abs=0.05)] * 2 if zero == 3 else None)
    # the plan splits per process what DeepSpeed split: held against the shares, not bytes (on the CPU,
    # DeepSpeed's memory_allocated is the process's RSS)
    planned = json.loads((run / "mpskit.json").read_text())["memory"]
    knobs, dims = Knobs(**planned["knobs"]), ModelDims(**planned["dims"])
    assert (knobs.zero_stage, knobs.world_size) == (zero, 2)
    shared, alone = (estimate(dims, k, "sft", "cpu").parts for k in (knobs, dataclasses.replace(knobs, world_size=1)))
    assert shared["optimizer (AdamW)"] / alone["optimizer (AdamW)"] == pytest.approx(engine["states_share"], abs=0.05)
    weights = shared["weights"] / alone["weights"]
    assert weights == (pytest.approx(engine["weights_share"], abs=0.05) if zero == 3 else 1.0)
    written = yaml.safe_load((run / "llamafactory.yaml").read_text())
    assert written["use_cpu"] is False and written["deepspeed"].endswith(f"ds_z{zero}.json")
    losses = {name: [row["loss"] for row in map(json.loads, (folder / "trainer_log.jsonl").read_text().splitlines())
                     if "loss" in row] for name, folder in {"zero": run, "ddp": ddp_run}.items()}  # fmt: skip
    assert len(losses["zero"]) == 4 and losses["zero"] == pytest.approx(losses["ddp"], rel=1e-4)
    folders = {"zero": run, "ddp": ddp_run}
    adapters = {name: load_file(folder / "adapter_model.safetensors") for name, folder in folders.items()}
    assert adapters["zero"].keys() == adapters["ddp"].keys()
    for key, tensor in adapters["zero"].items():  # whole shapes (gathered), trained, and DDP's values
        assert tensor.shape == adapters["ddp"][key].shape and tensor.abs().sum() > 0, key
        assert (tensor - adapters["ddp"][key]).abs().max() < 1e-5, key
    evaluated = run_mpskit("eval", str(run), cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    [figures] = [json.loads(path.read_text()) for path in run.glob("eval/*/all_results.json")]
    trained = json.loads((run / "all_results.json").read_text())
    assert figures["eval_loss"] == pytest.approx(trained["eval_loss"], rel=1e-4)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("stage", ["dpo", "foodpo"])
def test_preference_stages_train_under_zero3_on_two_cpu_processes(tmp_path, tiny_model, stage):
    """The reference forward of LoRA's DPO (the adapter switched off) runs on ZeRO-3's partitioned weights."""
    from safetensors.torch import load_file

    config = ROOT / "mpskit" / "configs" / "deepspeed" / "ds_z3.json"
    words = [f"preset={stage}", f"model_name_or_path={tiny_model}", f"dataset_dir={ROOT / 'data'}", "template=qwen",
             "cutoff_len=128", "max_steps=3", "logging_steps=1", "device=cpu", f"deepspeed={config}"]  # fmt: skip
    result = run_mpskit("train", *words, cwd=tmp_path, env={"NPROC_PER_NODE": "2"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trained with DeepSpeed ZeRO-3 over 2 processes, gloo" in result.stderr
    run = (tmp_path / "output" / f"{stage}-model" / "latest").resolve()
    rows = [json.loads(line) for line in (run / "trainer_log.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in rows if "loss" in row]
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses)
    assert (stage == "foodpo") == any("dynamic_beta" in row for row in rows)
    adapter = load_file(run / "adapter_model.safetensors")
    assert all(tensor.abs().sum() > 0 for name, tensor in adapter.items() if "lora_B" in name)


def test_the_lean_logits_path_is_off_where_the_output_layer_is_sharded():
    """ZeRO-3 partitions the output layer and FSDP frees it after the forward: the whole logits there."""
    from mpskit.settings.knobs import whole_logits_when_sharded

    deepspeed = ROOT / "mpskit" / "configs" / "deepspeed"
    for sharded in ({"deepspeed": str(deepspeed / "ds_z3.json")}, {"fsdp": "full_shard auto_wrap"}):
        whole_logits_when_sharded(sharded, {})
        assert sharded["lean_logits"] is False
    zero2 = {"deepspeed": str(deepspeed / "ds_z2.json")}
    whole_logits_when_sharded(zero2, {})
    assert "lean_logits" not in zero2  # ZeRO-2 keeps whole weights on every rank


def test_a_rebuilt_record_of_cpu_processes_says_cpu_on_any_machine():
    """DeepSpeed's CPU ranks train with use_cpu off: the rebuilt record reads the CPU off their gloo backend."""
    from mpskit.recipes.train import trained_device

    assert trained_device({"use_cpu": False, "ddp_backend": "gloo", "deepspeed": "ds_z3.json"}, "mps") == "cpu"
    assert trained_device({"use_cpu": True}, "mps") == "cpu"
    assert trained_device({"deepspeed": "ds_z3.json"}, "cuda") == "cuda"


def test_deepspeed_on_mps_and_fsdp_off_cuda_are_refused_before_a_run_folder():
    from mpskit.settings.resolve import cuda_only

    assert cuda_only({"deepspeed": "ds_z3.json"}, "cpu") == []  # DeepSpeed's CPU accelerator, over gloo
    assert "CUDA GPUs or CPU processes" in cuda_only({"deepspeed": "ds_z3.json"}, "mps")[0]
    assert "accelerate would drop it" in cuda_only({"fsdp": "full_shard"}, "cpu")[0]


@pytest.mark.e2e
@pytest.mark.slow
def test_two_nodes_on_loopback_train_one_run_with_global_ranks(tmp_path, tiny_model):
    """Two `mpskit train` processes, one a node, meet at one address and port (torchrun's rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    words = ["preset=sft", f"model_name_or_path={tiny_model}", f"dataset_dir={ROOT / 'data'}", "template=qwen",
             "cutoff_len=128", "max_steps=2", "device=cpu"]  # fmt: skip
    nodes = []
    for node in (0, 1):
        env = {**os.environ, "NNODES": "2", "NODE_RANK": str(node), "NPROC_PER_NODE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo"}  # fmt: skip
        nodes.append(subprocess.Popen([sys.executable, "-m", "mpskit.cli", "train", *words], cwd=tmp_path, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))  # fmt: skip
    ends = [node.communicate(timeout=600) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], [err[-2000:] for _, err in ends]
    folders = {path.name.rsplit("-", 1)[1]: path for path in (tmp_path / "output" / "sft-model").glob("*-node*")}
    assert sorted(folders) == ["node0", "node1"]
    ranks = {number: json.loads((folders[f"node{number}"] / f"rank-{number}.json").read_text()) for number in (0, 1)}
    assert all(r["rank"] == number and r["engine"]["world_size"] == 2 for number, r in ranks.items())
    assert all(r["engine"]["backend"] == "gloo" and r["outcome"] == "finished" for r in ranks.values())
    adapters = [path for path in (tmp_path / "output").rglob("adapter_model.safetensors")
                if not path.parent.name.startswith("checkpoint")]  # fmt: skip
    assert adapters == [folders["node0"] / "adapter_model.safetensors"]  # rank 0 saves the one adapter


def start_two_ranks(cwd: Path, tiny_model: Path, name: str, *extra: str, env: dict | None = None) -> subprocess.Popen:
    """`mpskit train` over 2 CPU processes under ZeRO-3, in an interpreter and a session of its own (the test
    signals its ranks, or its whole process group as a terminal's Ctrl-C does). Started as the `mpskit`
    command starts (no working folder on its import path), beside a `datasets.py` of the user's, which
    shadowed the library on every rank while torchrun started them with `python -m`."""
    (cwd / "datasets.py").write_text("raise ImportError('the working folder shadowed the library')\n")
    words = ["preset=sft", f"model_name_or_path={tiny_model}", f"dataset_dir={ROOT / 'data'}", "template=qwen",
             "cutoff_len=128", "logging_steps=1", "save_steps=3", "device=cpu", "zero=3",
             f"run_name={name}"]  # fmt: skip
    env = {**os.environ, "NPROC_PER_NODE": "2", **(env or {})}
    command = [sys.executable, "-P", "-m", "mpskit.cli", "train", *words, *extra]
    return subprocess.Popen(command, cwd=cwd, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)


def shared_buffers_left(said: str) -> list[str]:
    """DeepSpeed's CPU all-reduce buffers in /dev/shm of the run whose launch line SAID holds (its port)."""
    port = re.search(r"--master_port (\d+)", said)[1]
    return sorted(str(path) for path in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"))


def test_a_runs_shared_buffers_go_once_its_ranks_have_ended_and_a_later_runs_stay(tmp_path, monkeypatch):
    """DeepSpeed never unlinks its ranks' 66 MB buffers in RAM; the launcher removes this run's after
    torchrun ends, and leaves one made since (another run on the same port) alone."""
    from mpskit.machine import launch

    monkeypatch.setattr(launch, "SHARED_BUFFER", str(tmp_path / "buffer_{uid}_{addr}_{port}_{rank}"))
    made = [tmp_path / f"buffer_{os.getuid()}_127.0.0.1_4242_{rank}" for rank in (0, 1, 2)]
    other = tmp_path / f"buffer_{os.getuid()}_127.0.0.1_4343_0"
    for path in [*made, other]:
        path.write_bytes(b"x")
    ended = time.time()
    os.utime(made[2], (ended + 5, ended + 5))  # made after the run ended
    launch.release_shared_buffers("127.0.0.1", "4242", 3, ended)
    assert [path.exists() for path in made] == [False, False, True] and other.exists()


def logged_steps(run: Path) -> list[int]:
    rows = [json.loads(line) for line in (run / "trainer_log.jsonl").read_text().splitlines()]
    return [row["current_steps"] for row in rows if "loss" in row]


@pytest.mark.e2e
@pytest.mark.parametrize(("to", "against_an_unbroken_run"), [("rank 1", False),
                         pytest.param("rank 1", True, marks=pytest.mark.slow),
                         pytest.param("the terminal", False, marks=pytest.mark.slow)])  # fmt: skip
def test_a_stop_signal_stops_both_ranks_at_one_step_and_resume_finishes_from_the_zero_checkpoint(
    tmp_path, tiny_model, to, against_an_unbroken_run
):
    """SIGTERM to one rank: a stop it took alone left the other waiting in its next collective for ever
    (ddp_timeout is years). Now every rank stops at the end of the same step, saves its part of the ZeRO-3
    checkpoint, and the resume on 2 ranks trains to the end as if never stopped. A terminal's Ctrl-C reaches
    every process of its group: torchrun, which once sent each rank a second one (a stop mid-checkpoint),
    now runs in a session of its own, and mpskit hands each rank the one signal."""
    import psutil

    steps = 10
    child = start_two_ranks(tmp_path, tiny_model, "stopped", f"max_steps={steps}")
    log = tmp_path / "output" / "stopped" / "latest" / "trainer_log.jsonl"
    deadline = time.time() + 300
    while not (log.is_file() and len(log.read_text().splitlines()) >= 3) and time.time() < deadline:
        time.sleep(0.1)
    if to == "rank 1":
        [second] = [p for p in psutil.Process(child.pid).children(recursive=True) if p.environ().get("RANK") == "1"]
        second.send_signal(signal.SIGTERM)
    else:
        os.killpg(child.pid, signal.SIGINT)
    name = "SIGTERM" if to == "rank 1" else "SIGINT"
    _, said = child.communicate(timeout=300)
    assert child.returncode == 130, said[-3000:]
    run = (tmp_path / "output" / "stopped" / "latest").resolve()
    if to == "rank 1":
        assert "mpskit: SIGTERM to another process: saving a checkpoint at the end of this step" in said
    assert said.splitlines()[-1].startswith("mpskit: stopped; the newest complete checkpoint is checkpoint-")
    ranks = [json.loads((run / f"rank-{number}.json").read_text()) for number in (0, 1)]
    assert [r["outcome"] for r in ranks] == [f"stopped by {name}"] * 2
    stopped_at = logged_steps(run)[-1]
    assert stopped_at < steps and (run / f"checkpoint-{stopped_at}" / "latest").is_file()  # DeepSpeed's states
    assert shared_buffers_left(said) == []  # DeepSpeed's CPU all-reduce buffers, in RAM until a restart

    resume = [sys.executable, "-P", "-m", "mpskit.cli", "train", "--resume", str(run)]  # as `mpskit` starts
    resumed = subprocess.run(resume, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "trained with DeepSpeed ZeRO-3 over 2 processes, gloo" in resumed.stderr
    ranks = [json.loads((run / f"rank-{number}.json").read_text()) for number in (0, 1)]
    assert all(r["outcome"] == "finished" and r["resumed_from"] == f"checkpoint-{stopped_at}" for r in ranks)
    assert all(r["engine"]["zero_stage"] == 3 and r["engine"]["world_size"] == 2 for r in ranks)
    assert logged_steps(run) == list(range(1, steps + 1))  # each step once, none trained twice
    assert shared_buffers_left(resumed.stderr) == []
    if against_an_unbroken_run:
        child = start_two_ranks(tmp_path, tiny_model, "unbroken", f"max_steps={steps}")
        assert child.wait(timeout=600) == 0
        unbroken = (tmp_path / "output" / "unbroken" / "latest").resolve()
        losses = {folder: [json.loads(line)["loss"] for line in (folder / "trainer_log.jsonl").read_text()
                           .splitlines() if "loss" in json.loads(line)] for folder in (run, unbroken)}  # fmt: skip
        assert losses[run] == pytest.approx(losses[unbroken], rel=1e-5)  # the same to the last digit here


@pytest.mark.e2e
@pytest.mark.slow
def test_a_rank_killed_at_start_ends_the_run_within_torchruns_grace(tmp_path, tiny_model):
    """Rank 1 dies before its model loads; rank 0 waits for it in a collective, where no signal reaches its
    Python. torchrun sees the death, sends SIGTERM, and SIGKILL after its 30 s grace: the run ends, and
    its record says which rank ended without one."""
    child = start_two_ranks(tmp_path, tiny_model, "killed", "max_steps=4", env={"MPSKIT_FAKE_KILL_RANK_AT_START": "1"})
    _, said = child.communicate(timeout=240)
    assert child.returncode == 2, said[-3000:]
    last = said.splitlines()[-1]
    # rank 0 records its stop where torchrun's SIGTERM reaches its Python, else SIGKILL ends it too
    silent = r"; (rank 1|ranks 0, 1) ended without a record \(killed\?\)"
    assert re.match(rf"mpskit: error: the training processes stopped with exit code 1{silent} .*--resume", last)
    [run] = (tmp_path / "output" / "killed").iterdir()  # no `latest`: training never began
    [attempt] = json.loads((run / "mpskit.json").read_text())["attempts"]
    assert re.fullmatch(f"stopped by SIGTERM before training began|the processes ended with exit code 1{silent}",
                        attempt["outcome"])  # fmt: skip
    grace = [line for line in said.splitlines() if "time      :" in line]  # torchrun's: rank 1's death, then rank 0's
    died, ended = (time.mktime(time.strptime(line.split(": ", 1)[1].strip(), "%Y-%m-%d_%H:%M:%S")) for line in grace)
    assert abs(ended - died) <= 35, grace
