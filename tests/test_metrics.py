from protospec.requests.metrics import RequestMetrics


def test_metric_definitions():
    m = RequestMetrics()
    m.record_step(k=4, num_accepted=4, num_emitted=5, num_passed=4)
    m.record_step(k=4, num_accepted=1, num_emitted=2, num_passed=3)  # positions 3, 4 passed but were discarded
    m.record_step(k=4, num_accepted=0, num_emitted=1, num_passed=0)
    assert m.acceptance_rate == 7 / 12            # vLLM's count: every passed test
    assert m.prefix_acceptance_rate == 5 / 12     # only what reached the output
    assert m.system_efficiency == 8 / 15
    assert m.mean_accepted_len == 1 + 5 / 3
    assert m.per_position_acceptance == [2 / 3, 1 / 3, 1 / 3, 1 / 3]
    total = RequestMetrics()
    total.merge(m)
    total.merge(m)
    assert total.num_draft_tokens == 24 and total.acceptance_rate == m.acceptance_rate
    assert total.prefix_acceptance_rate == m.prefix_acceptance_rate
    assert total.per_position_acceptance == m.per_position_acceptance


def test_target_only_has_no_speculative_rates():
    m = RequestMetrics(num_output_tokens=10, elapsed_s=2.0)
    assert m.acceptance_rate is None and m.system_efficiency is None and m.tokens_per_second == 5.0


def test_record_step_rejects_inconsistent_counts():
    import pytest

    with pytest.raises(ValueError, match="passed"):
        RequestMetrics().record_step(k=4, num_accepted=2, num_emitted=3, num_passed=1)
