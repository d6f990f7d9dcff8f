"""A lean incremental decoder for the embedded GPT-2 policy, used by the `hf` rollout engine.

Why: prompts are about three quarters of each row's tokens (a 15-character sum against a
5-token answer), and a group's G samples share one prompt. transformers' generation runs
every row's prompt, so this module runs each distinct prompt once and copies its keys and
values to its G samples, in rollouts (`GPT2Decoder`) and in the update's forward and
backward (`shared_prompt_hidden`). It uses the same GPT-2 math straight on the model's own
weights (no copy, so it always samples the current policy), one preallocated key/value
buffer per layer, and `scaled_dot_product_attention` (the update's forward a plain masked
softmax instead, see `_attention_weights`); skipping the framework's per-call work gave
about two fifths of the rollout gain (0.116 s to 0.089 s for 64 x 8), prompt sharing the
rest (to 0.046 s).

It serves only the plain GPT-2 layout that `dots.models.build_model` makes; anything else
(`supports` says False) keeps the transformers path. `tests/test_fast_decode.py` checks
that both paths give the same log-probabilities at every step.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def supports(model: torch.nn.Module) -> bool:
    """True for a GPT2LMHeadModel in the layout this decoder reproduces exactly."""
    cfg = getattr(model, "config", None)
    return (type(model).__name__ == "GPT2LMHeadModel" and cfg is not None
            and cfg.activation_function in ("gelu_new", "gelu_pytorch_tanh")
            and cfg.scale_attn_weights and not cfg.scale_attn_by_inverse_layer_idx
            and not cfg.reorder_and_upcast_attn and not cfg.add_cross_attention
            and model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr())


class GPT2Decoder:
    """prefill(ids, attn, pos) -> last-position logits; step(tok, pos) -> next logits.

    Left-padded prompts: `attn` marks real tokens. A padded query attends to itself only,
    so no row of the softmax is empty (which would put NaNs into the cache).
    """

    def __init__(self, model: torch.nn.Module, max_new_tokens: int):
        self.model = model
        self.cfg = model.config
        self.heads = self.cfg.n_head
        self.head_dim = self.cfg.n_embd // self.cfg.n_head
        self.max_new_tokens = max_new_tokens
        self.blocks = model.transformer.h

    def _layers(self, h: torch.Tensor, mask: torch.Tensor, at: slice) -> torch.Tensor:
        """Run every block on hidden states h for cache positions `at`, attending under `mask`."""
        eps, n_embd = self.cfg.layer_norm_epsilon, self.cfg.n_embd
        for i, block in enumerate(self.blocks):
            q, k, v = _block(block, h, eps, n_embd, self.heads)
            self.k[i][:, :, at] = k
            self.v[i][:, :, at] = v
            o = F.scaled_dot_product_attention(q, self.k[i][:, :, : at.stop], self.v[i][:, :, : at.stop],
                                               attn_mask=mask, scale=1.0 / math.sqrt(self.head_dim))
            h = _finish(block, h, o, eps, n_embd)
        return h

    def prefill(self, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """Run the prompts; `rows` (optional) maps each sequence to its prompt, so a prompt
        sampled G times is run once and its keys/values copied G times."""
        n, width = ids.shape
        total = width + self.max_new_tokens
        dtype, device = self.model.transformer.wte.weight.dtype, ids.device
        # with `rows`, the prompts' own cache holds their positions only: copying it to the samples
        # then moves the filled positions, not the whole `total` each sample is given
        cached = width if rows is not None else total
        self.k = [torch.empty((n, self.heads, cached, self.head_dim), dtype=dtype, device=device)
                  for _ in self.blocks]
        self.v = [torch.empty_like(k) for k in self.k]
        causal = torch.ones((width, width), dtype=torch.bool, device=device).tril()
        eye = torch.eye(width, dtype=torch.bool, device=device)
        mask = causal & (attn.bool()[:, None, :] | eye)  # (n, W, W)
        h = self._layers(_embed(self.model, ids, pos), mask[:, None], slice(0, width))
        logits = _head(self.model, h[:, -1])
        if rows is not None:
            self.k = [_spread(k, rows, total) for k in self.k]
            self.v = [_spread(v, rows, total) for v in self.v]
            attn, logits = attn[rows], logits[rows]
        self.valid = torch.zeros((attn.shape[0], total), dtype=torch.bool, device=device)
        self.valid[:, :width] = attn.bool()
        self.length = width
        return logits

    def keep_rows(self, keep: torch.Tensor) -> bool:
        """Drop every row but `keep` (finished samples) from the cache; later steps take only those.
        One layer at a time, so the old layer is freed before the next is copied: the peak stays
        the full cache plus one layer's copy, inside what `dots.memory_plan` plans for rollouts."""
        for cache in (self.k, self.v):
            for i in range(len(cache)):
                cache[i] = cache[i][keep]
        self.valid = self.valid[keep]
        return True

    def step(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        at = self.length
        self.valid[:, at] = True
        self.length += 1
        mask = self.valid[:, None, None, : self.length]  # (n, 1, 1, T)
        h = self._layers(_embed(self.model, tok[:, None], pos), mask, slice(at, at + 1))
        return _head(self.model, h[:, -1])


def _spread(cache: torch.Tensor, rows: torch.Tensor, total: int) -> torch.Tensor:
    """A (rows, H, total, d) cache whose first positions are `cache`'s row `rows[i]` for each i:
    each sample gets its prompt's keys or values and room for `total` positions, the rest unfilled.
    Copying only the filled positions moves and holds less memory than copying all `total`; a
    rollout's seconds did not change measurably (64 x 8, 60 rounds: 67.1 against 67.6 ms)."""
    out = cache.new_empty((rows.shape[0], cache.shape[1], total, cache.shape[3]))
    out[:, :, : cache.shape[2]] = cache[rows]
    return out


def _embed(model: torch.nn.Module, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    tr = model.transformer
    return tr.wte(ids) + tr.wpe(pos)


def _head(model: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """Final LayerNorm and the tied output projection."""
    tr = model.transformer
    h = F.layer_norm(h, (h.shape[-1],), tr.ln_f.weight, tr.ln_f.bias, model.config.layer_norm_epsilon)
    return h @ tr.wte.weight.t()


def _block(block, h: torch.Tensor, eps: float, n_embd: int, heads: int):
    """LayerNorm and q/k/v of one block for hidden states h: (n, T, E) -> three (n, H, T, d)."""
    return _heads(_qkv(block, h, eps, n_embd), n_embd, heads)


def _qkv(block, h: torch.Tensor, eps: float, n_embd: int) -> torch.Tensor:
    """LayerNorm and the fused q/k/v projection: (..., E) -> (..., 3E), any leading shape."""
    return block.attn.c_attn(F.layer_norm(h, (n_embd,), block.ln_1.weight, block.ln_1.bias, eps))


def _heads(qkv: torch.Tensor, n_embd: int, heads: int) -> list[torch.Tensor]:
    """(n, T, 3E) fused q/k/v -> three (n, H, T, d)."""
    n, t = qkv.shape[:2]
    return [x.view(n, t, heads, n_embd // heads).transpose(1, 2) for x in qkv.split(n_embd, dim=2)]


def _finish(block, h: torch.Tensor, o: torch.Tensor, eps: float, n_embd: int) -> torch.Tensor:
    """Attention output projection, residual, then the MLP with its residual."""
    return _finish_merged(block, h, o.transpose(1, 2).reshape(h.shape), eps, n_embd)


def _finish_merged(block, h: torch.Tensor, o: torch.Tensor, eps: float, n_embd: int) -> torch.Tensor:
    """`_finish` for an attention output whose heads are already merged, o shaped like h."""
    h = h + block.attn.c_proj(o)
    m = F.layer_norm(h, (n_embd,), block.ln_2.weight, block.ln_2.bias, eps)
    return h + block.mlp.c_proj(F.gelu(block.mlp.c_fc(m), approximate="tanh"))


def _attention_weights(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax over the keys of scaled attention scores, keeping the keys where `mask` is True.

    Why the update does not call `scaled_dot_product_attention`: on CPU its fused kernel is
    made for long sequences; at the update's shapes (hundreds of rows of about 20 queries over
    30 keys, head size 16) its forward and backward were two fifths of the update, and this
    plain softmax, with the response rows' prompt and own keys scored apart instead of copied
    into one key/value tensor per row, cuts the update by a quarter to two fifths (56 groups x 8,
    side by side: 0.080-0.107 s to 0.062-0.076 s; in the bench the update's seconds per step fell
    by a quarter against the rollout's, docs/benchmark.md). The same math with float sums in
    another order: log-probs agree to 1e-5 (`tests/test_fast_decode.py`). Rollouts keep the fused
    kernel: there it was no slower.
    """
    return torch.softmax(scores.masked_fill(~mask, -math.inf), dim=-1)


def shared_prompt_logits(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         position_ids: torch.Tensor, prompt_width: int) -> torch.Tensor:
    """Logits that predict each response token, (N, L, V), for a training batch whose rows
    are [left-padded prompt | response], with autograd (see `shared_prompt_hidden`)."""
    return shared_prompt_hidden(model, input_ids, attention_mask, position_ids, prompt_width) @ \
        model.transformer.wte.weight.t()


def activation_checkpointing_on(model) -> bool:
    """Whether the model's activation checkpointing is on (`dots.models.enable_activation_checkpointing`),
    under either transformers name (is_activation_checkpointing, or is_gradient_checkpointing before 5.2x)."""
    if isinstance(getattr(type(model), "is_activation_checkpointing", None), property):
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))


def shared_prompt_hidden(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         position_ids: torch.Tensor, prompt_width: int) -> torch.Tensor:
    """Final hidden states (after the last LayerNorm) at the positions that predict each
    response token, (N, L, E), with autograd; the tied output projection turns them into
    logits (`shared_prompt_logits`), or `dots.loss` does so a chunk at a time.

    Why: a group's G samples share one prompt, and prompts are most of each row (a
    15-character sum against a 5-token answer), so running every prompt once and letting
    its G responses attend to the same keys/values cuts the update's work several times.
    Rows with the same prompt must be consecutive (as `dots.loss.collate` lays them out);
    the gradient of a shared prompt sums over its responses, as in the unshared forward.
    The responses' linear layers (q/k/v, projections, MLP: most of the work) run only on the
    positions that predict a real token, packed into one (T, E) matrix: a batch is padded to its
    longest answer, one runaway sample pads all the others, and in the embedded bench fewer than
    half of the padded response positions were real (dots_rr, 150 steps: 4.2 of 8.8 a row). That
    cut the update's forward and backward by a third (15 dots_rr batches of ~460 rows, one
    thread: 0.100 s to 0.065 s) with the same log-probs to the bit; the gradients differ in the
    order of float sums (~5e-7 relative). Attention still runs on the padded (N, L) layout.
    Prompts get the same treatment: their linear layers run on real (unpadded) positions only,
    packed, and in the last block only each prompt's last position goes on past the keys and
    values (nothing reads the others after it), so that block's prompt attention, projection and
    MLP run on one position a prompt. Both cut work where prompts weigh most, i.e. in batches of
    many small groups: on the bench's batches (one thread, side by side in one process) the
    update's forward and backward fell 10% for `dots_rr` (61 prompts of 4 rows) and 7% for
    `grpo` (27 of 8), hidden states within ~2e-6 (sums in another order). When every prompt has
    the same number of rows, those rows meet the prompt's keys and values in one matmul instead of
    a copy each (`_prompt_scores`, `_prompt_values`).
    With the model's activation checkpointing on (`train.gradient_checkpointing`), each block
    keeps only its inputs and recomputes the rest in the backward pass.
    """
    cfg = model.config
    tr = model.transformer
    eps, n_embd, heads = cfg.layer_norm_epsilon, cfg.n_embd, cfg.n_head
    scale = 1.0 / math.sqrt(n_embd // heads)
    n, width = input_ids.shape[0], prompt_width
    length = input_ids.shape[1] - width
    p_ids, p_attn = input_ids[:, :width], attention_mask[:, :width].bool()
    new = torch.ones(n, dtype=torch.bool, device=input_ids.device)
    new[1:] = (p_ids[1:] != p_ids[:-1]).any(-1) | (p_attn[1:] != p_attn[:-1]).any(-1)
    rows = new.long().cumsum(0) - 1
    first = new.nonzero().squeeze(-1)
    u_attn = p_attn[first]
    n_prompts = first.shape[0]
    g = _uniform_group_size(rows, n_prompts)
    at_p = u_attn.nonzero(as_tuple=True)  # the prompts' real positions, packed like the responses'
    ends = u_attn.sum(-1).cumsum(0) - 1  # each prompt's last position in that packing (left-padded)
    h = _embed(model, p_ids[first][at_p], position_ids[first, :width][at_p])  # (Tp, E)
    # Response position j is needed only if it predicts a real token (j + 1 within the answer):
    # the linear layers run on those positions alone, packed (most rows end long before the
    # batch's longest answer), and attention scatters them back to (N, L) with the rest masked.
    needed = torch.zeros((n, length), dtype=torch.bool, device=h.device)
    needed[:, :-1] = attention_mask[:, width + 1:].bool()
    at = needed.nonzero(as_tuple=True)
    r = _embed(model, input_ids[:, width:][at], position_ids[:, width:][at])  # (T, E)
    eye = torch.eye(width, dtype=torch.bool, device=h.device)
    mask_p = (torch.ones((width, width), dtype=torch.bool, device=h.device).tril() & (u_attn[:, None, :] | eye))
    causal_r = torch.cat([torch.ones((length, width), dtype=torch.bool, device=h.device),
                          torch.ones((length, length), dtype=torch.bool, device=h.device).tril()], dim=1)
    keys_r = torch.cat([u_attn[rows], needed], dim=1)
    mask_r = (causal_r[None] & keys_r[:, None, :])[:, None]  # (N, 1, L, W+L)

    def run_block(block, h, r, last_block):
        qkv_p = h.new_zeros((n_prompts, width, 3 * n_embd))
        qkv_p[at_p] = _qkv(block, h, eps, n_embd)  # padding: zero keys, masked; a padded query sees itself
        qp, kp, vp = _heads(qkv_p, n_embd, heads)
        qkv = r.new_zeros((n, length, 3 * n_embd))
        qkv[at] = _qkv(block, r, eps, n_embd)  # the packed positions, back in their (N, L) places
        qr, kr, vr = _heads(qkv, n_embd, heads)
        if last_block:  # only each prompt's last position is read after this block (it predicts
            # the first answer token): it alone queries, and goes through the projection and MLP
            op = _attention_weights(qp[:, :, -1:] @ kp.transpose(-1, -2) * scale, mask_p[:, -1:][:, None]) @ vp
            h, op = h[ends], op.reshape(n_prompts, n_embd)
        else:
            op = _attention_weights(qp @ kp.transpose(-1, -2) * scale, mask_p[:, None]) @ vp
            op = op.transpose(1, 2).reshape(n_prompts, width, n_embd)[at_p]
        a = _attention_weights(torch.cat([_prompt_scores(qkv, qr, kp, rows, g, heads),
                                          qr @ kr.transpose(-1, -2)], dim=-1) * scale,
                               mask_r)  # one softmax over [its prompt's keys | its own keys]
        orr = (_prompt_values(a[..., :width], vp, rows, g) + a[..., width:] @ vr)
        orr = orr.transpose(1, 2).reshape(n, length, n_embd)[at]
        return _finish_merged(block, h, op, eps, n_embd), _finish_merged(block, r, orr, eps, n_embd)

    recompute = activation_checkpointing_on(model) and model.training and torch.is_grad_enabled()
    for i, block in enumerate(tr.h):
        last_block = i == len(tr.h) - 1
        if recompute:
            h, r = checkpoint(run_block, block, h, r, last_block, use_reentrant=False)
        else:
            h, r = run_block(block, h, r, last_block)
    last = r.new_zeros((n, length, n_embd))
    last[:, 0] = h[rows]
    last[:, 1:][needed[:, :-1]] = r
    return F.layer_norm(last, (last.shape[-1],), tr.ln_f.weight, tr.ln_f.bias, cfg.layer_norm_epsilon)


def _uniform_group_size(rows: torch.Tensor, n_prompts: int) -> int:
    """g when every prompt of the batch has exactly g consecutive rows (`rows` maps each row to its
    prompt, in order), else 0: the update's prompt attention then scores a prompt's g rows in one
    matmul (`_prompt_scores`, `_prompt_values`), uneven batches keep one copy of the keys per row."""
    n = rows.shape[0]
    if n % n_prompts:
        return 0
    g = n // n_prompts
    return g if bool((rows == torch.arange(n, device=rows.device) // g).all()) else 0


def _prompt_scores(qkv: torch.Tensor, qr: torch.Tensor, kp: torch.Tensor, rows: torch.Tensor, g: int,
                   heads: int) -> torch.Tensor:
    """Each response row's queries against its prompt's keys, (N, H, L, W), unscaled.

    Why grouped: copying a prompt's keys to each of its rows (`kp[rows]`) moves G copies through
    memory and makes the backward a scatter-add; with g rows a prompt, the rows' g x L queries
    (`qkv`'s query part, (N, L, E), a view) meet the prompt's keys in one (g L x W) matmul. On the
    bench's saved batches (one thread) that cut `grpo`'s update forward + backward by 5-12%; in
    `make bench` the update's seconds over the rollout's fell 8-11% within each run for groups of 8
    and 2% for `dots_rr`'s groups of 3 (docs/benchmark.md, stop 55). The same scores (the
    log-probs agreed to the bit on `grpo`'s batches); the gradients sum in another order."""
    if not g:
        return qr @ kp[rows].transpose(-1, -2)
    n_prompts, _, width, d = kp.shape
    length = qkv.shape[1]
    q = qkv[..., : heads * d].reshape(n_prompts, g * length, heads, d).transpose(1, 2)  # (P, H, g L, d)
    s = (q @ kp.transpose(-1, -2)).view(n_prompts, heads, g, length, width)
    return s.transpose(1, 2).reshape(rows.shape[0], heads, length, width)


def _prompt_values(a: torch.Tensor, vp: torch.Tensor, rows: torch.Tensor, g: int) -> torch.Tensor:
    """The prompt part of each row's attention output, (N, H, L, d), from its weights over the
    prompt's keys `a` (N, H, L, W): one matmul a prompt when it has g rows, as `_prompt_scores`."""
    if not g:
        return a @ vp[rows]
    n_prompts, heads, width, d = vp.shape
    n, _, length, _ = a.shape
    w = a.reshape(n_prompts, g, heads, length, width).transpose(1, 2)
    w = w.reshape(n_prompts, heads, g * length, width)
    return (w @ vp).view(n_prompts, heads, g, length, d).transpose(1, 2).reshape(n, heads, length, d)
