"""
The device and the dtype every script runs in: check_device fails at start-up with the fix in the
message, and resolves dtype='auto' to bfloat16 where the hardware runs it fast (bf16_is_fast);
memory_stats gives the memory columns of the logs.

What is bf16 and what stays float32 when the frozen base runs in bf16: the whole list opens model.py.
"""
import os
import re
import resource

import torch

from configurator import UserError


def bf16_is_fast(device):
    """(bool, why): does `device` run bfloat16 matmuls natively (several times float32's rate)?
    CUDA GPUs with bf16 (Ampere on); CPUs with AMX-BF16 or AVX512-BF16 (measured 3-10x float32)."""
    if device.startswith("cuda"):
        ok = torch.cuda.is_bf16_supported()
        return ok, f"{torch.cuda.get_device_name()} {'has' if ok else 'lacks'} bfloat16"
    if device == "cpu":
        try:
            with open("/proc/cpuinfo") as f:
                flags = set(next((line for line in f if line.startswith("flags")), "").split())
        except OSError:
            flags = set()
        for flag, name in (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16")):
            if flag in flags:
                return True, f"the CPU has {name}"
        return False, f"the CPU has neither AMX-BF16 nor AVX512-BF16 ({torch.backends.cpu.get_cpu_capability()})"
    return False, f"{device}: bfloat16 not known to be faster"


def check_dtype(dtype):
    """A dtype this project runs in, else one line (float16 would need a GradScaler: not here)."""
    if dtype not in ("auto", "bfloat16", "float32"):
        raise UserError(f"dtype must be 'auto', 'bfloat16' or 'float32', got {dtype!r}")


def resolve_dtype(device, dtype):
    """'auto' -> 'bfloat16' where the device runs it fast, else 'float32' (printed, with the reason)."""
    check_dtype(dtype)
    if dtype != "auto":
        return dtype
    fast, why = bf16_is_fast(device)
    print(f"dtype auto: {'bfloat16' if fast else 'float32'} ({why})")
    return "bfloat16" if fast else "float32"


def check_device_name(device):
    """A device name this project knows, else one line naming the ones it does."""
    if not re.fullmatch(r"cpu|cuda(:\d+)?|mps", device):
        raise UserError(f"unknown device {device!r}: use 'cpu', 'cuda', 'cuda:N' (N = GPU index) or 'mps'")


def check_device(device, dtype="float32"):
    """Fail at start-up, with the fix in the message, on a device or dtype that cannot work, and
    make 'cuda:N' the current device: memory_allocated() and synchronize() read the current one.
    Returns (dtype, autocast context): 'auto' resolved (resolve_dtype); bfloat16 autocast on the
    device for 'bfloat16', off for 'float32'."""
    check_device_name(device)
    if device == "mps" and not torch.backends.mps.is_available():
        raise UserError("device='mps' but torch.backends.mps.is_available() is False; use --device=cpu")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UserError(f"device={device!r} but torch.cuda.is_available() is False on this machine "
                            f"(torch {torch.__version__}); use --device=cpu, or install a CUDA build of torch")
        index = torch.device(device).index  # None for plain 'cuda': the current GPU, left as it is
        if index is not None and index >= torch.cuda.device_count():
            raise UserError(f"device={device!r} but this machine has {torch.cuda.device_count()} GPU(s)")
        if index is not None:  # set_device refuses a name without an index
            torch.cuda.set_device(device)
    dtype = resolve_dtype(device, dtype)
    return dtype, torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=dtype == "bfloat16")


def memory_stats(device):
    """mem_alloc_mb / mem_reserved_mb / mem_max_alloc_mb: CUDA allocator, or on CPU the process RSS
    (current RSS for alloc and reserved, peak RSS for max)."""
    if "cuda" in str(device):
        mb = 1024 ** 2
        return {"mem_alloc_mb": torch.cuda.memory_allocated() / mb, "mem_reserved_mb": torch.cuda.memory_reserved() / mb,
                "mem_max_alloc_mb": torch.cuda.max_memory_allocated() / mb}
    with open("/proc/self/statm") if os.path.exists("/proc/self/statm") else open(os.devnull) as f:
        fields = f.read().split()
    rss = int(fields[1]) * os.sysconf("SC_PAGE_SIZE") / 1024 ** 2 if fields else float("nan")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux
    return {"mem_alloc_mb": rss, "mem_reserved_mb": rss, "mem_max_alloc_mb": peak}
