#!/usr/bin/python3
"""ref_forward.py - independent float64 reference forward for deepseek2 and
qwen3moe GGUF models, used to check the C runtime's logits.

It reads the file with its own parser (gguf_read.py), computes the logits of
every position of a token sequence under teacher forcing (causal attention
over the expanded K/V, no cache), and writes the top-k per position as
    {"positions": [[[id, logit], ...], ...]}
the format `ecs-run --dump-logits` writes; optionally all logits as .npy.
The math follows shared/reference/model-shapes-{deepseek2,qwen3moe}.md and
ggml's public rope/YaRN formulas, written here from those descriptions.

Usage:
  ref_forward.py MODEL.gguf --tokens 100000,549,3399 [--top 8] [-o out.json] [--npy out.npy]
  ref_forward.py MODEL.gguf --tokens ... --compare ecs.json [--top 8] [--tol 1e-4]
      checks another engine's top-k dump of the same tokens: one entry per
      position, k entries each, every logit within tol of this forward, and
      every listed id within tol of this forward's k-th largest logit (so
      ties may be ordered either way). Near-tied expert choices may follow
      the engine (follow_ties).
  ref_forward.py MODEL.gguf --against llamacpp.json [--tol 0.1]
      teacher-forces the prompts + generated ids of a llama.cpp reference
      file and reports how far this forward is from its top-5 logits.
Options: --emulate-ggml rounds where llama.cpp-style engines round (Q8_0
activations before Q8_0 matmuls; q, K, V and attention probabilities to
F16); --mla expanded|absorbed picks which deepseek2 attention form those
F16 roundings apply to. Without --emulate-ggml everything is float64.
"""

import argparse
import json
import math
import sys

import numpy as np

from gguf_read import GGUFError, GGUFReader

REQUIRED = object()
OUT_CHUNK_ROWS = 8192  # output-head rows dequantized at a time


class ModelError(Exception):
    pass


# ---------------------------------------------------------------- helpers

