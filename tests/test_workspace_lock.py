"""One writer per workspace (dots.workspace_lock): a second flow, `dots all` or bench of the same
folder waits for the first, says for whom, and never finds a lock its holder's death left behind.
The race it closes: two flows with overrides on one repository, where the second took the
first's overridden params.yaml for the user's and put it back for good."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from dots import params_record, versioning, workspace_lock
from dots.workspace_lock import exclusive, holder

from .conftest import REPO
from .test_parent_death import _alive, gone_within

PARAMS = "train:\n  steps: 300  # the user's own comment\n"

# holds `folder`'s lock as `what`, says "held" once it has it, sleeps `hold` seconds, and leaves
# `<folder>/done` just before it lets go
HOLDER = textwrap.dedent("""
    import pathlib, sys, time
    from dots.workspace_lock import exclusive
    folder, what, hold = sys.argv[1], sys.argv[2], float(sys.argv[3])
    with exclusive(folder, what):
        print("held", flush=True)
        time.sleep(hold)
        pathlib.Path(folder, "done").touch()
""")

# a flow's body: the lock, then the overrides, then a stage that reads params.yaml
OVERRIDDEN_RUN = textwrap.dedent("""
    import sys, time, yaml
    from dots.versioning import params_overridden
    from dots.workspace_lock import exclusive
    repo, steps, hold = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    with exclusive(repo, f"run {steps}"), params_overridden([f"train.steps={steps}"], repo):
        print("held", flush=True)
        seen = [yaml.safe_load(open(f"{repo}/params.yaml"))["train"]["steps"]]
        time.sleep(hold)
        seen.append(yaml.safe_load(open(f"{repo}/params.yaml"))["train"]["steps"])
        print("saw", *seen, flush=True)
""")


def _start(script: str, *args) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", script, *map(str, args)], stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.stdout.readline().strip() == "held"  # it holds the lock from here on
    return proc


def test_the_holder_is_written_while_held_and_cleared_after(tmp_path):
    assert holder(tmp_path) is None
    with exclusive(tmp_path, "dots all", report=pytest.fail):
        who = holder(tmp_path)
        assert who["what"] == "dots all" and who["pid"] == os.getpid()
    assert holder(tmp_path) is None


def test_a_second_run_waits_for_the_first_and_names_it(tmp_path):
    other = _start(HOLDER, tmp_path, "Prefect flow run nightly of dots-compare", 1.5)
    said = []
    with exclusive(tmp_path, "dots all", report=said.append):
        assert (tmp_path / "done").exists(), "went on while the other run still held the workspace"
        assert holder(tmp_path)["pid"] == os.getpid()
    assert other.wait() == 0
    assert len(said) == 2
    assert said[0].startswith("dots all: waiting for Prefect flow run nightly of dots-compare (pid "
                              f"{other.pid} on ")
    assert str(tmp_path.resolve()) in said[0] and "is free after" in said[1]


def test_the_waiting_line_says_how_to_stop_the_run_that_waits(tmp_path, monkeypatch):
    """Ctrl-C in a terminal; a deployment's run on a Prefect worker has no terminal (Ctrl-C where
    the worker runs stops the worker): its line names the flow run to cancel."""
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    lines = {}
    for case, flow_run, stdin in (("terminal", None, Terminal()), ("deployment", "0f1e2d", Terminal()),
                                  ("no terminal", None, io.StringIO())):
        if flow_run:
            monkeypatch.setenv("PREFECT__FLOW_RUN_ID", flow_run)
        else:
            monkeypatch.delenv("PREFECT__FLOW_RUN_ID", raising=False)
        monkeypatch.setattr(sys, "stdin", stdin)
        other = _start(HOLDER, tmp_path, "dots-pipeline", 0.5)
        said = []
        with exclusive(tmp_path, "dots train", report=said.append):
            pass
        assert other.wait() == 0
        lines[case] = said[0]
    assert lines["terminal"].endswith("(one run writes a workspace at a time; Ctrl-C stops this one only)")
    assert lines["deployment"].endswith("`prefect flow-run cancel 0f1e2d` stops this one only)")
    assert "Ctrl-C" not in lines["no terminal"] and lines["no terminal"].endswith("leaves the other alone)")


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    other = _start(HOLDER, tmp_path, "dots bench", 600)
    assert holder(tmp_path)["pid"] == other.pid
    other.send_signal(signal.SIGKILL)
    other.wait()
    assert holder(tmp_path)["pid"] == other.pid  # its record is still there, its lock is not
    with exclusive(tmp_path, "dots all", report=pytest.fail):  # no wait
        assert holder(tmp_path)["pid"] == os.getpid()


def test_the_same_process_takes_its_own_lock_again(tmp_path):
    with exclusive(tmp_path, "outer", report=pytest.fail):
        with exclusive(tmp_path / ".", "inner", report=pytest.fail):  # a flow calling a flow
            assert holder(tmp_path)["what"] == "outer"
        assert holder(tmp_path)["what"] == "outer"
    assert workspace_lock._held == {}


def test_two_overridden_runs_of_one_repo_take_turns_and_leave_the_users_params(tmp_path):
    (tmp_path / "params.yaml").write_text(PARAMS)
    first = _start(OVERRIDDEN_RUN, tmp_path, 20, 1.5)
    second = subprocess.Popen([sys.executable, "-c", OVERRIDDEN_RUN, str(tmp_path), "40", "0"],
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    out_first, _ = first.communicate(timeout=120)
    out_second, _ = second.communicate(timeout=120)
    assert first.returncode == second.returncode == 0
    assert "saw 20 20" in out_first  # the other run's overrides never reached this one's stages
    assert "waiting for run 20" in out_second and "saw 40 40" in out_second
    assert (tmp_path / "params.yaml").read_text() == PARAMS  # byte for byte the user's
    assert not (tmp_path / "params.yaml.before-overrides").exists()


def _fake_stages(monkeypatch, repo: Path, calls: list):
    """The train flow's stages as plain functions that record what each saw."""
    from tasks import stages

    def stage(name):
        def run(*args, **kwargs):
            steps = yaml.safe_load((repo / "params.yaml").read_text())["train"]["steps"]
            calls.append((name, holder(repo)["pid"] == os.getpid() and (repo / "done").exists(), steps))
            if name == "train":
                out = repo / "artifacts" / "runs" / "grpo"
                out.mkdir(parents=True, exist_ok=True)
                (out / "summary.json").write_text(json.dumps({"method": "grpo"}))
            return "v1"
        return run
    for name in ("version_data", "warmup", "embed", "label", "fit_predictor", "train", "evaluate"):
        monkeypatch.setattr(stages, name, stage(name))


