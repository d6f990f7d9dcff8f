"""FSDP2 sharding (dots.sharding) on CPU with gloo and 2 processes (`tests/fsdp_worker.py`), float64:

- one sharded update (each rank's loss on its own rows, summing to the full-batch mean; backward;
  clip_grad_norm_; AdamW) gives the single-process update's weights and AdamW states, for a tiny
  GPT-2 and a tiny Qwen2, both with tied embeddings, while each rank holds about half the weights
  (and, in float32, whose gradients FSDP2 reduces differently, the same clip norm and close weights);
- `full_state_dict` loads into a plain model (same logits) and `load_full_state_dict` back into a
  sharded one, also with dim-0 sizes that do not divide by 2;
- greedy generation inside `gathered` runs with a different number of forwards on each rank and
  gives a plain model's tokens and log-probabilities.
"""

from __future__ import annotations


import pytest
import torch

from dots.sharding import transformer_blocks

from .conftest import torchrun
from .fsdp_worker import KINDS, MAX_NORM, build, reference_step


def test_blocks_are_found_or_refused():
    assert len(transformer_blocks(build("gpt2"))) == 2
    assert len(transformer_blocks(build("qwen2"))) == 2
    with pytest.raises(ValueError, match="cannot find the transformer blocks of Linear"):
        transformer_blocks(torch.nn.Linear(2, 2))


def test_two_process_fsdp_update_equals_single_process(tmp_path):
    initial = {}
    for kind in (*KINDS, "gpt2_uneven"):
        initial[kind] = build(kind).state_dict()
        torch.save(initial[kind], tmp_path / f"{kind}.pt")
    proc = torchrun(["-m", "tests.fsdp_worker", str(tmp_path), str(tmp_path)], timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]

    for kind in KINDS:
        ref = reference_step(kind, initial[kind])
        assert ref["norm"] > MAX_NORM, "the clip should act"
        assert any(not torch.equal(initial[kind][k], ref["state"][k]) for k in ref["state"])
        r0, r1 = ranks[0][kind], ranks[1][kind]
        assert r0["tied"] and r1["tied"], kind
        full = sum(v.numel() for v in build(kind).parameters())  # tied weights counted once
        assert r0["local_numel"] + r1["local_numel"] == full
        assert r0["exp_avg_sq_local_numel"] + r1["exp_avg_sq_local_numel"] == full
        assert max(r0["local_numel"], r1["local_numel"]) < 0.6 * full
        assert r0["loss"] + r1["loss"] == pytest.approx(ref["loss"], rel=1e-12)
        for r in (r0, r1):
            assert r["norm"] == pytest.approx(ref["norm"], rel=1e-10)
            assert set(r["state"]) == set(ref["state"]), kind
            for name, w in ref["state"].items():
                assert torch.allclose(r["state"][name], w, rtol=0, atol=1e-12), (kind, name)
            for name, s in ref["exp_avg_sq"].items():
                # g² of gradients that are rounding noise (GPT-2's key bias) differ relatively: atol
                assert torch.allclose(r["exp_avg_sq"][name], s, rtol=1e-9, atol=1e-12 * float(s.max())), (kind, name)
            assert r["plain_logits_diff"] < 1e-12, kind
            assert r["reload_equal"], kind
            ids, mask, lp = r["gen"]
            ids_p, mask_p, lp_p = r["gen_plain"]
            assert torch.equal(ids, ids_p) and torch.equal(mask, mask_p), kind
            assert torch.allclose(lp, lp_p, atol=1e-6), kind
        assert r0["gen"][0].shape != r1["gen"][0].shape  # the ranks really ran different generations

    ref = reference_step("gpt2", initial["gpt2"], torch.float32)
    for r in ranks:
        assert r["gpt2_float32"]["norm"] == pytest.approx(ref["norm"], rel=1e-5)
        for name, w in ref["state"].items():  # Adam's first step is ±lr where |g| >> eps: float32 noise
            assert torch.allclose(r["gpt2_float32"]["state"][name], w, rtol=0, atol=1e-4), name  # stays small

    assert [r["uneven"]["local_rows"] for r in ranks] == [17, 16]
    assert all(r["uneven"]["equal"] for r in ranks)
