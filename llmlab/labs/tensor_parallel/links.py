"""The links between ranks and their specs: NVLink and PCIe from NVML, the network port from sysfs."""

from __future__ import annotations

# GB/s per link per direction by NVLink version: NVLink 1 (P100) 20, NVLink 2-4 (V100, A100, H100) 25,
# NVLink 5 (B200) 50
NVLINK_GBPS = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 50.0}
# GB/s per lane per direction by PCIe generation, after line coding: 2.5 and 5 GT/s with 8b/10b (gen 1-2),
# 8 / 16 / 32 GT/s with 128b/130b (gen 3-5), 64 GT/s PAM4 with FLIT (gen 6)
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
NVLINK_MAX = 18  # links per GPU on an H100/H200/B200
# The NVLink generation of a GPU follows its architecture (compute capability major): Pascal 1, Volta 2, Ampere 3,
# Hopper 4, Blackwell 5. NVML's nvmlDeviceGetNvLinkVersion is not used for it: across drivers it returns either
# the version or an nvmlNvlinkVersion_t code (3.0 -> 4, 4.0 -> 6), and 5 would mean NVLink 5 or NVLink 3.1.
NVLINK_GEN_BY_CC = {6: 1, 7: 2, 8: 3, 9: 4, 10: 5}


def nvlink_spec(versions: list[int]) -> tuple[str, float | None]:
    """(label, GB/s per direction) for the active NVLink links' versions; None where a version is not in the table."""
    rates = [NVLINK_GBPS.get(v) for v in versions]
    if None in rates:
        return f"NVLink x{len(versions)} (generation unknown)", None
    return f"NVLink {max(versions)} x{len(versions)}", sum(rates)


def pcie_spec(gen: int, width: int) -> tuple[str, float | None]:
    """(label, GB/s per direction) of a PCIe link at its maximum generation and width."""
    lane = PCIE_LANE_GBPS.get(gen)
    return f"PCIe {gen} x{width}", (None if lane is None else lane * width)


def gpu_link_rows(index: int) -> list[dict]:
    """This rank's GPU (cuda:index, found in NVML by UUID: right under CUDA_VISIBLE_DEVICES) and its link spec."""
    import pynvml as nv  # noqa: PLC0415  (only on CUDA)
    import torch

    from llmlab.core.device import nvml_handle

    nv.nvmlInit()
    h, how = nvml_handle(nv, index)
    links = 0
    for i in range(NVLINK_MAX):
        try:
            links += nv.nvmlDeviceGetNvLinkState(h, i) == 1
        except nv.NVMLError:
            break
    if links:
        gen = NVLINK_GEN_BY_CC.get(torch.cuda.get_device_capability(index)[0], 0)
        label, spec = nvlink_spec([gen] * links)
    else:  # the maximum link, not the current one: PCIe drops generation and width at idle
        label, spec = pcie_spec(nv.nvmlDeviceGetMaxPcieLinkGeneration(h), nv.nvmlDeviceGetMaxPcieLinkWidth(h))
    return [dict(scope="intra-node", device=f"cuda:{index}", nvml=how, link=label + " (spec)", spec_GBps=spec)]


def nic_row(sys_root: str = "/sys") -> dict:
    """The node's fastest network port (InfiniBand port rate, else Ethernet link speed, from sysfs): the inter-node
    spec.

    One port per GPU is assumed (a DGX H100 has eight 400 Gb/s ports for eight GPUs), so one rank's share is one
    port."""
    from pathlib import Path

    root = Path(sys_root)
    ib = []
    for rate in root.glob("class/infiniband/*/ports/*/rate"):  # "400 Gb/sec (4X NDR)"
        try:
            ib.append(float(rate.read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            continue
    if ib:
        return dict(scope="inter-node", link=f"InfiniBand {max(ib):g} Gb/s x{len(ib)} ports (spec per port)",
                    spec_GBps=max(ib) / 8)
    eth = []
    for speed in root.glob("class/net/*/speed"):  # Mb/s; -1 or unreadable when the link is down
        try:
            mbps = int(speed.read_text().strip())
        except (OSError, ValueError):
            continue
        if mbps > 0 and speed.parent.name != "lo":
            eth.append(mbps)
    if eth:
        return dict(scope="inter-node", link=f"Ethernet {max(eth) / 1000:g} Gb/s (spec)", spec_GBps=max(eth) / 8000)
    return dict(scope="inter-node", link="unknown (no InfiniBand or Ethernet speed in sysfs)", spec_GBps=None)
