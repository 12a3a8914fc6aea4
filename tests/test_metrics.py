from protospec.metrics import RequestMetrics


def test_metric_definitions():
    m = RequestMetrics()
    m.record_step(k=4, num_accepted=4, num_emitted=5)
    m.record_step(k=4, num_accepted=1, num_emitted=2)
    m.record_step(k=4, num_accepted=0, num_emitted=1)
    assert m.acceptance_rate == 5 / 12
    assert m.system_efficiency == 8 / 15
    assert m.mean_accepted_len == 1 + 5 / 3
    assert m.per_position_acceptance == [2 / 3, 1 / 3, 1 / 3, 1 / 3]
    total = RequestMetrics()
    total.merge(m)
    total.merge(m)
    assert total.num_draft_tokens == 24 and total.acceptance_rate == m.acceptance_rate
    assert total.per_position_acceptance == m.per_position_acceptance


def test_target_only_has_no_speculative_rates():
    m = RequestMetrics(num_output_tokens=10, elapsed_s=2.0)
    assert m.acceptance_rate is None and m.system_efficiency is None and m.tokens_per_second == 5.0
