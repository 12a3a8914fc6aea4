"""A byte-level BPE tokenizer trained on the corpus (the `tokenizers` library), saved in the
Hugging Face format so transformers and protospec load it alike. Special tokens follow the Llama
configs protospec bundles: <s> = 0 (bos), <pad> = 1, </s> = 2 (eos)."""
from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ["<s>", "<pad>", "</s>"]
BOS_ID, PAD_ID, EOS_ID = 0, 1, 2  # their ids, in that order


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def encode_files(tok: Tokenizer, texts: list[str]):
    """One uint16 token stream: each file's ids followed by </s>."""
    import numpy as np

    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(EOS_ID)
    return np.asarray(ids, dtype=np.uint16)


def as_transformers(tok: Tokenizer):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", pad_token="<pad>", eos_token="</s>",
                                   clean_up_tokenization_spaces=False)
