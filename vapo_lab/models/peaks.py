"""Peak dense matmul throughput of known GPUs, for MFU: achieved model FLOP/s over these.

NVIDIA's datasheets, dense (no 2:4 sparsity), SXM parts unless named: bfloat16 and float16 on the
tensor cores; float32 the plain FP32 rate (torch's default float32 matmul precision, "highest",
does not use TF32). A device whose name matches none gives no MFU rather than a wrong one.
"""

from __future__ import annotations

# name fragment (as torch.cuda.get_device_name reports it) -> {dtype: FLOP/s}
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "H200": {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12},
    "H100 PCIe": {"bfloat16": 756e12, "float16": 756e12, "float32": 51e12},
    "H100": {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12},
    "A100": {"bfloat16": 312e12, "float16": 312e12, "float32": 19.5e12},
    "L40S": {"bfloat16": 362e12, "float16": 362e12, "float32": 91.6e12},
    "L4": {"bfloat16": 121e12, "float16": 121e12, "float32": 30.3e12},
}


def peak_flops(device_name: str, dtype: str) -> float | None:
    """Returns the peak FLOP/s of ``device_name`` in ``dtype``, or None for an unknown device or
    dtype (the first matching name fragment wins: "H100 PCIe" before "H100")."""
    for fragment, peaks in PEAK_FLOPS.items():
        if fragment in device_name:
            return peaks.get(dtype)
    return None
