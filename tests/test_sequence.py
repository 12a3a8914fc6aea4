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


def test_appending_stops_at_the_budget_or_the_stop_token_whichever_comes_first():
    def seq(max_tokens, ignore_eos=False):
        return Sequence(0, [1, 2], SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos), torch.Generator(),
                        eos_token_id=9)

    s = seq(4)
    assert s.append_tokens([5, 6, 7]) == 3 and not s.finished
    assert s.append_tokens([8, 8, 8]) == 1 and s.output_token_ids == [5, 6, 7, 8] and s.finish_reason == "length"
    assert s.append_tokens([3]) == 0 and s.output_token_ids == [5, 6, 7, 8]  # finished: nothing more
    s = seq(10)
    assert s.append_tokens([5, 9, 6]) == 2 and s.output_token_ids == [5, 9] and s.finish_reason == "stop"
    s = seq(2)
    assert s.append_tokens([5, 9, 6]) == 2 and s.finish_reason == "stop"  # the stop token on the budget's last
    s = seq(10, ignore_eos=True)
    assert s.append_tokens([5, 9, 6]) == 3 and not s.finished
