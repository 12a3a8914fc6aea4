"""pytest setup: pick Numba's CUDA target before anything imports numba; tiny checkpoint fixtures."""
from protospec.kernels.simulator import choose_numba_cuda_target

choose_numba_cuda_target()  # simulator on CPU-only machines

import pytest  # noqa: E402
from tiny import DRAFT_CFG, TARGET_CFG, TINY_VOCAB, write_config  # noqa: E402


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory):
    return write_config(tmp_path_factory.mktemp("target"), TARGET_CFG)


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory):
    return write_config(tmp_path_factory.mktemp("draft"), DRAFT_CFG)


@pytest.fixture(scope="session")
def tiny_draft_other_vocab(tmp_path_factory):
    return write_config(tmp_path_factory.mktemp("draft_vocab"), dict(DRAFT_CFG, vocab_size=TINY_VOCAB + 8))
