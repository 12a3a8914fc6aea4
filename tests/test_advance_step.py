"""The advance_step kernel against its twins: the torch reference and CPU prepare_inputs (invariant 3).
In CI the kernel runs in Numba's CUDA simulator; on a GPU the same tests run on the device."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from protospec.layout import NULL_BLOCK, PAD_SLOT_ID
from protospec.errors import KernelArgumentError
from protospec.model.inputs import prepare_inputs
from protospec.kernels.inputs.advance_step import AdvanceStepLauncher, advance_step, advance_step_reference
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE

DEV = torch.device(KERNEL_DEVICE_TYPE)
NAMES = ("num_queries", "sampled_ids", "input_ids", "positions", "seq_lens", "slot_mapping", "block_tables", "error_row")


def make_batch(num_queries, num_rows, block_size, seq_lens, seed):
    """Random persistent buffers; each real row's table covers its next position, padding rows garbage."""
    gen = torch.Generator().manual_seed(seed)
    max_blocks = max(-(-(n + 1) // block_size) for n in seq_lens) + 1
    tables = torch.randint(1, 1000, (num_rows, max_blocks), generator=gen, dtype=torch.int32)
    lens = torch.randint(0, 50, (num_rows,), generator=gen, dtype=torch.int32)
    lens[:num_queries] = torch.tensor(seq_lens, dtype=torch.int32)
    t = dict(
        num_queries=torch.tensor([num_queries], dtype=torch.int32),
        sampled_ids=torch.randint(0, 32000, (num_rows,), generator=gen),
        input_ids=torch.full((num_rows,), -7), positions=torch.full((num_rows,), -7),   # poisoned outputs
        seq_lens=lens, slot_mapping=torch.full((num_rows,), -7), block_tables=tables,
        error_row=torch.zeros(1, dtype=torch.int32),
    )
    return {k: v.to(DEV) for k, v in t.items()}


def run_kernel(t, block_size):
    advance_step(t["num_queries"], block_size, *(t[n] for n in NAMES[1:]))


@settings(max_examples=40, deadline=None)
@given(data=st.data(), num_rows=st.integers(1, 64), block_size=st.sampled_from([1, 4, 16]), seed=st.integers(0, 2**16))
def test_kernel_matches_torch_twin(data, num_rows, block_size, seed):
    num_queries = data.draw(st.integers(1, num_rows))
    # lengths at, just before and just after block boundaries, and anywhere
    edge = st.sampled_from([block_size * m + d for m in range(1, 4) for d in (-1, 0, 1)])
    seq_lens = data.draw(st.lists(st.one_of(edge, st.integers(1, 200)), min_size=num_queries, max_size=num_queries))
    kernel_side = make_batch(num_queries, num_rows, block_size, seq_lens, seed)
    twin_side = {k: v.clone() for k, v in kernel_side.items()}
    run_kernel(kernel_side, block_size)
    error = advance_step_reference(num_queries, block_size, *(twin_side[n] for n in NAMES[1:-1]))
    for name in NAMES[:-1]:
        assert torch.equal(kernel_side[name], twin_side[name]), name
    assert kernel_side["error_row"].item() == error == 0
    assert bool((kernel_side["slot_mapping"][num_queries:] == PAD_SLOT_ID).all())


@pytest.mark.parametrize("block_size", [4, 16])
def test_kernel_matches_cpu_prepare_inputs_for_a_decode_step(block_size):
    gen = torch.Generator().manual_seed(block_size)
    seq_lens = [1, block_size - 1, block_size, block_size + 1, 3 * block_size + 2]
    tables = [torch.randperm(60, generator=gen)[: -(-(n + 1) // block_size)].add(1).tolist() for n in seq_lens]
    width = max(map(len, tables))
    sampled = torch.randint(0, 1000, (len(seq_lens),), generator=gen)
    reference = prepare_inputs([[t] for t in sampled.tolist()], seq_lens, tables, block_size, 1, torch.device("cpu"), width)
    t = make_batch(len(seq_lens), len(seq_lens), block_size, seq_lens, 0)
    t["sampled_ids"] = sampled.to(DEV)
    t["block_tables"] = torch.tensor([tb + [NULL_BLOCK] * (width - len(tb)) for tb in tables], dtype=torch.int32, device=DEV)
    run_kernel(t, block_size)
    assert t["input_ids"].cpu().tolist() == reference.input_ids.tolist()
    assert t["positions"].cpu().tolist() == reference.positions.tolist()
    assert t["slot_mapping"].cpu().tolist() == reference.meta.slot_mapping.tolist()
    assert t["seq_lens"].cpu().tolist() == reference.meta.seq_lens.tolist()


def test_position_past_the_block_table_writes_nothing_and_is_reported():
    t = make_batch(3, 4, 4, [5, 9, 6], 0)
    t["block_tables"][1, 2:] = NULL_BLOCK  # row 1 needs block index 2 for position 9
    run_kernel(t, 4)
    assert t["slot_mapping"][1].item() == PAD_SLOT_ID and t["error_row"].item() == 2
    short = make_batch(1, 1, 4, [3], 0)
    short["seq_lens"][0] = 4 * short["block_tables"].shape[1]  # one past the table's last slot
    run_kernel(short, 4)
    assert short["slot_mapping"][0].item() == PAD_SLOT_ID and short["error_row"].item() == 1


@pytest.mark.parametrize(
    "name, bad, match",
    [
        ("seq_lens", lambda t: t.long(), "seq_lens: dtype torch.int64, expected torch.int32"),
        ("block_tables", lambda t: t.t().contiguous().t(), "not contiguous"),
        ("block_tables", lambda t: t[:, 0], "block_tables: 1 dims"),
        ("positions", lambda t: t[:-1], "positions: 3 rows"),
        ("sampled_ids", lambda t: t.tolist(), "expected a torch.Tensor"),
        ("input_ids", lambda t: t.to("meta"), "kernels run on"),
    ],
)
def test_bad_tensors_are_refused_by_name(name, bad, match):
    t = make_batch(2, 4, 4, [3, 7], 0)
    t[name] = bad(t[name])
    with pytest.raises(KernelArgumentError, match=match):
        run_kernel(t, 4)
    with pytest.raises(KernelArgumentError, match=match):
        AdvanceStepLauncher(4, *(t[n] for n in NAMES))


@pytest.mark.parametrize("dependent", [False, True], ids=["ordinary", "dependent"])
def test_bound_launcher_advances_repeatedly(dependent):
    """Also as a programmatic dependent (the kernel that waits first; on a GPU of sm_90 or later bound
    with the launch attribute): the same inputs, step after step."""
    if dependent and torch.cuda.is_available() and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("dependent launches need sm_90")
    t = make_batch(3, 8, 4, [2, 7, 12], 1)
    twin = {k: v.clone() for k, v in t.items()}
    launch = AdvanceStepLauncher(4, *(t[n] for n in NAMES), dependent=dependent)
    for _ in range(5):  # as in steps 2..k of one spec step
        t["sampled_ids"].add_(1)
        twin["sampled_ids"].add_(1)
        launch()
        advance_step_reference(3, 4, *(twin[n] for n in NAMES[1:-1]))
    for name in NAMES[:-1]:
        assert torch.equal(t[name], twin[name]), name
    assert t["positions"][:3].tolist() == [6, 11, 16]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bound_launch_is_really_bound_on_a_gpu():
    t = make_batch(2, 4, 4, [3, 7], 0)
    launch = AdvanceStepLauncher(4, *(t[n] for n in NAMES))
    assert launch.bound is not None, launch.bind_error