def test_the_train_flow_holds_the_repo_while_a_dots_all_runs_there(tmp_path, monkeypatch):
    from flows.train import train_run

    (tmp_path / "params.yaml").write_text(PARAMS)
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")  # the stages are faked
    calls: list = []
    _fake_stages(monkeypatch, tmp_path, calls)
    other = _start(HOLDER, tmp_path, "dots all", 1.5)
    summary = train_run.fn(method="grpo", repo=str(tmp_path), overrides=["train.steps=25"])
    assert other.wait() == 0 and summary == {"method": "grpo"}
    assert [c[0] for c in calls] == ["version_data", "warmup", "embed", "label", "fit_predictor", "train",
                                     "evaluate"]
    # every stage ran under this flow's lock, after the other run had finished, on its own overrides
    assert all(held and steps == 25 for _, held, steps in calls)
    assert (tmp_path / "params.yaml").read_text() == PARAMS
    assert holder(tmp_path) is None


class _Stop(Exception):
    pass


def test_a_second_bench_of_a_workspace_waits_before_its_shared_stages(tmp_path):
    from dots import bench
    from dots.config import load_config

    cfg = bench.bench_config(load_config(REPO / "params.yaml", [f"paths.root={tmp_path / 'artifacts'}",
                                                                  "tracking.enabled=false"]))
    seen = []

    def shared(_cfg):
        seen.append((cfg.root / "done").exists() and holder(cfg.root)["pid"] == os.getpid())
        raise _Stop

    other = _start(HOLDER, cfg.root, "dots bench", 1.5)  # artifacts/bench: the bench's own workspace
    with pytest.raises(_Stop):
        bench.run_bench(cfg, [0], ["grpo", "dots_rr"], tmp_path / "results", shared=shared)
    assert other.wait() == 0
    assert seen == [True]  # its shared stages ran under its own lock, after the other bench let go
    assert holder(cfg.root) is None  # let go when the bench failed


