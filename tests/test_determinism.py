"""Same seed, same run: a training run's numbers must not depend on how busy the machine is.

Before `dots.determinism` (torch's deterministic kernels), a 2-thread `dots_rr` run beside a
busy process left the quiet run's records after a few steps: some backward kernels add their
parts in an order set by thread timing. This runs the same short `dots_rr` training twice in
separate processes, the second while two processes spin on the machine's cores, and asks for
identical records (all but the seconds) and identical final weights.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import yaml

from .conftest import REPO

RUN = textwrap.dedent("""
    import sys
    from pathlib import Path
    from dots.config import load_config
    from dots import stages
    cfg = load_config(sys.argv[1])
    out = Path(sys.argv[2])
    stages.train(cfg, "dots_rr", resume=False, run_dir=out, checkpoint_dir=out / "ckpt")
""")
SPIN = "import time\nend = time.time() + 600\nwhile time.time() < end: pass\n"


def _train(params, out) -> tuple[list[dict], dict]:
    subprocess.run([sys.executable, "-c", RUN, str(params), str(out)], check=True, cwd=REPO, timeout=600,
                   capture_output=True)
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    records = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]
    weights = torch.load(out / "ckpt" / "checkpoint.pt", weights_only=True)["model"]
    return records, weights


@pytest.mark.parametrize("deterministic", [True])
def test_a_run_beside_a_busy_process_matches_a_quiet_one(tiny_pipeline, tmp_path, deterministic):
    raw = tiny_pipeline.model_dump()
    raw["train"].update(steps=16, batch_size=32, checkpoint_every=16, deterministic=deterministic, threads=2)
    raw["eval"].update(every=8, probe_size=32)
    raw["tracking"]["enabled"] = False
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    quiet = _train(params, tmp_path / "quiet")
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(2)]
    try:
        busy = _train(params, tmp_path / "busy")
    finally:
        for p in spinners:
            p.kill()
    assert len(quiet[0]) == 16
    for a, b in zip(quiet[0], busy[0]):
        assert a == b, f"step {a['step']}: records differ under load"
    assert quiet[1].keys() == busy[1].keys()
    for name in quiet[1]:
        assert torch.equal(quiet[1][name], busy[1][name]), name
