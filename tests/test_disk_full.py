"""A full disk: a write it cannot hold names the file and the space left, in one line, and keeps
the file it would have replaced, so the same command resumes once there is room. torch.save had
said only "[enforce fail at inline_container.cc:672] . unexpected pos 1705216 vs 1705104" when a
checkpoint filled the disk, in a forty-line traceback."""

from __future__ import annotations

import errno
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from dots import atomic
from dots.atomic import DiskFull, write_text
from dots.checkpoints import save_checkpoint

from .conftest import default_params, tiny_overrides


def _torch_save_that_fills_the_disk(obj, path):
    Path(path).write_bytes(b"x" * 4096)  # part of it reached the disk
    raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1705216 vs 1705104")


def test_a_checkpoint_that_fills_the_disk_keeps_the_previous_one(tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path, {"step": 20})
    before = path.read_bytes()
    monkeypatch.setattr(torch, "save", _torch_save_that_fills_the_disk)
    monkeypatch.setattr(atomic, "free_bytes", lambda folder: 0)
    with pytest.raises(DiskFull) as exc:
        save_checkpoint(tmp_path, {"step": 40})
    assert exc.value.errno == errno.ENOSPC
    assert exc.value.strerror == (f"{path}: its disk filled while writing it (0.0 MiB written, 0.0 "
                                  "MiB left): the previous checkpoint.pt is kept. Free space (or point "
                                  "paths.root elsewhere) and run the same command again")
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # no temporary file left behind


def test_a_library_error_with_room_on_the_disk_is_not_called_a_full_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "save", _torch_save_that_fills_the_disk)
    monkeypatch.setattr(atomic, "free_bytes", lambda folder: 10 * atomic.FULL_BELOW)
    with pytest.raises(RuntimeError, match="unexpected pos"):
        save_checkpoint(tmp_path, {"step": 40})
    assert list(tmp_path.iterdir()) == []


def test_the_os_saying_no_space_is_a_full_disk_whatever_is_left(tmp_path, monkeypatch):
    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(DiskFull, match=r"summary.json: its disk filled while writing it .*nothing was"):
        write_text(tmp_path / "summary.json", "{}")


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of its own (root only; skipped where mounting is not allowed)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _resize(mount: Path, kib: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={kib}k", str(mount)], check=True)


def _train_argv(root: Path, params: str, steps: int) -> list[str]:
    return ["train", "--method", "grpo", "-p", params, *[a for o in tiny_overrides(root) for a in ("-S", o)],
            "-S", "tracking.enabled=false", "-S", f"train.steps={steps}", "-S", "train.checkpoint_every=2"]


def _inputs(tiny_pipeline, root: Path) -> None:
    for part in ("data", "models"):  # what `dots train --method grpo` reads
        shutil.copytree(tiny_pipeline.root / part, root / part)


def test_dots_train_on_a_full_disk_says_so_in_one_line_and_resumes_once_there_is_room(
        tiny_pipeline, small_disk, tmp_path, capsys):
    """A real full disk: the tiny pipeline's inputs on a tmpfs with room for one checkpoint, not two
    (a checkpoint's next write needs its own size again beside the one it replaces)."""
    from dots.cli import main

    params = default_params(tmp_path)
    sizing = tmp_path / "sizing"
    _inputs(tiny_pipeline, sizing)
    assert main(_train_argv(sizing, params, 2)) == 0
    size = (sizing / "checkpoints" / "grpo" / "checkpoint.pt").stat().st_size
    root = small_disk / "artifacts"
    _inputs(tiny_pipeline, root)
    _resize(small_disk, (shutil.disk_usage(small_disk).used + size * 3 // 2) // 1024 + 64)
    capsys.readouterr()
    argv = _train_argv(root, params, 6)
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    ckpt = root / "checkpoints" / "grpo" / "checkpoint.pt"
    assert err.startswith(f"dots train: {ckpt}: its disk filled while writing it (")
    assert "the previous checkpoint.pt is kept" in err and len(err.splitlines()) == 1
    assert torch.load(ckpt, weights_only=True)["step"] == 2
    assert [p.name for p in ckpt.parent.iterdir()] == ["checkpoint.pt"]
    _resize(small_disk, 64 * 1024)  # room again: the same command goes on from its checkpoint
    assert main(argv) == 0
    assert "resuming from step 2" in capsys.readouterr().out
    assert torch.load(ckpt, weights_only=True)["step"] == 6


@pytest.mark.parametrize("error, said", [
    (OSError(errno.ENOSPC, "No space left on device", "artifacts/runs/grpo/records.jsonl"),
     "dots train: artifacts/runs/grpo/records.jsonl: no space left on its disk. Free space and run the "
     "command again"),
    (DiskFull(errno.ENOSPC, "artifacts/x: its disk filled while writing it"),
     "dots train: artifacts/x: its disk filled"),
])
def test_the_cli_says_a_full_disk_in_one_line(tmp_path, monkeypatch, capsys, error, said):
    """A write outside the atomic ones (a run's records are appended) fills the disk as well."""
    from dots import cli, stages

    def train(*args, **kwargs):
        raise error

    monkeypatch.setattr(stages, "train", train)
    argv = ["train", "--method", "grpo", "-p", default_params(tmp_path), "-S", f"paths.root={tmp_path / 'a'}",
            "-S", "tracking.enabled=false"]
    assert cli.main(argv) == 1
    assert capsys.readouterr().err.strip().startswith(said)
    monkeypatch.setattr(stages, "train", lambda *a, **k: (_ for _ in ()).throw(PermissionError(13, "denied")))
    with pytest.raises(PermissionError):  # any other OSError is not called a full disk
        cli.main(argv)


class _SafetensorError(Exception):
    """safetensors' own error: neither an OSError nor a RuntimeError."""


def _save_policy_that_fills_the_disk(model, tokenizer, folder, state_dict=None):
    Path(folder).mkdir(parents=True)
    (Path(folder) / "model.safetensors").write_bytes(b"x" * 4096)  # part of it reached the disk
    raise _SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })")


@pytest.mark.parametrize("free, raised", [(0, DiskFull), (10 * atomic.FULL_BELOW, _SafetensorError)])
def test_an_export_that_fills_the_disk_keeps_the_previous_model_folder(tmp_path, monkeypatch, free, raised):
    """The final policy's save_pretrained failing for want of space was safetensors' error in a
    traceback, after the whole run; now one line, the previous folder kept and no torn one left.
    With room on the disk the library's error stays itself."""
    from dots import export

    model = tmp_path / "runs" / "grpo" / "model"
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"the previous weights")
    monkeypatch.setattr(export, "save_policy", _save_policy_that_fills_the_disk)
    monkeypatch.setattr(atomic, "free_bytes", lambda folder: free)
    with pytest.raises(raised) as exc:
        export.write_model_folder(None, None, model, info={"method": "grpo"})
    if raised is DiskFull:
        assert exc.value.strerror == (
            f"{model}: its disk filled while the model was saved (0.0 MiB written, 0.0 MiB left once that "
            "was removed): the previous model folder is kept. Free space (or point paths.root elsewhere) and "
            "run the same command again (training resumes from its last checkpoint)")
    assert [p.name for p in model.parent.iterdir()] == ["model"]  # no temporary folder left behind
    assert (model / "model.safetensors").read_bytes() == b"the previous weights"
