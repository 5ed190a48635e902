#!/usr/bin/env python3
"""gpu_bench.py -- ruCCL on one GPU, next to what the hardware does in the same run.

    python3 bench/gpu_bench.py                                  # everything, GPU 0
    python3 bench/gpu_bench.py --same-gpu-busbw 812.5           # a number measured elsewhere (ruccl-perf)
    python3 bench/gpu_bench.py --json out.json --iters 5

Measures, on cuda:0 (torch.cuda events time the copies; wall clock, after a
synchronize, times the collectives):
  d2d      device-to-device copy of --copy-mb (bytes copied per second);
  h2d/d2h  copies between pinned host memory and the device, --copy-mb;
  ruccl    all_reduce through torch.distributed of --staged-mb and --torch-mb FP32 CUDA
           tensors, 2 processes on GPU 0 (spawned; the core stages through pinned host
           memory between processes);
  gloo     the same all_reduce at --torch-mb on gloo.
busbw follows nccl-tests: size / time x 2(n-1)/n (x 1 for n = 2); sizes are bytes of
each rank's tensor; times are the slowest rank's mean over --iters back-to-back calls
(async_op=False) after a warm-up; every result is checked (exact: all-ones inputs).

The table puts each ruCCL number next to its reference and target:
  same-GPU all_reduce busbw, 4 ranks, 256 MB   >= 50% of the d2d copy rate (the number
      comes from ruccl-perf --device cuda, passed with --same-gpu-busbw; "n/a" without);
  host-staged all_reduce busbw, 2 processes    >= 60% of the pinned copy rate, the slower
      of h2d and d2h (staging does both);
  ruccl vs gloo busbw at --torch-mb              >= 3x.
Targets are reported (MET / MISSED), never the exit status: that is 1 only when a
measurement failed or a result was wrong.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import traceback

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # ruccl_pg, built in place

MB = 1 << 20
GB = 1e9


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- copies ----------------------------------------------------------------------------


def _time_copies(dst, src, iters):
    """Seconds per dst.copy_(src), timed with CUDA events on the current stream."""
    for _ in range(2):
        dst.copy_(src, non_blocking=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        dst.copy_(src, non_blocking=True)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def copy_rates(nbytes, iters):
    dev = torch.device("cuda", 0)
    n = nbytes // 4
    a = torch.ones(n, device=dev)
    b = torch.empty(n, device=dev)
    host = torch.empty(n, pin_memory=True)
    rates = {
        "d2d": nbytes / _time_copies(b, a, iters) / GB,
        "h2d": nbytes / _time_copies(a, host.fill_(2.0), iters) / GB,
        "d2h": nbytes / _time_copies(host, b.fill_(3.0), iters) / GB,
    }
    torch.cuda.synchronize(dev)
    ok = bool((a[:1024] == 2.0).all()) and bool((host[:1024] == 3.0).all())
    return rates, ok


# ---- all_reduce through torch, 2 processes on GPU 0 ----------------------------------------


def _worker(rank, world, backend, init_method, sizes, iters, results):
    try:
        import torch.distributed as dist

        if backend == "ruccl":
            import ruccl_pg  # noqa: F401  (registers the backend)
        torch.cuda.set_device(0)
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world)
        dev = torch.device("cuda", 0)
        out = {}
        for nbytes in sizes:
            t = torch.ones(nbytes // 4, device=dev)
            for _ in range(2):  # warm-up (first-touch staging buffers, connections)
                t.fill_(1.0)
                dist.all_reduce(t)
            t.fill_(1.0)
            dist.all_reduce(t)  # the checked call
            torch.cuda.synchronize(dev)
            wrong = int((t != float(world)).sum().item())
            dist.barrier()
            torch.cuda.synchronize(dev)
            start = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
            torch.cuda.synchronize(dev)
            out[nbytes] = ((time.perf_counter() - start) / iters, wrong)
        dist.barrier()
        dist.destroy_process_group()
        results.put((rank, True, out))
    except BaseException:  # noqa: BLE001 - reported by the parent
        results.put((rank, False, traceback.format_exc()))


def torch_all_reduce(backend, sizes, iters, world=2, timeout=240):
    """{bytes: (seconds per call, the slowest rank's; elements wrong, summed)}, or raises."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=_worker, args=(r, world, backend, init, sizes, iters, results))
             for r in range(world)]
    for p in procs:
        p.start()
    got, deadline = {}, time.monotonic() + timeout
    try:
        while len(got) < world and time.monotonic() < deadline:
            try:
                rank, ok, value = results.get(timeout=1)
            except Exception:  # noqa: BLE001 - queue.Empty: anybody left?
                if all(not p.is_alive() for p in procs):
                    break
                continue
            if not ok:
                raise RuntimeError(f"{backend} rank {rank} failed:\n{value}")
            got[rank] = value
        if len(got) < world:
            raise RuntimeError(f"{backend}: ranks {sorted(set(range(world)) - set(got))} gave no result "
                               f"(exit codes {[p.exitcode for p in procs]})")
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    return {n: (max(got[r][n][0] for r in got), sum(got[r][n][1] for r in got)) for n in sizes}


# ---- report ----------------------------------------------------------------------------------


def ratio_row(what, value, ref_name, ref, target, unit="%"):
    if value is None or ref is None or ref <= 0:
        shown_value = "n/a" if value is None else f"{value:.2f} GB/s"
        shown_ref = "n/a" if ref is None or ref <= 0 else f"{ref:.2f} GB/s"
        return (f"  {what:<48} {shown_value:>14}   {ref_name:<26} {shown_ref:>12} {'n/a':>7}   "
                f"target >= {target} n/a")
    ratio = value / ref
    shown = f"{ratio:.1f}x" if unit == "x" else f"{100 * ratio:.0f}%"
    need = float(target.rstrip("x%")) / (1 if unit == "x" else 100)
    verdict = "MET" if ratio >= need else "MISSED"
    return (f"  {what:<48} {value:9.2f} GB/s   {ref_name:<26} {ref:7.2f} GB/s {shown:>7}   "
            f"target >= {target} {verdict}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--copy-mb", type=int, default=256, help="bytes of the copies (MB)")
    p.add_argument("--staged-mb", type=int, default=256, help="host-staged all_reduce size (MB)")
    p.add_argument("--torch-mb", type=int, default=64, help="ruccl vs gloo all_reduce size (MB)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--same-gpu-busbw", default="n/a",
                   help="same-GPU 4-rank all_reduce busbw in GB/s (from ruccl-perf), or n/a")
    p.add_argument("--skip-gloo", action="store_true")
    p.add_argument("--json", help="write the raw numbers here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_bench: no CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
        return 1
    failures = []
    import ruccl_pg

    print(f"# gpu_bench: torch {torch.__version__}, {torch.cuda.get_device_name(0)}, "
          f"ruccl_pg built with CUDA: {ruccl_pg.built_with_cuda()}, {args.iters} iterations")
    rates, ok = copy_rates(args.copy_mb * MB, args.iters)
    if not ok:
        failures.append("the copies' results are wrong")
    print(f"# copies of {args.copy_mb} MB: d2d {rates['d2d']:.2f} GB/s, h2d (pinned) {rates['h2d']:.2f} GB/s, "
          f"d2h (pinned) {rates['d2h']:.2f} GB/s")
    staged, small = args.staged_mb * MB, args.torch_mb * MB
    numbers = {"copies": rates, "same_gpu_busbw": None, "ruccl": {}, "gloo": {}}
    for backend, sizes in (("ruccl", sorted({staged, small})), ("gloo", [small])):
        if backend == "gloo" and args.skip_gloo:
            continue
        try:
            res = torch_all_reduce(backend, sizes, args.iters)
        except Exception as e:  # noqa: BLE001
            failures.append(f"{backend} all_reduce: {e}")
            print(f"# {backend} all_reduce FAILED: {e}", file=sys.stderr)
            continue
        for nbytes, (seconds, wrong) in res.items():
            busbw = nbytes / seconds / GB  # x 2(n-1)/n = 1 for 2 ranks
            numbers[backend][nbytes] = {"seconds": seconds, "busbw": busbw, "wrong": wrong}
            print(f"# {backend} all_reduce {nbytes // MB} MB, 2 processes on cuda:0: {seconds * 1e3:.2f} ms, "
                  f"busbw {busbw:.2f} GB/s, wrong {wrong}")
            if wrong:
                failures.append(f"{backend} all_reduce of {nbytes // MB} MB: {wrong} elements wrong")
    try:
        same = float(args.same_gpu_busbw)
        numbers["same_gpu_busbw"] = same
    except ValueError:
        same = None

    def busbw(backend, nbytes):
        return numbers[backend].get(nbytes, {}).get("busbw")

    print()
    print("ruCCL on one GPU (targets are reported, not enforced)")
    print(ratio_row("same-GPU all_reduce busbw, 4 ranks, 256 MB FP32", same, "d2d copy", rates["d2d"], "50%"))
    print(ratio_row(f"host-staged all_reduce busbw, 2 procs, {args.staged_mb} MB", busbw("ruccl", staged),
                    "pinned copy, min(h2d,d2h)", min(rates["h2d"], rates["d2h"]), "60%"))
    print(ratio_row(f"ruccl vs gloo all_reduce busbw, CUDA {args.torch_mb} MB", busbw("ruccl", small),
                    "gloo", busbw("gloo", small), "3x", unit="x"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(numbers, f, indent=2, default=str)
    for f in failures:
        print(f"gpu_bench: FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
