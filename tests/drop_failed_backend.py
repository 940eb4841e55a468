"""Makes and drops, many times, a backend whose collective just failed (its
second member is not in this one-process cluster): dropping the last Python
reference joins the backend's worker while that worker may still be
releasing the collective's tensors. Prints how many collectives failed."""

import sys

import torch
import torch._C._distributed_c10d as c10d

import torch_hoplite as hop
import torch_hoplite.api as api
from torch_hoplite import _C

hop.init()
failed = 0
for i in range(int(sys.argv[1])):
    backend = _C.create_backend(api._rt().node, f"dropped.{i}", 0, [0, 1], 1.0)
    try:
        backend.allreduce([torch.ones(1000)], c10d.AllreduceOptions()).wait()
    except Exception:  # noqa: BLE001  (counted)
        failed += 1
    del backend
print(failed)
hop.shutdown()
