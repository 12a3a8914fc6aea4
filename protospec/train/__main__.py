"""python -m protospec.train: train the tokenizer, the target and the draft; save all three.

    python -m protospec.train --out data/models            # the pair of record (on a GPU: ~5 min)
    python -m protospec.train --out /tmp/pair --max-files 40 --steps 50 --batch-size 8   # a smoke run

Writes <out>/protospec-target and <out>/protospec-draft (config.json, model.safetensors in fp16,
tokenizer files) and <out>/train_report.json (corpus split, sizes, steps, held-out losses, times).
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from protospec.bench.provenance import provenance
from protospec.train.corpus import Corpus
from protospec.train.tokenizer import as_transformers, encode_files, train_tokenizer
from protospec.train.trainer import DRAFT_SIZE, TARGET_SIZE, TrainConfig, train_model


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m protospec.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="data/models")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--max-files", type=int, default=None, help="train on an evenly spaced subset (smoke runs)")
    p.add_argument("--steps", type=int, default=TrainConfig.steps)
    p.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    p.add_argument("--context", type=int, default=TrainConfig.context)
    p.add_argument("--eval-every", type=int, default=TrainConfig.eval_every, help="held-out check; the best checkpoint is kept")
    p.add_argument("--distill-weight", type=float, default=0.9,
                   help="draft loss = (1-w) next-token CE + w KL(target || draft); 0 trains the draft alone")
    p.add_argument("--target-from", default=None,
                   help="reuse this trained target checkpoint (and its tokenizer); train only the draft")
    p.add_argument("--max-minutes", type=float, default=9.0, help="wall-clock cap for both models (2/3 target, 1/3 draft)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None)
    args = p.parse_args(argv)
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

    base = TrainConfig(steps=args.steps, batch_size=args.batch_size, context=args.context, seed=args.seed,
                       eval_every=args.eval_every)
    budget = args.max_minutes * 60
    report = provenance(device, argv, "protospec.train") | {"corpus": corpus.describe(), "vocab_size": tok.get_vocab_size(),
                                                           "train_tokens": int(len(train_tokens)),
                                                           "heldout_tokens": int(len(heldout_tokens)), "models": {}}
    hf_tok = as_transformers(tok)
    jobs = [("protospec-target", TARGET_SIZE, 2 / 3), ("protospec-draft", DRAFT_SIZE, 1 / 3)]
    teacher = None
    if args.target_from:
        from transformers import LlamaForCausalLM

        teacher = LlamaForCausalLM.from_pretrained(args.target_from, dtype=torch.float32).to(device).eval()
        jobs = [("protospec-draft", DRAFT_SIZE, 1.0)]
    for name, size, share in jobs:
        print(f"training {name} ({size})", flush=True)
        is_draft = name == "protospec-draft"
        cfg = replace(base, max_seconds=budget * share, distill_weight=args.distill_weight if is_draft else 0.0)
        model, stats = train_model(size, tok.get_vocab_size(), train_tokens, heldout_tokens, cfg, device,
                                   teacher=teacher if is_draft else None)
        if not is_draft:
            teacher = model.eval()  # the draft learns from the target just trained
        out = Path(args.out) / name
        model.to(torch.float16).save_pretrained(out, safe_serialization=True)
        model.float()  # as the draft's teacher: exactly the fp16 weights saved, i.e. the target as deployed
        hf_tok.save_pretrained(out)
        stats["train_config"] = asdict(cfg)
        stats["bytes_on_disk"] = sum(f.stat().st_size for f in out.iterdir())
        report["models"][name] = stats
        print(f"  {name}: {stats['steps']} steps, held-out loss {stats['heldout_loss']:.3f} nats/token, "
              f"{stats['seconds']:.0f}s, {stats['bytes_on_disk'] / 1e6:.1f} MB", flush=True)
    report["seconds_total"] = time.perf_counter() - start
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "train_report.json").write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
