"""tests/linalg use small matrices (<= 192 per side): one intra-op thread is as fast and avoids OpenMP
over-subscription when the suite shares the CPU with other jobs (measured: 2 threads on a loaded 2-core
machine ran 40x slower)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
