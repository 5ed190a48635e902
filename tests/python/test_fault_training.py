"""A crash costs nothing but time: the example trainer's `train` (a real model on real
data) reaches its accuracy bar on ruccl and on gloo, and a job killed at a named moment
(RUCCL_FAULT, ruccl_pg/faults.py) and restarted by torchrun ends with the checksums of
an uninterrupted job, bit for bit; then the fault drill (scripts/fault_drill.py), 3
trials of each fault kind injected from outside.  Real processes throughout."""

import json
import os
import re
import subprocess
import sys

import pytest

from dist_harness import IS_GLOO, child_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "collective_training.py")
DRILL = os.path.join(ROOT, "scripts", "fault_drill.py")
pytestmark = pytest.mark.skipif(IS_GLOO, reason="RUCCL_PY_BACKEND=gloo: these test the ruccl example and drill")

STEPS = ["--steps", "200", "--save-every", "50"]  # a short job: 4 checkpoints
TIMEOUT = 240
CHECKSUM = re.compile(r"^rank (\d+) final checksum: ([0-9a-f]{64})$", re.M)


def _run(cmd, extra_env=None, timeout=TIMEOUT, unset=()):
    env = child_env()
    for name in ("RUCCL_FAULT", *unset):
        env.pop(name, None)
    env.update(extra_env or {})
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, err = p.communicate()
        pytest.fail(f"{cmd} did not end in {timeout} s:\n{out}\n{err[-3000:]}")
    return p.returncode, out, err


def _checksums(out, world):
    sums = dict((int(r), h) for r, h in CHECKSUM.findall(out))
    assert sorted(sums) == list(range(world)), f"expected a checksum line per rank, got:\n{out}"
    return sums


def _train(directory, world, *extra):
    """`train` started by the example itself (no torchrun); its checksums and stderr."""
    rc, out, err = _run([sys.executable, EXAMPLE, "train", str(directory), "--world", str(world), "--no-progress",
                         *extra])
    assert rc == 0, f"train failed ({rc}):\n{out}\n{err[-3000:]}"
    return _checksums(out, world), err


_references = {}


def _reference(tmp_path_factory, world, *extra):
    key = (world, *extra)
    if key not in _references:
        _references[key] = _train(tmp_path_factory.mktemp("reference") / "job", world, *STEPS, *extra)[0]
    return _references[key]


@pytest.mark.parametrize("backend", ["ruccl", "gloo"])
def test_train_reaches_the_accuracy_bar(tmp_path, backend):
    """The default job (1000 steps, 2 ranks) ends above 95% test accuracy on either
    backend, with equal checksums on every rank, and rank 0's plot."""
    sums, err = _train(tmp_path / "job", 2, "--backend", backend)
    m = re.search(r"test accuracy ([0-9.]+)% after 1000 steps", err)
    assert m, f"no accuracy line in:\n{err[-3000:]}"
    assert float(m.group(1)) >= 95.0, f"{backend}: test accuracy {m.group(1)}% is below 95%"
    assert len(set(sums.values())) == 1, f"the ranks' weights differ: {sums}"
    with open(tmp_path / "job" / "training.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    ckpts = sorted(os.listdir(tmp_path / "job" / "checkpoints"))
    assert ckpts == ["step-0000000800", "step-0000000900", "step-0000001000"], ckpts  # rotation keeps 3


def test_train_continues_from_a_finished_directory_without_training(tmp_path):
    """A second `train` of a finished DIR loads the last checkpoint and ends at once with
    the same checksums (a restart after the job's end)."""
    first, _ = _train(tmp_path / "job", 2, *STEPS)
    again, err = _train(tmp_path / "job", 2, *STEPS)
    assert again == first
    assert "resumed from" in err and "step-0000000200 (step 200" in err, err[-2000:]


# (ranks, RUCCL_FAULT, extra train options, what the test shows)
CASES = [
    (2, "collective:137:1", [], "rank 1 killed inside the all-reduce of step 137"),
    (3, "collective:61:0", [], "rank 0 killed inside a collective"),
    (3, "backward:700:2", [], "rank 2 killed inside the backward pass (step 59)"),
    (2, "save-files:2:0", [], "rank 0 killed between the rank files and the manifest of the step-100 save"),
    (3, "save-files:3:1", [], "rank 1 killed between the rank files and the manifest of the step-150 save"),
    (2, "collective:120:1,load:1:0@1", [], "a kill, then rank 0 killed during the load after the restart"),
    (3, "collective:77:2", ["--save-every", "1"], "--save-every 1"),
    (2, "backward:1500:1", ["--micro-batches", "3"], "three micro-batches a step (killed in step 84)"),
]


@pytest.mark.parametrize("world,fault,extra,what", CASES, ids=[f"{c[0]}ranks-{c[1]}" for c in CASES])
def test_killed_and_restarted_by_torchrun_ends_bit_identical(tmp_path, tmp_path_factory, world, fault, extra, what):
    # the weights depend on the micro-batches, not on when checkpoints are saved
    ref_extra = extra[extra.index("--micro-batches"):][:2] if "--micro-batches" in extra else []
    reference = _reference(tmp_path_factory, world, *ref_extra)
    rc, out, err = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                         str(world), "--max-restarts", "2", EXAMPLE, "train", str(tmp_path / "job"), "--no-progress",
                         *STEPS, *extra], {"RUCCL_FAULT": fault})
    assert rc == 0, f"{what}: torchrun failed ({rc}):\n{err[-4000:]}"
    fired = err.count("RUCCL_FAULT: kill at")
    assert fired == fault.count(",") + 1, f"{what}: the fault did not fire as asked ({fired} fired):\n{err[-4000:]}"
    assert "train: resumed from" in err, f"{what}: the restarted job did not resume from a checkpoint"
    assert _checksums(out, world) == reference, f"{what}: the restarted job's checksums differ from the reference"
    leftovers = [n for n in os.listdir(tmp_path / "job" / "checkpoints") if ".tmp-" in n]
    assert not leftovers, f"{what}: a killed save's temporary directory was left behind: {leftovers}"


