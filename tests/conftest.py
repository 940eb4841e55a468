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


@pytest.fixture(autouse=True)
def _no_leaked_runtime():
    yield
    # A test that starts its own cluster must leave none behind for the next.
    assert hop.is_initialized() is False or _module_cluster_active(), "test left torch_hoplite initialized"


_active = {"n": 0}


def _module_cluster_active() -> bool:
    return _active["n"] > 0


@pytest.fixture(scope="module")
def cluster4():
    from cluster import Cluster

    c = Cluster(4)
    _active["n"] += 1
    yield c
    _active["n"] -= 1
    c.close()