def rms_norm(x, w, eps):
    x = np.asarray(x, dtype=np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def f16_round(x):
    return x.astype(np.float16).astype(np.float64)


def q8_0_round(x):
    """x quantized to Q8_0 blocks along the last axis and back, as ggml does
    to activations before a Q8_0 matmul (scale = amax/127 stored as f16)."""
    x32 = np.asarray(x, dtype=np.float32)
    b = x32.reshape(-1, 32)
    d = np.max(np.abs(b), axis=1, keepdims=True) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = np.trunc(b * inv + np.copysign(np.float32(0.5), b))     # roundf: half away from 0
    return (d.astype(np.float16).astype(np.float64) * q).reshape(x.shape)


def causal_attention(q, k, v, scale, kv_group=1, f16=False):
    """q [T, H, Dk], k [T, Hkv, Dk], v [T, Hkv, Dv] -> [T, H*Dv]; query head
    h reads KV head h // kv_group. f16 rounds q, k, v and the probabilities
    like ggml's f16 KV cache path (no flash attention)."""
    T, H, _ = q.shape
    if f16:
        q, k, v = f16_round(q), f16_round(k), f16_round(v)
    if kv_group > 1:
        k = np.repeat(k, kv_group, axis=1)
        v = np.repeat(v, kv_group, axis=1)
    scores = np.einsum("thd,shd->hts", q, k) * scale
    mask = np.triu(np.ones((T, T), dtype=bool), k=1)
    scores[:, mask] = -np.inf
    p = softmax(scores, axis=-1)
    if f16:
        p = f16_round(p)
    out = np.einsum("hts,shd->thd", p, v)
    return out.reshape(T, H * v.shape[-1])


class Rope:
    """ggml rope with YaRN (rope_yarn / ggml_rope_yarn_corr_dims) for one
    rotated width n_rot, in float64. mode 'norm' rotates (x[2i], x[2i+1]),
    mode 'neox' rotates (x[i], x[i + n_rot/2])."""

    def __init__(self, n_rot, mode, freq_base, freq_scale=1.0, ext_factor=0.0,
                 attn_factor=1.0, n_ctx_orig=4096, beta_fast=32.0, beta_slow=1.0):
        if n_rot % 2:
            raise ModelError(f"rope width {n_rot} is odd")
        self.n_rot, self.mode = n_rot, mode
        self.freq_base, self.freq_scale = freq_base, freq_scale
        self.ext_factor, self.attn_factor = ext_factor, attn_factor

        def corr_dim(beta):
            return n_rot * math.log(n_ctx_orig / (beta * 2 * math.pi)) / (2 * math.log(freq_base))
        self.low = max(0.0, math.floor(corr_dim(beta_fast)))
        self.high = min(n_rot - 1.0, math.ceil(corr_dim(beta_slow)))

    def cos_sin(self, pos):
        i = np.arange(self.n_rot // 2, dtype=np.float64)          # pair index = i0 / 2
        theta_extrap = np.asarray(pos, dtype=np.float64)[:, None] * \
            self.freq_base ** (-2.0 * i / self.n_rot)[None, :]
        theta = self.freq_scale * theta_extrap
        mscale = self.attn_factor
        if self.ext_factor != 0.0:
            y = (i - self.low) / max(0.001, self.high - self.low)
            ramp_mix = (1.0 - np.clip(y, 0.0, 1.0)) * self.ext_factor
            theta = theta * (1.0 - ramp_mix) + theta_extrap * ramp_mix
            mscale *= 1.0 + 0.1 * math.log(1.0 / self.freq_scale)
        return np.cos(theta) * mscale, np.sin(theta) * mscale

    def apply(self, x, pos):
        """x [T, H, n_rot] -> rotated copy."""
        c, s = self.cos_sin(pos)
        c, s = c[:, None, :], s[:, None, :]
        out = np.empty_like(x)
        if self.mode == "norm":
            x0, x1 = x[..., 0::2], x[..., 1::2]
            out[..., 0::2] = x0 * c - x1 * s
            out[..., 1::2] = x0 * s + x1 * c
        else:
            h = self.n_rot // 2
            x0, x1 = x[..., :h], x[..., h:]
            out[..., :h] = x0 * c - x1 * s
            out[..., h:] = x0 * s + x1 * c
        return out


# ---------------------------------------------------------------- model

class Model:
    def __init__(self, path, emulate_ggml=False, mla="expanded"):
        self.r = GGUFReader(path)
        # emulate_ggml: round activations the way llama.cpp's CPU path does
        # (Q8_0 activations for Q8_0 weights, f16 K/V/Q/probabilities), to
        # compare with llama.cpp's outputs far below its quantization noise.
        self.emulate = emulate_ggml
        # mla: "expanded" attends over per-head K/V; "absorbed" folds the K/V
        # up-projection into the query and the output and attends over the
        # latent. Equal in exact math; with emulate_ggml they differ in which
        # vectors get rounded to f16 (the engine's cache holds one or the other).
        if mla not in ("expanded", "absorbed"):
            raise ModelError(f"mla mode {mla!r}")
        self.mla = mla
        # Routing near-ties: every top-k decision's margin is logged as
        # (layer, position, margin); route_override[(layer, position)] swaps
        # the k-th and (k+1)-th expert there (see follow_ties).
        self.route_log = []
        self.route_override = set()
        self.arch = self.r.get("general.architecture")
        if self.arch not in ("deepseek2", "qwen3moe"):
            raise ModelError(f"{path}: architecture {self.arch!r} not supported")
        hp = self.hp
        self.n_layer = hp("block_count")
        self.n_embd = hp("embedding_length")
        self.n_head = hp("attention.head_count")
        self.n_head_kv = hp("attention.head_count_kv", self.n_head)
        self.eps = hp("attention.layer_norm_rms_epsilon")
        self.n_expert = hp("expert_count")
        self.n_expert_used = hp("expert_used_count")
        if not 0 < self.n_expert_used <= self.n_expert:
            raise ModelError(f"expert_used_count {self.n_expert_used} of {self.n_expert}")
        self.n_vocab = self.r.info("token_embd.weight").ne[1]
        self.out_name = "output.weight" if "output.weight" in self.r.tensors else "token_embd.weight"
        if self.arch == "deepseek2":
            self._init_deepseek2()
        else:
            self._init_qwen3moe()

    def hp(self, key, default=REQUIRED):
        full = f"{self.arch}.{key}"
        if full in self.r.kv:
            return self.r.kv[full]
        if default is REQUIRED:
            raise ModelError(f"{self.r.path}: required key {full} missing")
        return default

    def _rope_scaling(self, n_rot, mode):
        """freq_scale / ext_factor / n_ctx_orig from the rope.scaling keys, as
        llama.cpp derives them (yarn implies ext_factor 1)."""
        stype = self.hp("rope.scaling.type", "none")
        factor = float(self.hp("rope.scaling.factor", 0.0))
        freq_scale = 1.0 / factor if stype != "none" and factor > 0 else 1.0
        ext = 1.0 if stype == "yarn" else 0.0
        n_ctx_orig = self.hp("rope.scaling.original_context_length",
                             self.hp("context_length", 4096))
        return dict(n_rot=n_rot, mode=mode, freq_base=float(self.hp("rope.freq_base", 10000.0)),
                    freq_scale=freq_scale, ext_factor=ext, n_ctx_orig=n_ctx_orig)

    def _init_deepseek2(self):
        hp = self.hp
        self.n_rot = hp("rope.dimension_count")
        self.d_k = hp("attention.key_length")
        self.d_v = hp("attention.value_length")
        self.d_nope = self.d_k - self.n_rot
        self.kv_lora = hp("attention.kv_lora_rank")
        self.n_dense = hp("leading_dense_block_count")
        self.n_shared = hp("expert_shared_count")
        self.w_scale = float(hp("expert_weights_scale"))
        self.w_norm = bool(hp("expert_weights_norm", False))
        gating = hp("expert_gating_func", 1)
        if gating not in (0, 1, 2):
            raise ModelError(f"expert_gating_func {gating} unknown")
        self.gating = "sigmoid" if gating == 2 else "softmax"
        self.n_group = hp("expert_group_count", 0)
        self.n_group_used = hp("expert_group_used_count", 0)
        rs = self._rope_scaling(self.n_rot, "norm")
        # build_deepseek2 pre-scales: mscale^2 on the scores, and a rope
        # attn_factor that cancels rope_yarn's own magnitude correction.
        log_mul = float(hp("rope.scaling.yarn_log_multiplier"))
        inv_fs = 1.0 / rs["freq_scale"]
        mscale = 1.0 + log_mul * math.log(inv_fs)
        self.kq_scale = mscale * mscale / math.sqrt(self.d_k)
        self.rope = Rope(attn_factor=1.0 / (1.0 + 0.1 * math.log(inv_fs)), **rs)

    def _init_qwen3moe(self):
        hp = self.hp
        self.d_k = hp("attention.key_length", self.n_embd // self.n_head)
        self.d_v = hp("attention.value_length", self.d_k)
        self.n_rot = hp("rope.dimension_count", self.d_k)
        if not (self.d_k == self.d_v == self.n_rot):
            raise ModelError("qwen3moe needs key_length == value_length == rope dims")
        if self.n_head % self.n_head_kv:
            raise ModelError(f"{self.n_head} heads not divisible by {self.n_head_kv} KV heads")
        self.w_norm = bool(hp("expert_weights_norm", True))
        self.w_scale = float(hp("expert_weights_scale", 1.0))
        self.gating = "softmax"
        self.n_group = self.n_group_used = 0
        self.kq_scale = 1.0 / math.sqrt(self.d_k)
        self.rope = Rope(**self._rope_scaling(self.n_rot, "neox"))

    # ---- weights ----

    def has(self, name):
        return name in self.r.tensors

    def w(self, name, shape=None):
        t = self.r.tensor(name)
        if shape is not None and t.shape != tuple(shape):
            raise ModelError(f"tensor {name}: numpy shape {t.shape}, expected {tuple(shape)}")
        return t

    def act(self, x, weight_name):
        """The activation as the matmul with weight_name sees it."""
        if self.emulate and self.r.info(weight_name).type_name == "Q8_0":
            return q8_0_round(x)
        return x

    def lin(self, x, name, n_out):
        return self.act(x, name) @ self.w(name, (n_out, x.shape[-1])).T

    # ---- forward ----

    def forward(self, tokens):
        tokens = np.asarray(tokens, dtype=np.int64)
        if tokens.ndim != 1 or len(tokens) == 0:
            raise ModelError("need a non-empty token list")
        if tokens.min() < 0 or tokens.max() >= self.n_vocab:
            raise ModelError(f"token id outside [0, {self.n_vocab})")
        x = np.stack([self.r.rows("token_embd.weight", int(t), int(t) + 1)[0] for t in tokens])
        pos = np.arange(len(tokens))
        self.route_log = []
        for il in range(self.n_layer):
            b = f"blk.{il}."
            h = rms_norm(x, self.w(b + "attn_norm.weight"), self.eps)
            if self.arch == "deepseek2":
                x = x + self.attn_mla(h, pos, b)
            else:
                x = x + self.attn_gqa(h, pos, b)
            h = rms_norm(x, self.w(b + "ffn_norm.weight"), self.eps)
            if self.arch == "deepseek2" and il < self.n_dense:
                x = x + self.swiglu(h, b + "ffn_gate.weight", b + "ffn_up.weight",
                                    b + "ffn_down.weight")
            else:
                x = x + self.moe(h, b, il)
        h = rms_norm(x, self.w("output_norm.weight"), self.eps)
        return self.output_head(h)

    def output_head(self, h):
        n_rows = self.r.info(self.out_name).n_rows
        logits = np.empty((h.shape[0], n_rows))
        for s in range(0, n_rows, OUT_CHUNK_ROWS):
            e = min(n_rows, s + OUT_CHUNK_ROWS)
            logits[:, s:e] = self.act(h, self.out_name) @ self.r.rows(self.out_name, s, e).T
        return logits

    def attn_mla(self, h, pos, b):
        T, H = h.shape[0], self.n_head
        if self.has(b + "attn_q_a.weight"):
            q_lora = self.r.info(b + "attn_q_a.weight").ne[1]
            qa = rms_norm(self.lin(h, b + "attn_q_a.weight", q_lora),
                          self.w(b + "attn_q_a_norm.weight"), self.eps)
            q = self.lin(qa, b + "attn_q_b.weight", H * self.d_k)
        else:
            q = self.lin(h, b + "attn_q.weight", H * self.d_k)
        q = q.reshape(T, H, self.d_k)
        kv_a = self.lin(h, b + "attn_kv_a_mqa.weight", self.kv_lora + self.n_rot)
        ckv = rms_norm(kv_a[:, :self.kv_lora], self.w(b + "attn_kv_a_norm.weight"), self.eps)
        k_pe = self.rope.apply(kv_a[:, None, self.kv_lora:], pos)          # [T, 1, rot]
        q_pe = self.rope.apply(q[..., self.d_nope:], pos)
        if self.mla == "absorbed":
            return self.attn_mla_absorbed(q[..., :self.d_nope], q_pe, ckv, k_pe, b)
        kv = self.lin(ckv, b + "attn_kv_b.weight", H * (self.d_nope + self.d_v))
        kv = kv.reshape(T, H, self.d_nope + self.d_v)
        q_full = np.concatenate([q[..., :self.d_nope], q_pe], axis=-1)
        k_full = np.concatenate([kv[..., :self.d_nope],
                                 np.broadcast_to(k_pe, (T, H, self.n_rot))], axis=-1)
        o = causal_attention(q_full, k_full, kv[..., self.d_nope:], self.kq_scale,
                             f16=self.emulate)
        return self.lin(o, b + "attn_output.weight", self.n_embd)

    def attn_mla_absorbed(self, q_nope, q_pe, ckv, k_pe, b):
        """MLA over the latent: scores = (W_k^T q_nope).c + q_pe.k_pe,
        out = W_v (sum_t p_t c_t), per head."""
        T, H, L = q_nope.shape[0], self.n_head, self.kv_lora
        name = b + "attn_kv_b.weight"
        wkv_b = self.w(name, (H * (self.d_nope + self.d_v), L)).reshape(H, -1, L)
        q_abs = np.einsum("thn,hnl->thl", q_nope, wkv_b[:, :self.d_nope, :])
        q_cat = np.concatenate([q_abs, q_pe], axis=-1)
        k_cat = np.concatenate([ckv[:, None, :], k_pe], axis=-1)
        lat = causal_attention(q_cat, k_cat, ckv[:, None, :], self.kq_scale, kv_group=H,
                               f16=self.emulate).reshape(T, H, L)
        o = np.einsum("thl,hvl->thv", self.act(lat, name), wkv_b[:, self.d_nope:, :])
        return self.lin(o.reshape(T, H * self.d_v), b + "attn_output.weight", self.n_embd)

    def attn_gqa(self, h, pos, b):
        T, H, Hkv, D = h.shape[0], self.n_head, self.n_head_kv, self.d_k
        q = self.lin(h, b + "attn_q.weight", H * D).reshape(T, H, D)
        k = self.lin(h, b + "attn_k.weight", Hkv * D).reshape(T, Hkv, D)
        v = self.lin(h, b + "attn_v.weight", Hkv * D).reshape(T, Hkv, D)
        q = self.rope.apply(rms_norm(q, self.w(b + "attn_q_norm.weight"), self.eps), pos)
        k = self.rope.apply(rms_norm(k, self.w(b + "attn_k_norm.weight"), self.eps), pos)
        o = causal_attention(q, k, v, self.kq_scale, kv_group=H // Hkv, f16=self.emulate)
        return self.lin(o, b + "attn_output.weight", self.n_embd)

    def swiglu(self, h, gate, up, down):
        g = self.act(h, gate) @ self.w(gate).T
        u = self.act(h, up) @ self.w(up, g.shape[1:] + (h.shape[1],)).T
        return self.act(silu(g) * u, down) @ self.w(down, (self.n_embd, g.shape[1])).T

    def route(self, logits, bias, il=-1):
        """Expert ids [T, k] and weights [T, k] for router logits [T, n_expert]."""
        probs = softmax(logits) if self.gating == "softmax" else 1.0 / (1.0 + np.exp(-logits))
        choice = probs + bias if bias is not None else probs.copy()
        if self.n_group > 1 and 0 < self.n_group_used < self.n_group:
            # group-limited: keep the groups with the best top-2 sums
            T = choice.shape[0]
            g = choice.reshape(T, self.n_group, -1)
            gscore = np.sort(g, axis=-1)[..., -2:].sum(axis=-1)
            keep = np.argsort(-gscore, axis=-1, kind="stable")[:, :self.n_group_used]
            gmask = np.zeros((T, self.n_group), dtype=bool)
            np.put_along_axis(gmask, keep, True, axis=-1)
            choice = np.where(np.repeat(gmask, g.shape[-1], axis=-1), choice, -np.inf)
        k = self.n_expert_used
        order = np.argsort(-choice, axis=-1, kind="stable")
        if k < choice.shape[1]:
            ranked = np.take_along_axis(choice, order, axis=-1)
            for t, margin in enumerate(ranked[:, k - 1] - ranked[:, k]):
                self.route_log.append((il, t, float(margin)))
                if (il, t) in self.route_override:
                    order[t, [k - 1, k]] = order[t, [k, k - 1]]
        ids = order[:, :k]
        w = np.take_along_axis(probs, ids, axis=-1)
        if self.w_norm:
            w = w / np.sum(w, axis=-1, keepdims=True)
        return ids, w * self.w_scale

    def moe(self, h, b, il):
        n_ff = self.r.info(b + "ffn_gate_exps.weight").ne[1]
        gate_inp = self.w(b + "ffn_gate_inp.weight", (self.n_expert, self.n_embd))
        bias = None
        for name in (b + "exp_probs_b.bias", b + "exp_probs_b"):
            if self.has(name):
                bias = self.w(name, (self.n_expert,))
        ids, wts = self.route(h @ gate_inp.T, bias, il)
        shape_in = (self.n_expert, n_ff, self.n_embd)
        gate = self.w(b + "ffn_gate_exps.weight", shape_in)
        up = self.w(b + "ffn_up_exps.weight", shape_in)
        down = self.w(b + "ffn_down_exps.weight", (self.n_expert, self.n_embd, n_ff))
        out = np.zeros_like(h)
        for e in np.unique(ids):
            rows, slot = np.nonzero(ids == e)
            hg = self.act(h[rows], b + "ffn_gate_exps.weight")
            hu = self.act(h[rows], b + "ffn_up_exps.weight")
            a = silu(hg @ gate[e].T) * (hu @ up[e].T)
            y = self.act(a, b + "ffn_down_exps.weight") @ down[e].T
            out[rows] += wts[rows, slot][:, None] * y
        if self.arch == "deepseek2" and self.n_shared > 0:
            out += self.swiglu(h, b + "ffn_gate_shexp.weight", b + "ffn_up_shexp.weight",
                               b + "ffn_down_shexp.weight")
        return out


# ---------------------------------------------------------------- output

def top_k(row, k):
    """[[id, logit], ...] of the k largest logits, ties to the lower id."""
    k = min(k, row.shape[0])
    ids = np.lexsort((np.arange(row.shape[0]), -row))[:k]
    return [[int(i), float(row[i])] for i in ids]


def parse_tokens(s):
    parts = s.replace(",", " ").split()
    if not parts:
        raise ModelError("--tokens is empty")
    return [int(p) for p in parts]


def compare(logits, doc, k, tol):
    """Problems found in an engine's {"positions": ...} dump as (position,
    message) pairs (empty = pass), and the largest |logit difference| seen."""
    T, V = logits.shape
    kk = min(k, V)
    pos = doc.get("positions") if isinstance(doc, dict) else None
    if not isinstance(pos, list):
        return [(0, "no \"positions\" list in the dump")], 0.0
    if len(pos) != T:
        return [(0, f"{len(pos)} positions dumped for {T} tokens")], 0.0
    problems, maxd = [], 0.0
    for p, (row, top) in enumerate(zip(logits, pos)):
        if not isinstance(top, list) or len(top) != kk:
            problems.append((p, f"position {p}: expected {kk} [id, logit] pairs"))
            continue
        try:
            ids = [int(t[0]) for t in top]
            vals = [float(t[1]) for t in top]
        except (TypeError, ValueError, IndexError):
            problems.append((p, f"position {p}: malformed entry"))
            continue
        if len(set(ids)) != kk:
            problems.append((p, f"position {p}: duplicate ids {ids}"))
        if any(vals[i] < vals[i + 1] for i in range(kk - 1)):
            problems.append((p, f"position {p}: logits not in descending order"))
        kth = np.partition(row, V - kk)[V - kk]
        for tid, tl in zip(ids, vals):
            if not 0 <= tid < V:
                problems.append((p, f"position {p}: id {tid} outside the vocabulary"))
                continue
            d = abs(row[tid] - tl)
            maxd = max(maxd, d) if np.isfinite(d) else np.inf
            if not d <= tol:
                problems.append((p, f"position {p}: id {tid} logit {tl:.6f}, reference "
                                f"{row[tid]:.6f} (|diff| {d:.2e} > {tol:g})"))
            if row[tid] < kth - tol:
                problems.append((p, f"position {p}: id {tid} (reference {row[tid]:.6f}) is not "
                                f"in the reference top-{kk} (k-th {kth:.6f})"))
    return problems, maxd


def position_error(logits, doc, p):
    """Largest |difference| at position p over the ids the engine dumped."""
    return max(abs(logits[p][int(t)] - float(v)) for t, v in doc["positions"][p])


def follow_ties(model, tokens, logits, doc, k, tol, tie_eps, max_flips=8):
    """compare(), tolerant of near-tied expert choices.

    Random tiny models have routing decisions whose k-th and (k+1)-th
    expert differ by less than the two engines' rounding (a 27-layer model
    sees a few per 32 tokens); the engine may pick either, and the choice
    then spreads to every later position through the KV cache. When the
    comparison fails, the earliest near-tie (margin < tie_eps) at or before
    the first failing position is flipped; the flip is kept only if the
    first failure moves later or its error shrinks. A flip can only make a
    comparison pass if the engine really chose that runner-up expert, so a
    wrong engine still fails. Returns (problems, max diff, kept flips)."""
    problems, maxd = compare(logits, doc, k, tol)
    log, flips, tried = list(model.route_log), [], set()
    while problems and len(flips) < max_flips:
        first = min(p for p, _ in problems)
        cands = sorted((t, m, l) for l, t, m in log
                       if t <= first and m < tie_eps and (l, t) not in tried)
        if not cands:
            break
        t, m, l = cands[0]
        tried.add((l, t))
        model.route_override.add((l, t))
        new = model.forward(tokens)
        new_problems, new_maxd = compare(new, doc, k, tol)
        new_first = min((p for p, _ in new_problems), default=len(tokens))
        if new_first > first or (new_first == first and
                                  position_error(new, doc, first) <
                                  position_error(logits, doc, first)):
            logits, problems, maxd, log = new, new_problems, new_maxd, list(model.route_log)
            flips.append((l, t, m))
        else:
            model.route_override.discard((l, t))
    return problems, maxd, flips


def against(model, ref_path, tol):
    """Teacher-forces a llama.cpp reference file; returns 0 if every compared
    logit is within tol."""
    with open(ref_path) as f:
        ref = json.load(f)
    diffs, argmax_ok, argmax_n, top_overlap = [], 0, 0, []
    for res in ref["results"]:
        prompt, gen = res["prompt_ids"], res["generated_ids"]
        steps = res["top5_logits_per_step"]
        seq = prompt + gen[:len(steps) - 1]
        logits = model.forward(seq)
        d_res = []
        for i, top in enumerate(steps):
            row = logits[len(prompt) - 1 + i]
            d_res += [abs(row[tid] - tl) for tid, tl in top]
            mine = top_k(row, len(top))
            top_overlap.append(len({t for t, _ in mine} & {t for t, _ in top}))
            if len(top) > 1 and top[0][1] - top[1][1] > 2 * tol:
                argmax_n += 1
                argmax_ok += int(np.argmax(row) == top[0][0])
        diffs += d_res
        print(f"{res['name']}: {len(steps)} steps, max |diff| {max(d_res):.5f}, "
              f"mean {np.mean(d_res):.5f}")
    diffs = np.array(diffs)
    print(f"ALL: {len(diffs)} logits compared, max |diff| {diffs.max():.5f}, "
          f"mean {diffs.mean():.6f}, median {np.median(diffs):.6f}; "
          f"top-5 id overlap mean {np.mean(top_overlap):.2f}/5; "
          f"argmax agrees {argmax_ok}/{argmax_n} where the margin > {2 * tol}")
    return 0 if diffs.max() <= tol and argmax_ok == argmax_n else 1


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", help="token ids, comma or space separated")
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("-o", "--out", help="write the JSON here (default stdout)")
    ap.add_argument("--npy", help="also write all logits [T, n_vocab] as .npy")
    ap.add_argument("--against", help="llama.cpp reference JSON to compare with")
    ap.add_argument("--compare", help="an engine's --dump-logits JSON for the same --tokens")
    ap.add_argument("--tie-eps", type=float, default=1e-4,
                    help="--compare: expert-choice margins below this may follow the engine")
    ap.add_argument("--tol", type=float, default=None,
                    help="tolerance (default 1e-4 for --compare, 0.1 for --against)")
    ap.add_argument("--emulate-ggml", action="store_true",
                    help="round activations like llama.cpp's CPU path (Q8_0 / f16 KV)")
    ap.add_argument("--mla", choices=("expanded", "absorbed"), default="expanded",
                    help="deepseek2 attention form (matters only with --emulate-ggml)")
    a = ap.parse_args(argv)
    try:
        model = Model(a.model, emulate_ggml=a.emulate_ggml, mla=a.mla)
        if a.against:
            return against(model, a.against, 0.1 if a.tol is None else a.tol)
        if not a.tokens:
            ap.error("--tokens or --against is required")
        if a.top < 1:
            ap.error("--top must be >= 1")
        logits = model.forward(parse_tokens(a.tokens))
        if a.compare:
            with open(a.compare) as f:
                dump = json.load(f)
    except (GGUFError, ModelError, OSError, ValueError) as e:
        print(f"ref_forward: {e}", file=sys.stderr)
        return 2
    if a.compare:
        tol = 1e-4 if a.tol is None else a.tol
        problems, maxd, flips = follow_ties(model, parse_tokens(a.tokens), logits, dump,
                                            a.top, tol, a.tie_eps)
        for _, msg in problems[:20]:
            print(f"  {msg}")
        if len(problems) > 20:
            print(f"  ... {len(problems) - 20} more")
        ties = "".join(f", followed the engine's choice at near-tied expert "
                       f"layer {l} position {t} (margin {m:.1e})" for l, t, m in flips)
        print(f"{'FAIL' if problems else 'ok'}: {logits.shape[0]} positions, top-{a.top}, "
              f"max |diff| {maxd:.3e} (tol {tol:g}){ties}")
        return 1 if problems else 0
    doc = {"positions": [top_k(row, a.top) for row in logits]}
    text = json.dumps(doc)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    if a.npy:
        np.save(a.npy, logits)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
