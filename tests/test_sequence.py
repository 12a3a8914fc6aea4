"""A request's host-side state: the token slices the engine reads every step equal token_ids' own."""
import torch

from protospec import SamplingParams
from protospec.requests.sequence import Sequence


def test_token_slices_equal_token_ids_slices_on_either_side_of_the_prompt():
    seq = Sequence(0, [11, 12, 13, 14], SamplingParams(max_tokens=10, ignore_eos=True), torch.Generator())
    assert seq.tokens(-2) == [13, 14] and seq.tokens(0) == [11, 12, 13, 14]  # no output yet
    seq.append_tokens([21, 22, 23])
    n = seq.num_tokens
    for start in range(-n - 2, n + 2):
        assert seq.tokens(start) == seq.token_ids[start:], start
        for end in range(-n - 2, n + 2):
            assert seq.tokens(start, end) == seq.token_ids[start:end], (start, end)
    assert seq.tokens(-1)[0] == seq.last_token_id == 23 and seq.tokens(-2)[0] == 22
