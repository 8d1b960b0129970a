"""Scaling out: several processes, half precision and a compiled decode step: primitives the lecture calls
in sight, where they act; nothing here imports a step file or replaces a function.

    device.py       check_device: the device and dtype a run uses ('auto': bf16 where the hardware runs it
                    fast), the memory columns of the log (what stays float32 under bf16: model.py's opening)
    distributed.py  torchrun (gloo on CPU, nccl on CUDA): the process group; split / gather_sampled (the
                    sampling step's share), shard (the gradient's rows), sum_grads / sum_stats (update)
    compiled.py     compile: CompiledDecode, sampling's decode step (the model's own forward) compiled over a
                    static KV cache, CUDA graphs on a GPU; built once by train_grpo.setup, handed down to
                    model.generate as `decode=`. compile=None (auto): on a GPU where the run's predicted
                    saving exceeds the capture time (`choose`); eager on a CPU, where it pays back only
                    after ~40-420 GRPO steps (docs/performance.md)

Where it plugs in: train_base.main and train_grpo.main open the process group and resolve the dtype; the
step calls the rest (grep `distributed.` in grpo.py and tracin.py, `decode` in train_grpo.py), each a
no-op in one process or with compile=False.
"""
