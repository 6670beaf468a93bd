#!/usr/bin/env python3
"""Writes a 2-rank data-parallel PyTorch profiler (Kineto) trace, one Chrome-trace JSON per rank,
with the fields PyTorch 2.x writes: distributedInfo, CPU ops (cpu_op, cuda_runtime) that the
importer ignores, GPU kernels with args.stream/device/correlation, and an NCCL all-reduce kernel
carrying record_param_comms' metadata ("Collective name", "In msg nelems", "dtype",
"Process Group Ranks", ...). Run from anywhere: python3 make_sample.py

Per rank (times in us): GEMM forward, GEMM backward, all-reduce of 524288 BFloat16 gradients
(1 MiB) on the NCCL stream, then the optimizer's elementwise kernel.
  rank 0: fwd 120, bwd 80 (compute ends at 200 after the first kernel's start)
  rank 1: fwd 125, bwd 85 (210)
"""
import json
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
GEMM = "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_nn"
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
ADAM = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<"
        "at::native::(anonymous namespace)::FusedAdamMathFunctor>")
BASE = 1700000000000.0  # a Kineto-like absolute start, in us


def kernel(name, ts, dur, stream, correlation, extra=None):
    args = {"External id": correlation + 1000, "device": 0, "stream": stream,
            "correlation": correlation, "registers per thread": 128, "shared memory": 0,
            "blocks per SM": 1.2, "warps per SM": 4.5, "grid": [108, 1, 1], "block": [256, 1, 1],
            "est. achieved occupancy %": 12}
    args.update(extra or {})
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream,
            "ts": BASE + ts, "dur": dur, "args": args}


def cpu(name, ts, dur, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 4242, "tid": 4242, "ts": BASE + ts,
            "dur": dur, "args": {"External id": 1, "Sequence number": 7, "Fwd thread id": 0}}


def trace(rank, fwd, bwd, nccl_start, nccl_dur, adam_start):
    comm = {"Collective name": "allreduce", "In msg nelems": 524288, "Out msg nelems": 524288,
            "Group size": 2, "dtype": "BFloat16", "In split size": "[]", "Out split size": "[]",
            "Process Group Name": "0", "Process Group Description": "default_pg",
            "Process Group Ranks": "[0, 1]"}
    events = [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
        cpu("aten::mm", 0, 5), cpu("cudaLaunchKernel", 2, 3, "cuda_runtime"),
        kernel(GEMM, 0, fwd, 7, 11),
        cpu("autograd::engine::evaluate_function: MmBackward0", 6, 8),
        kernel(GEMM, fwd + 3, bwd, 7, 12),
        cpu("record_param_comms", 10, 4),
        kernel(NCCL, nccl_start, nccl_dur, 20, 13, comm),
        cpu("Optimizer.step#AdamW.step", 12, 9, "user_annotation"),
        kernel(ADAM, adam_start, 40, 7, 14),
    ]
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2,
                                "pg_count": 1, "pg_config": [], "nccl_version": "2.18.1"},
            "traceEvents": events, "traceName": f"rank{rank}.pt.trace.json",
            "displayTimeUnit": "ms", "baseTimeNanoseconds": 1700000000000000000}


def main():
    # rank 0: fwd [0,120), bwd [123,203); rank 1: fwd [0,125), bwd [128,213). The all-reduce
    # started when both were done (213) and took 300 us; the optimizer ran after it.
    for rank, fwd, bwd in ((0, 120, 80), (1, 125, 85)):
        t = trace(rank, fwd, bwd, 215, 300, 520)
        (HERE / f"rank{rank}.pt.trace.json").write_text(json.dumps(t, indent=1) + "\n")


if __name__ == "__main__":
    main()
