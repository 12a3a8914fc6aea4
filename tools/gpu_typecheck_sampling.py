"""The sampling and rejection kernels' forms for gpu_typecheck (and the tools built on it): the sliced
samplers in every form, the one-launch Gumbel sample, the rejection kernel (filled and keyed noise, over
probabilities or logits),
the counter-based random fill and the n-gram matcher, on CPU tensors of
shapes that reach each compile-time variant."""
from __future__ import annotations

import torch


def sampling_and_rejection_forms() -> None:
    from protospec.kernels.randoms import counter_randoms
    from protospec.kernels.inputs import ngram_match
    from protospec.kernels.sampling import rejection, softmax_sample as sampling
    from protospec.kernels.sampling.gumbel_sample import gumbel_sample_into
    from protospec.kernels.sampling.slices import MAX_SPAN
    from protospec.kernels.sampling.stats import launch_stats
    from protospec.config import SamplingParams
    from protospec.speculation.sampler import SamplingTensors

    batch, k, vocab = 2, 3, 512
    st = SamplingTensors.build([SamplingParams(temperature=1.0), SamplingParams(temperature=0.0)],
                               [torch.Generator(), torch.Generator()], vocab, torch.device("cpu"))
    logits = torch.zeros(batch, vocab)
    draft = [torch.zeros(batch, k, dtype=torch.int64), torch.zeros(batch, k, vocab), torch.zeros(batch, k),
             torch.zeros(batch, k, vocab), torch.zeros(batch, vocab)]  # ids, q, u, recovered and bonus noise
    forms = [(dependent, span) for dependent in (False, True) for span in (1, MAX_SPAN)]
    for dependent, span in forms:  # plain launches and dependents that load before the wait; a slice a block or several
        sampling.sample_into(logits, st, 0, torch.zeros(batch, k, vocab), torch.zeros(batch, k, dtype=torch.int64),
                             torch.zeros(batch, k, vocab), torch.zeros(batch, dtype=torch.int64), dependent, span=span)
        sampling.probs_into(torch.zeros(batch * (k + 1), vocab), st, torch.zeros(batch * (k + 1), vocab), k + 1,
                            dependent, span=span)
        sampling.sample_into(logits, st, 0, torch.zeros(batch, k, vocab), torch.zeros(batch, k, dtype=torch.int64),
                             torch.zeros(batch, k, vocab), torch.zeros(batch, dtype=torch.int64), dependent,
                             _advance_launcher(batch), span=span)  # the form that advances the decode inputs too
        gumbel_sample_into(logits, st, 0, torch.zeros(batch, k, dtype=torch.int64), torch.ones(batch, k, vocab),
                           torch.zeros(batch, dtype=torch.int64), dependent, _advance_launcher(batch),
                           span=span)  # one launch
        gumbel_sample_into(logits, st, 0, torch.zeros(batch, 1, dtype=torch.int64), None,
                           torch.zeros(batch, dtype=torch.int64), dependent, span=span,
                           noise_keys=torch.zeros(batch, 2, dtype=torch.int64))  # target-only's: draws its noise
    rejection.rejection_sample_fused(draft[0], draft[1], torch.zeros(batch, k + 1, vocab), *draft[2:], span=1)
    rejection.rejection_sample_fused(draft[0], draft[1], torch.zeros(batch, k + 1, vocab), draft[2], None, None,
                                     noise_keys=torch.zeros(batch, 2, dtype=torch.int64),
                                     span=MAX_SPAN)  # a keyed step graph's, several slices a block
    rows = [launch_stats(torch.zeros(batch * n, vocab), st, n, "", True, finish=True) for n in (k, k + 1)]
    rejection.rejection_sample_fused(draft[0], draft[1], torch.zeros(batch, k + 1, vocab), draft[2], None, None,
                                     noise_keys=torch.zeros(batch, 2, dtype=torch.int64), span=MAX_SPAN,
                                     from_logits=(st, *rows))  # ... over logits and the rows' finished statistics
    counter_randoms.fill_kernel(torch.zeros(batch, 2, dtype=torch.int64), torch.zeros(batch, 2 * k + 1, vocab),
                                torch.zeros(batch, k))
    ngram_match.ngram_match(torch.zeros(batch, 40, dtype=torch.int64), torch.full((batch,), 30, dtype=torch.int64), 1, 3,
                            torch.zeros(batch, k, dtype=torch.int64), torch.zeros(batch, k, vocab),
                            torch.zeros(batch, dtype=torch.int64))


def _advance_launcher(rows: int):
    """An advance_step launcher over `rows` zeroed decode rows (one real), for the sampler's advancing form."""
    from protospec.kernels.inputs.advance_step import AdvanceStepLauncher

    int32, int64 = torch.int32, torch.int64
    return AdvanceStepLauncher(16, torch.ones(1, dtype=int32), torch.zeros(rows, dtype=int64),
                               torch.zeros(rows, dtype=int64), torch.zeros(rows, dtype=int64),
                               torch.ones(rows, dtype=int32), torch.zeros(rows, dtype=int64),
                               torch.zeros(rows, 3, dtype=int32), torch.zeros(1, dtype=int32), bind=False)
