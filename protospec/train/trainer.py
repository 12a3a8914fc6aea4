"""Train one Llama on a token stream with AdamW (transformers' LlamaForCausalLM for the autograd
side), evaluate on held-out windows, save as a Hugging Face checkpoint that protospec loads too."""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from protospec.train.tokenizer import BOS_ID, EOS_ID, PAD_ID


@dataclass(frozen=True)
class ModelSize:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int


# ~6.1M and ~1.3M parameters with a 4096 vocab (tied embeddings): ~12.2 MB + ~2.6 MB in fp16; the
# draft costs ~4.7x fewer multiply-adds per token. The target is deep on purpose: at batch 1 on a GPU
# a forward's latency follows its kernel count (its depth), not its FLOPs, so a 12-layer target
# against a 2-layer draft is what gives speculation room to win (a 4-layer target did not: see NOTES).
# The draft keeps 2 layers (copying an identifier seen earlier needs two attention layers: an
# induction head) and spends its budget on width, which agreement with the target rewards.
TARGET_SIZE = ModelSize(hidden_size=192, num_hidden_layers=12, num_attention_heads=3, intermediate_size=512)
DRAFT_SIZE = ModelSize(hidden_size=160, num_hidden_layers=2, num_attention_heads=2, intermediate_size=448)


@dataclass
class TrainConfig:
    steps: int = 3000
    batch_size: int = 128
    context: int = 256
    lr: float = 2e-3
    warmup_steps: int = 100
    weight_decay: float = 0.1
    max_seconds: float = 300.0
    eval_windows: int = 256
    eval_every: int = 200      # held-out check; the best checkpoint is kept (the corpus is small: 3-9M tokens)
    distill_weight: float = 0.0  # with a teacher: loss = (1 - w) * next-token CE + w * KL(teacher || student)
    sampled_fraction: float = 0.0  # with teacher samples: this share of each batch's rows comes from them
    seed: int = 0


def llama_config(size: ModelSize, vocab_size: int, max_positions: int = 1024):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=size.hidden_size, intermediate_size=size.intermediate_size,
        num_hidden_layers=size.num_hidden_layers, num_attention_heads=size.num_attention_heads,
        num_key_value_heads=size.num_attention_heads, max_position_embeddings=max_positions, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
        initializer_range=0.02,
    )


def macs_per_token(size: ModelSize, vocab_size: int) -> int:
    """Multiply-adds of one decode token (matmuls only): what makes a draft cheaper."""
    h, i = size.hidden_size, size.intermediate_size
    return size.num_hidden_layers * (4 * h * h + 3 * h * i) + h * vocab_size


def windows(tokens: np.ndarray, starts: np.ndarray, length: int) -> torch.Tensor:
    return torch.from_numpy(np.stack([tokens[s : s + length] for s in starts]).astype(np.int64))


