"""Parts 2-6: wave quantization, tensor cores, launch overhead, AlexNet conv1, host <-> device copies."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from llmlab.core.device import Device, nvml_handle, set_tf32, torch_threads
from llmlab.core.render import track
from llmlab.core.results import LabResult
from llmlab.core.specs import peak_for
from llmlab.labs.gpu_parallelism.config import CONV1, TILE, Config
from llmlab.labs.gpu_parallelism.harness import _pct, rel_err, stats_cols, time_fn, time_interleaved

# ---------------------------------------------------------------- part 2: wave quantization


def part_waves(res: LabResult, cfg: Config, gpu: Device | None, progress) -> None:
    if gpu is None:
        return
    sms = torch.cuda.get_device_properties(gpu.index).multi_processor_count
    n, k = TILE * sms, cfg.wave_k
    ms = list(range(cfg.wave_step, TILE * cfg.wave_max_waves + TILE // 2 + 1, cfg.wave_step))
    gen = torch.Generator(device=gpu.torch).manual_seed(cfg.seed)
    a_all = torch.randn(ms[-1], k, device=gpu.torch, dtype=torch.float16, generator=gen)  # (M_max, K)
    b = torch.randn(k, n, device=gpu.torch, dtype=torch.float16, generator=gen)  # (K, N)
    rows = []
    for m in track(progress, ms, "wave sweep"):
        a, out = a_all[:m], torch.empty(m, n, device=gpu.torch, dtype=torch.float16)
        st = time_fn(lambda a=a, out=out: torch.mm(a, b, out=out), gpu, cfg.budget_s)
        tiles = math.ceil(m / TILE) * (n // TILE)
        rows.append({"M": m, "N": n, "K": k, "sms": sms, "tiles": tiles, "waves": tiles / sms, **stats_cols(st),
                     "tflops": 2 * m * n * k / (st.median / 1e3) / 1e12})
    res.add_table("wave_quantization", wave_rows(rows, cfg.wave_step))


def wave_rows(rows: list[dict], step: int) -> list[dict]:
    """Adds the prediction: `boundary` marks the first M past a full wave (M - step <= TILE*w < M: with
    N = TILE x SMs every extra tile row is one more wave), `drop` the TFLOP/s lost from the point before."""
    out = []
    for i, r in enumerate(rows):
        prev = rows[i - 1] if i else None
        crossed = prev is not None and math.ceil(prev["M"] / TILE) < math.ceil(r["M"] / TILE)
        out.append({**r, "boundary": crossed, "drop": 1 - r["tflops"] / prev["tflops"] if prev else 0.0})
    return out


# ---------------------------------------------------------------- part 3: tensor cores


def matmul_fn(device: Device, dtype: torch.dtype, n: int, seed: int) -> Callable[[], torch.Tensor]:
    """An n x n x n matmul in dtype on device, writing into one preallocated output."""
    gen = torch.Generator(device=device.torch).manual_seed(seed)
    a = torch.randn(n, n, device=device.torch, generator=gen).to(dtype)  # (n, n)
    b = torch.randn(n, n, device=device.torch, generator=gen).to(dtype)  # (n, n)
    out = torch.empty(n, n, device=device.torch, dtype=dtype)
    return lambda: torch.mm(a, b, out=out)


def tf32_setter(on: bool) -> Callable[[], None]:
    """TF32 for the next FP32 CUDA matmul: False = strict FP32 (IEEE), True = TF32 tensor cores."""
    return lambda: set_tf32(matmul=on)


def part_tensor_cores(res: LabResult, cfg: Config, cpu: Device, gpu: Device | None) -> None:
    rows, sources = [], {}
    rates: dict[tuple[str, str, int], float] = {}  # (device, dtype, n) -> measured GFLOP/s
    dtypes = {"fp32": (torch.float32, False), "tf32": (torch.float32, True), "bf16": (torch.bfloat16, False),
              "fp16": (torch.float16, False)}
    for dev, n, names in ((cpu, cfg.tc_n_cpu, ("fp32", "bf16")), (gpu, cfg.tc_n_gpu, ("fp32", "tf32", "bf16", "fp16"))):
        if dev is None:
            continue
        fns = [matmul_fn(dev, dtypes[name][0], n, cfg.seed) for name in names]
        setups = [tf32_setter(dtypes[name][1]) for name in names]
        outs = []
        for fn, setup in zip(fns, setups, strict=True):
            setup()
            outs.append(fn().float())
        # interleaved: a busy neighbour slows every dtype alike
        stats = time_interleaved(fns, dev, cfg.budget_s, setups)
        set_tf32(matmul=False)
        for name, st, out in zip(names, stats, outs, strict=True):
            gflops = 2 * n**3 / (st.median / 1e3) / 1e9
            peak, source = peak_for(dev, name)
            rates[(dev.spec, name, n)] = gflops
            rows.append({"device": dev.spec, "dtype": name, "n": n, **stats_cols(st), "gflops": gflops,
                         "peak_gflops": peak, "pct_of_peak": _pct(gflops, peak),
                         "speedup_vs_fp32": gflops / rates[(dev.spec, "fp32", n)],
                         "rel_err_vs_fp32": rel_err(out, outs[0])})
            sources[dev.spec] = source
    res.add_table("tensor_cores", rows)
    res.env["lab"]["peak_sources"] = sources


# ---------------------------------------------------------------- part 4: launch overhead


def launch_fns(dev: Device, bsz: int, n: int,
               seed: int) -> tuple[Callable[[], torch.Tensor], Callable[[], torch.Tensor]]:
    """(B separate torch.mm calls, one torch.bmm) over the same (B, n, n) inputs; each returns its output."""
    gen = torch.Generator(device=dev.torch).manual_seed(seed)
    a = torch.randn(bsz, n, n, device=dev.torch, generator=gen)  # (B, n, n)
    b = torch.randn(bsz, n, n, device=dev.torch, generator=gen)  # (B, n, n)
    out_loop, out_bmm = torch.empty_like(a), torch.empty_like(a)
    # views made once, outside the timing
    triples = list(zip(a.unbind(0), b.unbind(0), out_loop.unbind(0), strict=True))

    def loop() -> torch.Tensor:
        for x, y, o in triples:
            torch.mm(x, y, out=o)  # one dispatch (CPU) / one kernel launch (GPU) each
        return out_loop

    return loop, lambda: torch.bmm(a, b, out=out_bmm)


def part_launch(res: LabResult, cfg: Config, cpu: Device, gpu: Device | None, top: int) -> None:
    rows, bsz, n = [], cfg.launch_count, cfg.launch_n
    runs = [(cpu, 1)] + ([(cpu, top)] if top > 1 else []) + ([(gpu, None)] if gpu else [])
    for dev, threads in runs:
        with torch_threads(threads or torch.get_num_threads()):
            loop, bmm = launch_fns(dev, bsz, n, cfg.seed)
            ok = rel_err(loop(), bmm()) < 1e-5
            st_loop, st_bmm = time_interleaved([loop, bmm], dev, cfg.budget_s)
        for way, st in (("loop of mm", st_loop), ("one bmm", st_bmm)):
            rows.append({"device": dev.spec, "threads": threads, "way": way, "count": bsz, "n": n, **stats_cols(st),
                         "us_per_matmul": 1e3 * st.median / bsz,
                         "gflops": 2 * bsz * n**3 / (st.median / 1e3) / 1e9, "ok": ok})
    res.add_table("launch_overhead", rows)


# ---------------------------------------------------------------- part 5: AlexNet conv1


def conv1_flops(batch: int) -> int:
    """2 x B x C_out x H_out x W_out x (C_in x k x k): 2 x 96 x 55 x 55 x 363 = 211 MFLOP per image."""
    c = CONV1
    hw_out = (c["hw"] - c["k"]) // c["stride"] + 1  # 55
    return 2 * batch * c["c_out"] * hw_out * hw_out * c["c_in"] * c["k"] * c["k"]


def conv1_im2col(x: torch.Tensor, w: torch.Tensor, stride: int) -> torch.Tensor:
    """The reference: a convolution is a matmul over unfolded patches."""
    bsz, k = x.shape[0], w.shape[-1]
    hw_out = (x.shape[-1] - k) // stride + 1
    cols = F.unfold(x, k, stride=stride)  # (B, C_in*k*k, H_out*W_out) = (B, 363, 3025)
    out = w.reshape(w.shape[0], -1) @ cols  # (B, 96, 3025)
    return out.reshape(bsz, w.shape[0], hw_out, hw_out)


def part_alexnet(res: LabResult, cfg: Config, cpu: Device, gpu: Device | None) -> None:
    c, bsz = CONV1, cfg.conv_batch
    gen = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(bsz, c["c_in"], c["hw"], c["hw"], generator=gen)  # (B, 3, 227, 227)
    w = torch.randn(c["c_out"], c["c_in"], c["k"], c["k"], generator=gen) / 11  # (96, 3, 11, 11)
    ref = conv1_im2col(x[:2], w, c["stride"])
    flops, rows, peaks = conv1_flops(bsz), [], {}
    set_tf32(conv=False)  # strict FP32 on the GPU too, like the CPU (restored by keep_torch_settings)
    for dev in (cpu, gpu):
        if dev is None:
            continue
        xd, wd = x.to(dev.torch), w.to(dev.torch)
        ok = rel_err(F.conv2d(xd[:2], wd, stride=c["stride"]), ref) < 1e-4
        n = cfg.tc_n_cpu if not dev.is_cuda else cfg.tc_n_gpu
        # the napkin's matmul rate is timed interleaved with the conv: a busy neighbour slows both alike
        conv = lambda xd=xd, wd=wd: F.conv2d(xd, wd, stride=c["stride"])  # noqa: E731
        st, st_mm = time_interleaved([conv, matmul_fn(dev, torch.float32, n, cfg.seed)], dev, cfg.budget_s)
        mm = 2 * n**3 / (st_mm.median / 1e3) / 1e9
        peak = peak_for(dev, "fp32")[0]
        rows.append({"device": dev.spec, "threads": None if dev.is_cuda else torch.get_num_threads(), "batch": bsz,
                     "gflop": flops / 1e9, **stats_cols(st),
                     "gflops": flops / (st.median / 1e3) / 1e9, "matmul_gflops": mm, "napkin_ms": flops / mm / 1e6,
                     "pct_of_peak": _pct(flops / (st.median / 1e3) / 1e9, peak), "ok": ok})
        peaks[dev.spec] = peak
    res.add_table("alexnet_conv1", rows)
    res.env["lab"]["gtx580_ms"] = flops / 1.58e12 * 1e3  # AlexNet's GTX 580 (1.58 TFLOP/s FP32) needed at least this


# ---------------------------------------------------------------- part 6: host <-> device copies


def pcie_GBps(gpu: Device) -> tuple[float | None, str]:
    """Per-direction PCIe link bandwidth from NVML's max generation and width for this device in this system.

    (The *current* generation drops while the link idles, so it would understate the link.)
    """
    per_lane = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}  # GB/s per lane after encoding
    try:
        import pynvml  # optional (NVIDIA's bindings): its absence is a finding below, not a crash

        pynvml.nvmlInit()
        h, _ = nvml_handle(pynvml, gpu.index)  # by UUID: torch's index is not NVML's under CUDA_VISIBLE_DEVICES
        gen, width = pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h), pynvml.nvmlDeviceGetMaxPcieLinkWidth(h)
        return per_lane.get(gen, 0) * width or None, f"PCIe gen {gen} x{width} (NVML)"
    except Exception as exc:  # NVML absent or failing: say so instead of guessing
        return None, f"PCIe link unknown ({type(exc).__name__})"


def copy_fn(direction: str, host: torch.Tensor, dev_buf: torch.Tensor,
            non_blocking: bool) -> Callable[[], torch.Tensor]:
    """One copy; asynchronous only from pinned memory (the CUDA events still bracket it)."""
    if direction == "host->device":
        return lambda: dev_buf.copy_(host, non_blocking=non_blocking)
    return lambda: host.copy_(dev_buf, non_blocking=non_blocking)


def part_copies(res: LabResult, cfg: Config, gpu: Device | None, progress) -> None:
    if gpu is None:
        return
    link, source = pcie_GBps(gpu)
    rows = []
    for mb in track(progress, cfg.copy_sizes_mb, "copies"):
        nbytes = mb * 2**20
        dev_buf = torch.empty(nbytes, dtype=torch.uint8, device=gpu.torch)
        for memory in ("pageable", "pinned"):
            host = torch.ones(nbytes, dtype=torch.uint8)
            host = host.pin_memory() if memory == "pinned" else host
            for direction in ("host->device", "device->host"):
                st = time_fn(copy_fn(direction, host, dev_buf, non_blocking=memory == "pinned"), gpu, cfg.budget_s)
                bw = nbytes / (st.median / 1e3) / 1e9
                rows.append({"memory": memory, "direction": direction, "MiB": mb, **stats_cols(st), "GBps": bw,
                             "link_GBps": link, "pct_of_link": _pct(bw, link)})
        del dev_buf, host
    res.add_table("copy_bandwidth", rows)
    res.env["lab"]["pcie"] = source