@pytest.mark.parametrize("argv, stage, what", [
    (["all"], "run_shared", "dots all"),
    (["train", "--method", "dots_rr"], "train", "dots train --method dots_rr"),
    (["evaluate", "--method", "grpo"], "evaluate", "dots evaluate --method grpo"),
])
def test_a_command_run_by_hand_waits_for_a_flow_of_its_repository(tmp_path, monkeypatch, capsys, argv, stage,
                                                                   what):
    """Run by hand beside a nightly flow, `dots train --method dots_rr` trained into the run folder
    and checkpoint the flow's own `train@dots_rr` stage was writing."""
    from dots import cli, stages

    def body(*args, **kwargs):
        assert (tmp_path / "done").exists() and holder(tmp_path)["what"] == what
        raise _Stop

    monkeypatch.setattr(stages, stage, body)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("tracking:\n  enabled: false\n")
    other = _start(HOLDER, tmp_path, "Prefect flow run brave-otter of dots-pipeline", 1.5)
    with pytest.raises(_Stop):
        cli.main(argv)
    assert other.wait() == 0
    assert f"{what}: waiting for Prefect flow run brave-otter of dots-pipeline" in capsys.readouterr().out


def test_a_holders_own_children_do_not_wait_on_it(tmp_path):
    """A flow's DVC stages are `dots` commands in child processes: they inherit its hold (else every
    stage would wait on its own flow for ever)."""
    child = ("import sys\nfrom dots.workspace_lock import exclusive, holder\n"
             "with exclusive(sys.argv[1], 'dots train', report=sys.exit):\n"
             "    print(holder(sys.argv[1])['what'])")
    with exclusive(tmp_path, "Prefect flow run of dots-pipeline", report=pytest.fail):
        out = subprocess.run([sys.executable, "-c", child, str(tmp_path)], capture_output=True, text=True,
                             timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)))
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "Prefect flow run of dots-pipeline"  # the holder is still the flow
    assert workspace_lock.HELD_ENV not in os.environ  # let go: a later child would wait again
    # a process that did not inherit the hold waits (report=sys.exit: it says so and stops)
    other = _start(HOLDER, tmp_path, "a flow", 30)
    out = subprocess.run([sys.executable, "-c", child, str(tmp_path)], capture_output=True, text=True,
                         timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)))
    other.kill()
    assert out.returncode == 1 and "dots train: waiting for a flow" in out.stderr


def test_ranks_other_than_0_do_not_take_the_lock(tmp_path, monkeypatch):
    """Under torchrun every rank runs `dots train`; rank 0 holds the repository for all (the others
    waiting on it would wait for ever in the first collective)."""
    from dots import cli, stages

    def train(*args, **kwargs):
        assert not (tmp_path / "done").exists() and holder(tmp_path)["what"] == "a flow"
        raise _Stop

    monkeypatch.setattr(stages, "train", train)
    monkeypatch.setattr(cli, "_require_environment", lambda *a: None)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANK", "1")
    (tmp_path / "params.yaml").write_text("tracking:\n  enabled: false\n")
    other = _start(HOLDER, tmp_path, "a flow", 30)
    try:
        with pytest.raises(_Stop):
            cli.main(["train", "--method", "grpo"])
    finally:
        other.kill()


