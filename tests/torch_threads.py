"""One intra-op torch thread for a test module's tiny models: other processes share the 2 cores, and
oversubscription makes small convolutions many times slower. Import the fixture into a module
(``from tests.torch_threads import one_torch_thread  # noqa: F401``); it is autouse there."""

import pytest


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
