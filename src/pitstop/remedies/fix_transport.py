"""Communication far below the link: let NCCL use the fast transport (InfiniBand, NVLink, P2P)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pitstop.core.vocabulary import Framework, RemedyId
from pitstop.remedies.base import Advice, Remedy, register


@register
class FixTransport(Remedy):
    id = RemedyId.FIX_TRANSPORT
    title = "the fast interconnect"

    def advice(self, framework: Framework, params: Mapping[str, Any]) -> Advice:
        """``warnings``: what the environment says (e.g. "NCCL_IB_DISABLE=1 is set"); ``multi_node``."""
        warnings = list(params.get("warnings") or [])
        text = "Communication runs far below the link: " + (
            "; ".join(warnings) if warnings else "check which transport NCCL chose (NCCL_DEBUG=INFO)"
        )
        text += "."
        lines = [
            "unset NCCL_IB_DISABLE NCCL_P2P_DISABLE   # let NCCL use InfiniBand / NVLink",
            "export NCCL_DEBUG=INFO                  # the log names the transport it picked",
        ]
        if params.get("multi_node"):
            lines.append("export NCCL_SOCKET_IFNAME=ib0   # the fast interface, not the management NIC")
            lines.append(
                "ibv_devinfo                      # no device: the IB / RoCE driver (rdma-core) or the"
            )
            lines.append("                                 # container's /dev/infiniband is missing")
        if any("SHM" in w for w in warnings):
            lines.append(
                "nvidia-smi topo -p2p r           # OK between the GPUs: P2P works, NCCL should use it"
            )
            lines.append(
                "docker run --ipc=host ...        # P2P/IPC needs the host's IPC namespace in a container"
            )
        return Advice(text, "\n".join(lines))

    def frameworks(self) -> tuple[Framework, ...]:
        return (Framework.PYTORCH,)