def learning_rate(step: int, progress: float, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine down to 10%. progress in [0, 1] is the larger of the step and
    the wall-clock fractions, so the schedule anneals on whichever budget runs out first."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


@torch.no_grad()
def heldout_loss(model, tokens: np.ndarray, cfg: TrainConfig, device, num_windows: int | None = None,
                 teacher=None) -> float:
    """Mean next-token loss (nats) over fixed, seeded held-out windows; with a teacher, the mean
    KL(teacher || model) instead (a distilled draft is chosen by how well it matches its target)."""
    model.eval()
    starts = np.random.default_rng(cfg.seed + 1).integers(0, len(tokens) - cfg.context - 1, num_windows or cfg.eval_windows)
    total, count = 0.0, 0
    for chunk in np.array_split(starts, max(1, len(starts) // 32)):
        batch = windows(tokens, chunk, cfg.context + 1).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            if teacher is None:
                loss = model(input_ids=batch, labels=batch).loss
            else:
                loss = distillation_loss(model(input_ids=batch).logits, teacher(input_ids=batch).logits)
            total += loss.item() * len(chunk)
        count += len(chunk)
    model.train()
    return total / count


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) per token, averaged: the draft learns the target's whole next-token
    distribution, which is what decides acceptance (DistillSpec, Zhou et al. 2023), not just the
    corpus' next token."""
    student = torch.log_softmax(student_logits.float(), dim=-1).flatten(0, -2)
    teacher = torch.log_softmax(teacher_logits.float(), dim=-1).flatten(0, -2)
    return torch.nn.functional.kl_div(student, teacher, log_target=True, reduction="batchmean")


@torch.no_grad()
def sample_from_teacher(teacher, train_tokens: np.ndarray, num_seqs: int, prompt_len: int, length: int,
                        device, seed: int, batch_size: int = 512) -> torch.Tensor:
    """[num_seqs, length] int64 on the CPU: training-corpus prompts of prompt_len tokens continued by the
    teacher, half of the batches greedily and half at temperature 1. A draft is scored on the
    target's own continuations, so it learns from them too (DistillSpec's on-policy data)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    rng = np.random.default_rng(seed)
    rows = []
    for i, start in enumerate(range(0, num_seqs, batch_size)):
        n = min(batch_size, num_seqs - start)
        ids = windows(train_tokens, rng.integers(0, len(train_tokens) - prompt_len, n), prompt_len).to(device)
        pieces = [ids]  # [n, prompt_len], then one [n, 1] per new token
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            out = teacher(input_ids=ids, use_cache=True)
            for _ in range(length - prompt_len):
                logits = out.logits[:, -1].float()  # [n, V]
                if i % 2 == 0:
                    nxt = logits.argmax(-1, keepdim=True)
                else:
                    nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)
                pieces.append(nxt)
                out = teacher(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
        rows.append(torch.cat(pieces, 1).cpu())
    return torch.cat(rows)


def train_model(size: ModelSize, vocab_size: int, train_tokens: np.ndarray, heldout_tokens: np.ndarray,
                cfg: TrainConfig, device: torch.device, log=print, teacher=None, teacher_samples=None):
    """Train from scratch; with `teacher` (a trained target) and cfg.distill_weight > 0, distil it.
    teacher_samples: [N, context + 1] sequences the teacher wrote, mixed into each batch at
    cfg.sampled_fraction."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    model = LlamaForCausalLM(llama_config(size, vocab_size)).to(device)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(0.9, 0.95), fused=device.type == "cuda")
    rng = np.random.default_rng(cfg.seed)
    start, step, recent = time.perf_counter(), 0, []
    best = (float("inf"), 0, None)  # (held-out loss, step, state dict on the CPU)
    num_sampled = round(cfg.batch_size * cfg.sampled_fraction) if teacher_samples is not None else 0
    while step < cfg.steps and (elapsed := time.perf_counter() - start) < cfg.max_seconds:
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, max(step / cfg.steps, elapsed / cfg.max_seconds), cfg)
        batch = windows(train_tokens, rng.integers(0, len(train_tokens) - cfg.context - 1, cfg.batch_size - num_sampled),
                        cfg.context + 1)
        if num_sampled:
            batch = torch.cat([batch, teacher_samples[rng.integers(0, len(teacher_samples), num_sampled)]])
        batch = batch.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            out = model(input_ids=batch, labels=batch)  # transformers shifts the labels itself
            loss = out.loss
            if teacher is not None and cfg.distill_weight > 0:
                with torch.no_grad():
                    teacher_logits = teacher(input_ids=batch).logits
                loss = (1 - cfg.distill_weight) * loss + cfg.distill_weight * distillation_loss(out.logits, teacher_logits)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        recent.append(loss.detach())
        if step % 100 == 0 or step == cfg.steps:
            log(f"    step {step}: train loss {torch.stack(recent).mean().item():.3f}, {time.perf_counter() - start:.0f}s")
            recent = []
        if step % cfg.eval_every == 0:
            # Early stopping: on a few million tokens a model starts memorising within minutes.
            loss = heldout_loss(model, heldout_tokens, cfg, device, num_windows=64,
                                teacher=teacher if cfg.distill_weight > 0 else None)
            if loss < best[0]:
                best = (loss, step, {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})
    seconds = time.perf_counter() - start
    if best[2] is not None:
        model.load_state_dict(best[2])
        what = "KL to the target" if teacher is not None and cfg.distill_weight > 0 else "loss"
        log(f"    kept the checkpoint of step {best[1]} (held-out {what} {best[0]:.3f} on 64 windows)")
    stats = {"size": asdict(size), "parameters": sum(p.numel() for p in model.parameters()),
             "macs_per_token": macs_per_token(size, vocab_size), "steps": step, "best_step": best[1] or step,
             "seconds": seconds,
             "tokens_seen": step * cfg.batch_size * cfg.context, "heldout_loss": heldout_loss(model, heldout_tokens, cfg, device)}
    if teacher is not None and cfg.distill_weight > 0:
        stats["heldout_kl_to_target"] = heldout_loss(model, heldout_tokens, cfg, device, teacher=teacher)
    return model, stats
