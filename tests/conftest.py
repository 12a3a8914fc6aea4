"""pytest setup: pick Numba's CUDA target before anything imports numba; tiny checkpoint fixtures."""
from protospec.kernels.launch.simulator import choose_numba_cuda_target

choose_numba_cuda_target()  # simulator on CPU-only machines

import pytest  # noqa: E402
from tiny import DRAFT_CFG, MMA_DRAFT_CFG, MMA_TARGET_CFG, TARGET_CFG, TINY_VOCAB, write_config  # noqa: E402


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory):
    return write_config(tmp_path_factory.mktemp("target"), TARGET_CFG)


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory):
    return write_config(tmp_path_factory.mktemp("draft"), DRAFT_CFG)


@pytest.fixture(scope="session")
def mma_pair(tmp_path_factory):
    """(target, draft) checkpoints whose widths the tensor-core layer kernels take (tiny.MMA_*_CFG)."""
    return (write_config(tmp_path_factory.mktemp("mma_target"), MMA_TARGET_CFG),
            write_config(tmp_path_factory.mktemp("mma_draft"), MMA_DRAFT_CFG))


@pytest.fixture(scope="session")
def tiny_draft_other_vocab(tmp_path_factory):
    return write_config(tmp_path_factory.mktemp("draft_vocab"), dict(DRAFT_CFG, vocab_size=TINY_VOCAB + 8))


@pytest.fixture
def launched_kernels(monkeypatch):
    """The names of the Numba kernels launched through interop.launch_tensors while the test runs, in
    order (each still launches)."""
    from protospec.kernels.launch import interop

    names, launch = [], interop.launch_tensors

    def recording(kernel, grid, block, args, dependent=False):
        names.append(kernel.py_func.__name__)
        launch(kernel, grid, block, args, dependent)

    monkeypatch.setattr(interop, "launch_tensors", recording)
    return names


# The build checks in child processes take minutes each: started last, one would keep a test worker
# busy long after the other ran out of tests; first, they run beside everything else.
FIRST = ("test_gpu_typecheck.py",)


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: 0 if item.path.name in FIRST else 1 if item.get_closest_marker("slow") else 2)
