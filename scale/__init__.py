"""Scaling out: several processes and half precision, wired in once at start-up, outside the step.

    device.py       check_device: the device and dtype a run uses ('auto': bf16 where the hardware runs it
                    fast), per-phase device sync and the memory columns of the log
    distributed.py  torchrun (gloo on CPU, nccl on CUDA): the process group, and wrap_step, which wraps the
                    step's sampling and gradient so that each process takes its share of the prompts and
                    rows and the sums make the update equal one process's
    compiled.py     compile=True: torch.compile of sampling's decode step over a fixed-shape KV cache (off by
                    default: it pays back only after ~40-420 GRPO steps on a CPU, docs/performance.md)

Where it plugs in: train_base.main and train_grpo.main open the process group and resolve the dtype;
train_grpo.main calls distributed.wrap_step once (a no-op in one process), then compiled.wrap_generate (a no-op
unless compile=True).
"""