def test_a_worker_killed_before_it_joins_does_not_split_the_restart():
    """torchrun keeps its store across restarts.  Rank 3 is killed after ranks 0-2 took
    their rendezvous tickets and before it took its own (startup_kill.py), so the next
    attempt's first ranks land in the dead attempt's session: they must see it is dead
    and meet the others in the next one.  Without RUCCL_SECRET: the secret rank 0 shares
    through the store must survive the restart too."""
    env = {"RUCCL_DEBUG": "WARN"}
    rc, out, err = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                         "--max-restarts", "1", os.path.join(ROOT, "tests", "python", "startup_kill.py"), "ruccl"],
                        env, unset=("RUCCL_SECRET", "RUCCL_SECRET_FILE"))
    assert rc == 0, f"the restart did not form its group ({rc}):\n{out}\n{err[-4000:]}"
    done = sorted(int(r) for r in re.findall(r"^attempt 1 rank (\d+): all_reduce gives 4$", out, re.M))
    assert done == [0, 1, 2, 3], out
    assert "is a dead attempt's" in err, f"no rank met the dead attempt's session:\n{err[-4000:]}"


def test_the_fault_drill_three_trials_of_each_kind(tmp_path):
    """scripts/fault_drill.py: 4 ranks under torchrun, faults from outside at random
    moments of the training: every trial bit-identical, no hang; kill -9 found within 3 s and SIGSTOP
    within the liveness timeout (10 s) + 5 s."""
    out_json = tmp_path / "drill.json"
    rc, out, err = _run([sys.executable, DRILL, "--trials", "3", "--steps", "300", "--json", str(out_json),
                         "--workdir", str(tmp_path / "jobs"), "--seed", "7", "--window", "0", "0.5"], timeout=900)
    trials = json.loads(out_json.read_text())["trials"]
    assert len(trials) == 9, f"expected 9 trials, got {len(trials)}:\n{out}\n{err[-3000:]}"
    for t in trials:
        assert t["fault_injected"], f"no worker to inject into: {t}"
        # the first half of the reference's training (a trial may train faster than its
        # reference) keeps the faults inside it; one past the job's last collective would
        # be the drill's known limit (a hang on any backend), not this test's
        assert t["phase"] == "training", f"the fault landed outside the training: {t}"
        assert not t["hang"] and t["bit_identical"], f"trial failed: {t}"
        bound = 3.0 if t["kind"] in ("kill", "kill2") else 10.0 + 5.0
        assert t["detection_s"] is not None and t["detection_s"] <= bound, f"detection too slow: {t}"
    assert rc == 0, f"the drill failed ({rc}):\n{out}\n{err[-3000:]}"
    assert "| ruccl | stop | 3 | 3 | 0 | 0 |" in out, out  # trials, bit-identical, failed, hangs
