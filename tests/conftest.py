import pytest
import torch

import torch_hoplite as hop


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module", autouse=True)
def _leaves_torch_hoplite_shut_down():
    """A module whose tests leave this process's node running (after its own
    fixtures ended) errors here, and the node is shut down, so that the
    modules after it do not all fail at init."""
    yield
    if hop.is_initialized():
        hop.shutdown()
        pytest.fail("a test of this module left torch_hoplite initialized")


@pytest.fixture(scope="module")
def cluster4():
    from cluster import Cluster

    c = Cluster(4)
    yield c
    c.close()
    assert not hop.is_initialized()


@pytest.fixture
def cluster3_fast_heartbeats():
    """Three ranks that declare a silent peer failed within 1.5 s."""
    from cluster import Cluster

    c = Cluster(3, options={"heartbeat_interval": 0.2, "heartbeat_timeout": 1.5})
    yield c
    c.close()
