"""python -m protospec.train: train the tokenizer, the target and the draft; save all three.

    python -m protospec.train                               # a pair under runs/ (under 10 min on a GPU)
    python -m protospec.train --out data/models --force     # replace the pair of record, on purpose
    python -m protospec.train --out /tmp/pair --max-files 40 --steps 50 --batch-size 8   # a smoke run

The target learns the corpus; then it writes continuations of training-corpus prompts (half greedy,
half sampled) and the draft learns from both the corpus and those samples, matching the target's
next-token distribution (KL) as well as the next token.

Writes <out>/protospec-target and <out>/protospec-draft (config.json, model.safetensors in fp16,
tokenizer files) and <out>/train_report.json (corpus split, sizes, steps, held-out losses, times).
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from protospec.bench.provenance import check_writable, provenance
from protospec.train.corpus import Corpus
from protospec.train.tokenizer import as_transformers, encode_files, train_tokenizer
from protospec.train.trainer import DRAFT_SIZE, TARGET_SIZE, TrainConfig, sample_from_teacher, train_model
from protospec.command_line import CommandParser, run_command


def main(argv=None) -> dict:
    p = CommandParser(prog="python -m protospec.train", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None,
                   help="where the pair goes (default: runs/pair_<date>_<time>); an existing non-empty directory "
                        "is refused without --force (data/models holds the pair the tests and notebooks use)")
    p.add_argument("--force", action="store_true", help="write into a non-empty --out")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--max-files", type=int, default=None, help="train on an evenly spaced subset (smoke runs)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--context", type=int, default=TrainConfig.context)
    p.add_argument("--target-epochs", type=float, default=6.0,
                   help="target training length in passes over the training tokens (the corpus is small: "
                        "more passes memorise it; early stopping keeps the best held-out checkpoint)")
    p.add_argument("--draft-epochs", type=float, default=30.0,
                   help="draft length in passes; its teacher's soft targets and samples keep it from memorising")
    p.add_argument("--steps", type=int, default=None, help="fixed step count for both models (smoke runs)")
    p.add_argument("--eval-every", type=int, default=100, help="held-out check; the best checkpoint is kept")
    p.add_argument("--distill-weight", type=float, default=0.9,
                   help="draft loss = (1-w) next-token CE + w KL(target || draft); 0 trains the draft alone")
    p.add_argument("--teacher-samples", type=int, default=8192,
                   help="sequences the trained target writes (from training-corpus prompts) for the draft; 0: none")
    p.add_argument("--sampled-fraction", type=float, default=0.5, help="share of each draft batch from those samples")
    p.add_argument("--target-from", default=None,
                   help="reuse this trained target checkpoint (and its tokenizer); train only the draft")
    p.add_argument("--max-minutes", type=float, default=9.0,
                   help="wall-clock cap for everything (the target gets 1/3, the draft what is left)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None)
    args = p.parse_args(argv)
    args.out = args.out or time.strftime("runs/pair_%Y-%m-%d_%H%M%S")
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not args.force:
        raise SystemExit(f"--out {out} exists and is not empty: pass --force to write over it, or choose another --out")
    check_writable(str(out), directory=True)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    start = time.perf_counter()

    corpus = Corpus.from_stdlib(args.max_files)
    train_texts, heldout_texts = corpus.read(corpus.train_files), corpus.read(corpus.heldout_files)
    if args.target_from:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(Path(args.target_from) / "tokenizer.json"))
    else:
        tok = train_tokenizer(train_texts, args.vocab_size)
    train_tokens, heldout_tokens = encode_files(tok, train_texts), encode_files(tok, heldout_texts)
    print(f"corpus: {len(train_texts)} train / {len(heldout_texts)} held-out files, "
          f"{len(train_tokens):,} / {len(heldout_tokens):,} tokens, tokenizer {time.perf_counter() - start:.0f}s", flush=True)

    budget = args.max_minutes * 60
    report = provenance(device, argv, "protospec.train") | {"corpus": corpus.describe(), "vocab_size": tok.get_vocab_size(),
                                                           "train_tokens": int(len(train_tokens)),
                                                           "heldout_tokens": int(len(heldout_tokens)), "models": {}}
    hf_tok = as_transformers(tok)

    def config(epochs: float, seconds: float, **extra) -> TrainConfig:
        tokens_per_step = args.batch_size * args.context
        steps = args.steps or max(1, round(epochs * len(train_tokens) / tokens_per_step))
        return TrainConfig(steps=steps, batch_size=args.batch_size, context=args.context, seed=args.seed,
                           eval_every=args.eval_every, max_seconds=seconds, **extra)

    def save(name: str, model, stats: dict, cfg: TrainConfig) -> None:
        out = Path(args.out) / name
        model.to(torch.float16).save_pretrained(out, safe_serialization=True)
        model.float()  # as the draft's teacher: exactly the fp16 weights saved, i.e. the target as deployed
        hf_tok.save_pretrained(out)
        stats["train_config"] = asdict(cfg)
        stats["bytes_on_disk"] = sum(f.stat().st_size for f in out.iterdir())
        report["models"][name] = stats
        print(f"  {name}: {stats['steps']} steps (kept {stats['best_step']}), held-out loss {stats['heldout_loss']:.3f} "
              f"nats/token, {stats['seconds']:.0f}s, {stats['bytes_on_disk'] / 1e6:.1f} MB", flush=True)

    if args.target_from:
        from transformers import LlamaForCausalLM

        teacher = LlamaForCausalLM.from_pretrained(args.target_from, dtype=torch.float32).to(device).eval()
    else:
        cfg = config(args.target_epochs, budget / 3)
        print(f"training protospec-target ({TARGET_SIZE}), {cfg.steps} steps at most", flush=True)
        teacher, stats = train_model(TARGET_SIZE, tok.get_vocab_size(), train_tokens, heldout_tokens, cfg, device)
        save("protospec-target", teacher, stats, cfg)
        teacher.eval()  # the draft learns from the target just trained

    samples = None
    if args.teacher_samples and args.distill_weight > 0:
        sample_start = time.perf_counter()
        samples = sample_from_teacher(teacher, train_tokens, args.teacher_samples, prompt_len=32,
                                      length=args.context + 1, device=device, seed=args.seed)
        report["teacher_samples"] = {"sequences": len(samples), "tokens": samples.numel(), "prompt_len": 32,
                                     "greedy_share": 0.5, "seconds": time.perf_counter() - sample_start}
        print(f"target wrote {samples.numel():,} tokens for the draft in {report['teacher_samples']['seconds']:.0f}s", flush=True)
    draft_seconds = max(10.0, 0.97 * budget - (time.perf_counter() - start))
    cfg = config(args.draft_epochs, draft_seconds, distill_weight=args.distill_weight,
                 sampled_fraction=args.sampled_fraction if samples is not None else 0.0)
    print(f"training protospec-draft ({DRAFT_SIZE}), {cfg.steps} steps or {draft_seconds:.0f}s at most", flush=True)
    draft, stats = train_model(DRAFT_SIZE, tok.get_vocab_size(), train_tokens, heldout_tokens, cfg, device,
                               teacher=teacher if args.distill_weight > 0 else None, teacher_samples=samples)
    save("protospec-draft", draft, stats, cfg)
    report["seconds_total"] = time.perf_counter() - start
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "train_report.json").write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    run_command(main)
