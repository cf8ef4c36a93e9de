"""ddp_find_unused on a real CUDA device (skipped without one; `make gpu-check` runs it): DDP's used-parameter
map lives on the GPU there, and the collector reads it with device operations only (no copy to the host until
the window ends). A one-rank NCCL group in this process, the probe driven through its listener calls."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def nccl1(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if dist.is_initialized():
        pytest.skip("another process group is set up in this process")
    store = tmp_path_factory.mktemp("nccl1") / "store"
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("spare", [False, True])
def test_the_collector_reads_the_map_on_the_gpu(nccl1: Any, spare: bool) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from tests.unit.test_ddp_find_unused import Net, _probe_run

    def build() -> Any:
        return DDP(Net(spare=spare).cuda(), device_ids=[0], find_unused_parameters=True)

    ddp = _probe_run(build, device="cuda")
    assert ddp is not None and ddp.find_unused_parameters is True and ddp.searches == 4
    assert ddp.unused_parameters == (2 if spare else 0)
    assert ddp.search_s is not None and ddp.search_s > 0
