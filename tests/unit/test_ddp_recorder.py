"""The DDP recorder names DDP's "parameter indices" as the reducer built them (probes/ddp_recorder.py): a layer
frozen after DDP wrapped the model keeps its index, so a crash's "Parameter indices which did not receive grad for
rank 1: 0 1" is layer 0, not the layer that now comes first among those requiring grad."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.ports import reserve_port

SCRIPT = textwrap.dedent("""
    import json, sys
    import torch, torch.distributed as dist
    from ddpdoctor.probes.ddp_recorder import DDPRecorder
    rec = DDPRecorder()
    rec.install()
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0, world_size=1)
    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    net[0].bias.requires_grad_(False)  # frozen before DDP: never in the reducer
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    net[0].weight.requires_grad_(False)  # frozen after: still the reducer's index 0
    (doc,) = rec.describe()
    print(json.dumps([p["name"] for p in doc["parameters"]]))
    dist.destroy_process_group()
""")


def test_parameters_are_named_in_the_reducers_order_from_construction() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(reserve_port())], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["0.weight", "2.weight", "2.bias"]