def test_a_folder_it_cannot_write_runs_the_command_unserialized(tmp_path, monkeypatch):
    """A read-only checkout whose command writes its paths.root elsewhere ran before the lock came;
    it still runs, saying it is not serialized, instead of failing on the lock file."""
    real_open = os.open

    def read_only(path, *args, **kwargs):
        if str(path).endswith(workspace_lock.LOCK_NAME):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    said = []
    with exclusive(tmp_path, "dots train --method grpo", report=said.append):
        ran = True
    assert ran and said == [f"dots train --method grpo: cannot hold {tmp_path.resolve()} (Read-only file "
                            "system); "
                            "this run is not serialized with others there"]
    monkeypatch.setattr(os, "open", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(OSError, match="I/O error"):  # any other failure is not taken for a read-only folder
        with exclusive(tmp_path, "dots train", report=said.append):
            pass


def test_a_dvc_stage_run_by_hand_beside_a_flow_fails_at_once_naming_it(tmp_path, monkeypatch, capsys):
    """A `dvc repro` run by hand beside a flow: its stage's command waiting for the flow kept DVC's
    locks on the stage's files, and the flow's next stage failed on them ("is busy"). It stops at
    once instead, exit 1, naming the flow; the flow is left alone and the body never runs."""
    from dots import cli, stages

    monkeypatch.setattr(stages, "prepare", lambda *a: pytest.fail("ran beside the flow"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(cli.DVC_STAGE, "prepare")
    (tmp_path / "params.yaml").write_text("tracking:\n  enabled: false\n")
    other = _start(HOLDER, tmp_path, "Prefect flow run brave-otter of dots-train", 30)
    try:
        assert cli.main(["prepare"]) == 1
        assert other.poll() is None and holder(tmp_path)["pid"] == other.pid  # the flow holds on
    finally:
        other.kill()
        other.wait()
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"dots prepare: Prefect flow run brave-otter of dots-train (pid {other.pid} on ")
    assert f"is writing {tmp_path.resolve()}; as DVC's stage prepare this command does not wait" in err
    assert err.endswith("Run `dvc repro` again when it has finished") and "\n" not in err
    # with the flow gone the same stage takes the workspace as any command does
    monkeypatch.setattr(stages, "prepare", lambda *a: None)
    assert cli.main(["prepare"]) == 0


# a flow in miniature: it holds the repo, and its task thread runs a dvc-like process (here a python
# that runs the stage as DVC does, a plain subprocess) whose stage works under the inherited hold
FLOW = textwrap.dedent("""
    import sys, threading
    from dots.parent_death import popen_dying_with_this_thread
    from dots.workspace_lock import exclusive
    folder = sys.argv[1]
    STAGE = ("import os, sys, time\\nfrom dots.workspace_lock import exclusive\\n"
             "with exclusive(sys.argv[1], 'dots train'):\\n"
             "    print(os.getpid(), flush=True)\\n    time.sleep(120)")
    DVC = "import subprocess, sys\\nsubprocess.run([sys.executable, '-c', sys.argv[1], sys.argv[2]])"
    with exclusive(folder, "Prefect flow run doomed of dots-train"):
        print("held", flush=True)
        task = threading.Thread(target=lambda: popen_dying_with_this_thread(
            [sys.executable, "-c", DVC, STAGE, folder]).wait())
        task.start()
        task.join()
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_flows_stage_dies_with_the_flow_however_it_dies(tmp_path):
    """A flow SIGKILLed mid-stage released the repository, but its dvc and the stage's `dots train`
    ran on under the hold they had inherited, writing beside the next flow the lock let in."""
    flow = _start(FLOW, tmp_path)
    stage = int(flow.stdout.readline())
    try:
        assert _alive(stage) and holder(tmp_path)["pid"] == flow.pid
        flow.send_signal(signal.SIGKILL)
        flow.wait(timeout=30)
        assert gone_within(stage, 30), "the stage outlived its flow"
    finally:
        if _alive(stage):
            os.kill(stage, signal.SIGKILL)


def test_a_stage_whose_flow_has_already_died_does_not_start(tmp_path, monkeypatch, capsys):
    """The kernel's request covers deaths still to come: a stage started after its flow died (the
    hold it inherited names a pid that is gone) stops before writing anything."""
    from dots import cli, stages

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    monkeypatch.setenv(workspace_lock.HELD_ENV, json.dumps({str(tmp_path.resolve()): gone.pid}))
    monkeypatch.setattr(stages, "train", lambda *a, **k: pytest.fail("trained without its flow"))
    monkeypatch.setattr(cli, "_require_environment", lambda *a: None)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("tracking:\n  enabled: false\n")
    assert cli.main(["train", "--method", "grpo"]) == 1
    assert capsys.readouterr().err.strip() == (
        f"dots train --method grpo: the run that started it (pid {gone.pid}) held {tmp_path.resolve()} and "
        "has ended; not writing there without it. Start the run again")


def test_a_killed_runs_overrides_are_undone_by_the_next_run(tmp_path):
    """A flow with overrides SIGKILLed (the OOM killer, `kill -9`) never put params.yaml back, and
    the next flow with overrides took the dead one's file for the user's and restored *that*: the
    user's params.yaml kept `train.steps: 333` for good (seen in a clone with real Prefect flows)."""
    params = tmp_path / "params.yaml"
    params.write_text(PARAMS)
    killed = _start(OVERRIDDEN_RUN, tmp_path, 333, 600)
    killed.kill()
    killed.wait()
    assert yaml.safe_load(params.read_text())["train"]["steps"] == 333  # what the kill leaves
    nxt = subprocess.run([sys.executable, "-c", OVERRIDDEN_RUN, str(tmp_path), "40", "0"], capture_output=True,
                         text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(REPO)))
    said, held, saw = nxt.stdout.splitlines()
    assert said.startswith(f"params.yaml: a run (pid {killed.pid}, since ") and "train.steps=333" in said
    assert held == "held" and saw == "saw 40 40"
    assert params.read_text() == PARAMS  # the user's, byte for byte
    assert not (tmp_path / params_record.RECORD).exists()


def test_a_command_by_hand_after_a_killed_flow_runs_on_the_users_params(tmp_path, monkeypatch, capsys):
    """Not only the next flow: any command that takes the workspace undoes a dead run's overrides
    first, and says so; a file edited since is left as the user made it."""
    from dots import cli, stages

    seen = []
    monkeypatch.setattr(stages, "prepare", lambda cfg: seen.append(cfg.train.steps))
    monkeypatch.chdir(tmp_path)
    params = tmp_path / "params.yaml"
    params.write_text(PARAMS)
    killed = _start(OVERRIDDEN_RUN, tmp_path, 333, 600)
    killed.kill()
    killed.wait()
    assert cli.main(["prepare"]) == 0
    assert params.read_text() == PARAMS and seen == [300]
    out = capsys.readouterr().out
    assert f"params.yaml: a run (pid {killed.pid}, since " in out
    assert "with overrides train.steps=333 was stopped before it put the file back; put back as it was" in out
    # killed again, and the user edits the file before the next command: theirs stands
    killed = _start(OVERRIDDEN_RUN, tmp_path, 333, 600)
    killed.kill()
    killed.wait()
    params.write_text(PARAMS.replace("300", "350"))
    assert cli.main(["prepare"]) == 0
    assert params.read_text() == PARAMS.replace("300", "350") and seen == [300, 350]
    assert (tmp_path / "params.yaml.before-overrides").read_text() == PARAMS
    assert "and the file was edited since; left as it is" in capsys.readouterr().out


def test_a_command_that_waited_for_a_flow_runs_on_the_users_params_not_the_flows(tmp_path, monkeypatch):
    """Started while a flow's overrides were in params.yaml, `dots train` read them, waited for the
    flow, and then trained the user's run with the flow's `train.steps`."""
    from dots import cli, stages

    seen = []
    monkeypatch.setattr(stages, "prepare", lambda cfg: seen.append(cfg.train.steps))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(PARAMS)
    flow = _start(OVERRIDDEN_RUN, tmp_path, 40, 1.5)
    assert cli.main(["prepare"]) == 0
    assert flow.communicate(timeout=60)[0].split() == ["saw", "40", "40"]
    assert seen == [300]


def test_a_command_outside_a_running_flow_reads_the_users_params_not_the_flows(tmp_path, monkeypatch, capsys):
    """`make bench` or `dots plan` started while a nightly variant's overrides were in params.yaml
    read the variant for the user's params (a bench would bench the variant). They read the user's
    own file, saying so; the flow's stages (which inherit its hold) read the overridden one."""
    from dots.config import load_config, params_file

    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(PARAMS)
    flow = _start(OVERRIDDEN_RUN, tmp_path, 40, 600)
    try:
        assert load_config("params.yaml").train.steps == 40  # the flow's variant is in the file
        assert load_config(params_file(None)).train.steps == 300
        said = capsys.readouterr().out
        assert f"params.yaml: holds the overrides of a run (pid {flow.pid}, since " in said
        assert "with overrides train.steps=40, which is running; reading your own file" in said
        monkeypatch.setenv(workspace_lock.HELD_ENV, json.dumps({str(tmp_path.resolve()): flow.pid}))
        assert load_config(params_file(None)).train.steps == 40  # the flow's own stage
    finally:
        flow.kill()
        flow.wait()
    monkeypatch.delenv(workspace_lock.HELD_ENV)
    assert load_config(params_file(None)).train.steps == 40  # a dead run's record: the next holder restores


def test_a_pid_reused_by_a_later_process_is_not_the_run_that_held_it(tmp_path):
    """Liveness is the pid and its start time: a run killed whose pid another process now has is
    dead, and its overrides are put back (by pid alone it looked alive, and they stayed)."""
    from dots.processes import pid_alive, process_started

    me = os.getpid()
    assert pid_alive(me, process_started(me)) and not pid_alive(me, process_started(me) - 60)
    params = tmp_path / "params.yaml"
    params.write_text(PARAMS)
    applied = PARAMS.replace("300", "333").encode()
    params_record.write(tmp_path, ["train.steps=333"], PARAMS.encode(), applied)
    params.write_bytes(applied)
    record = json.loads((tmp_path / params_record.RECORD).read_text())
    record["started"] -= 60  # the run that wrote it started a minute before this pid's process did
    (tmp_path / params_record.RECORD).write_text(json.dumps(record))
    said = []
    params_record.restore_if_killed(tmp_path, said.append)
    assert params.read_text() == PARAMS and len(said) == 1
    assert "was stopped before it put the file back" in said[0]
    assert not (tmp_path / params_record.RECORD).exists() and not (tmp_path / params_record.USERS).exists()


def test_a_flow_runs_hold_is_named_by_its_own_flow(tmp_path, monkeypatch):
    """The nightly comparison runs the pipeline as its subflow dots-compare-pipeline: a run waiting
    for it names that flow (what the UI shows), not the function's usual flow, dots-pipeline."""
    from flows.pipeline import workspace

    monkeypatch.setenv("PREFECT__RUNTIME__FLOW_RUN__NAME", "brave-otter")
    monkeypatch.setenv("PREFECT__RUNTIME__FLOW_RUN__FLOW_NAME", "dots-compare-pipeline")
    with workspace(str(tmp_path), "dots-pipeline"):
        assert holder(tmp_path)["what"] == "Prefect flow run brave-otter of dots-compare-pipeline"
    monkeypatch.delenv("PREFECT__RUNTIME__FLOW_RUN__FLOW_NAME")  # not in a flow run: the name given
    with workspace(str(tmp_path), "dots-pipeline"):
        assert holder(tmp_path)["what"] == "Prefect flow run brave-otter of dots-pipeline"


@pytest.mark.parametrize("flow", ["pipeline", "train", "version_data"])
def test_a_flow_given_a_folder_that_is_not_a_dots_repository_stops_at_once(tmp_path, flow):
    """Named before the flow takes the folder's lock (no lock file left there) or runs a stage: it
    failed in its first DVC stage, with DVC's words, after the stage's retries."""
    from flows.data import version_data
    from flows.pipeline import pipeline
    from flows.train import train_run

    run = {"pipeline": pipeline.fn, "train": train_run.fn, "version_data": version_data.fn}[flow]
    (tmp_path / "params.yaml").write_text(PARAMS)
    with pytest.raises(versioning.NotARepository, match=r"not a dots repository: no dvc.yaml; .*DOTS_REPO"):
        run(repo=str(tmp_path))
    with pytest.raises(versioning.NotARepository, match="no such folder"):
        run(repo=str(tmp_path / "elsewhere"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]  # no .dots.lock, nothing else


def test_the_deployments_pull_step_enters_a_repository_or_says_what_is_wrong(tmp_path, monkeypatch):
    """prefect.yaml's pull step (flows.steps.enter_repository): DOTS_REPO set nowhere ("" or the
    template left as is) and a folder that is not a repository are named; a repository is entered."""
    from flows.steps import enter_repository

    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(PARAMS)
    unset = "DOTS_REPO was set neither"
    for directory, said in (("", unset), ("{{ $DOTS_REPO }}", unset), (str(tmp_path), "no dvc.yaml")):
        with pytest.raises(versioning.NotARepository, match=said):
            enter_repository(directory)
    assert Path.cwd() == tmp_path
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "dvc.yaml").write_text("stages: {}\n")
    (repo / "params.yaml").write_text(PARAMS)
    assert enter_repository(str(repo)) == {"directory": str(repo)} and Path.cwd() == repo
