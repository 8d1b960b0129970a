"""
What a run trained, in the formats other tools read (a run on a Hugging Face base directory):

    python export.py --out_dir=out/qwen_grpo                 # out/qwen_grpo/peft_adapter: a peft adapter
    python export.py --out_dir=out/qwen_grpo --merged=True   # and out/qwen_grpo/merged: W + s B A folded in

The adapter loads in peft on the base it was trained on, the merged directory in transformers and in
pretrained/hf.from_pretrained:
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE), "out/qwen_grpo/peft_adapter")
    model = AutoModelForCausalLM.from_pretrained("out/qwen_grpo/merged")

It writes only new directories (or empty ones) and its own earlier adapters (marked by
grpo_export.json, which names the checkpoint and iteration), each checked before the model is
loaded; an earlier merged model is never replaced (a run may have been trained on it). It holds the
run's lock (an export during training is refused) and each output's (.<name>.export.lock beside
it: a second export into it is refused). Ctrl-C, SIGTERM or a full disk leave nothing
half-written; what a killed export left, the next one removes.
--ckpt=RUN/ckpt_000100.pt exports that checkpoint into RUN.
"""
# configurator first: a Ctrl-C during the slow imports below (torch) is one line, not a traceback
from configurator import UserError, check, cli_main, configure, quiet_start
quiet_start(__name__)
import json
import os
import signal
import sys
from contextlib import ExitStack, contextmanager

from fileio import check_output_dir
from pretrained.hf import EXPORT_FILES, EXPORT_MARK, hf_dtype, is_export
from pretrained.hf import save_peft_adapter, save_pretrained
from lora import lora_modules, merge_lora
from runs.checkpoint import load_checkpoint
from runs.base import resolve_base
from runs.rundir import run_lock
from runs.loading import load_policy, nonfinite_weight

defaults = dict(
    out_dir="",          # the train_grpo.py run; '' = the directory of --ckpt, or else out/grpo
    ckpt="",             # '' = out_dir/ckpt.pt (the last step); or one of its ckpt_NNNNNN.pt
    adapter_dir="",      # '' = out_dir/peft_adapter
    merged=False,        # also write the merged model
    merged_dir="",       # '' = out_dir/merged
    base_ckpt="",        # the run's base where it is now, if it moved ('' = where the run found it)
)


def same_path(a, b):
    return os.path.realpath(a) == os.path.realpath(b)


def run_and_checkpoint(cfg):
    """(run directory, checkpoint path): a checkpoint lies in its run's directory, where the outputs go by
    default, so an --out_dir that is not the directory of --ckpt names another run: refused."""
    if cfg["ckpt"]:
        run = os.path.dirname(cfg["ckpt"]) or "."
        if cfg["out_dir"] and not same_path(run, cfg["out_dir"]):
            raise UserError(f"--ckpt={cfg['ckpt']} belongs to the run in {run}, not to --out_dir={cfg['out_dir']}: "
                            f"give --ckpt alone (the outputs go into {run}), and name other outputs with "
                            f"--adapter_dir / --merged_dir")
        return run, cfg["ckpt"]
    run = cfg["out_dir"] or "out/grpo"
    return run, os.path.join(run, "ckpt.pt")


def output_dirs(cfg, run):
    """(adapter_dir, merged_dir or None), both checked before anything is loaded or written: new, empty or
    an earlier export; two names for one directory (or one inside the other) refused."""
    check(cfg, "merged_dir", cfg["merged"] or not cfg["merged_dir"], "is written only with --merged=True")
    adapter_dir = cfg["adapter_dir"] or os.path.join(run, "peft_adapter")
    merged_dir = (cfg["merged_dir"] or os.path.join(run, "merged")) if cfg["merged"] else None
    if merged_dir:
        a, m = os.path.realpath(adapter_dir), os.path.realpath(merged_dir)
        if a == m or m.startswith(a + os.sep) or a.startswith(m + os.sep):
            raise UserError(f"--adapter_dir={adapter_dir} and --merged_dir={merged_dir} are the same directory or "
                            f"one holds the other: give two separate directories")
    replaced = [d for key, d in (("adapter_dir", adapter_dir), ("merged_dir", merged_dir))
                if d and check_output_dir(d, key, is_export, EXPORT_FILES)]
    if merged_dir in replaced:
        raise UserError(f"merged_dir {merged_dir} holds an earlier merged model "
                        f"({exported_from(merged_dir)}); a run trained on it "
                        f"(--base_ckpt={merged_dir}) would lose its base, so it is never replaced: "
                        f"give another --merged_dir, or remove it if no run uses it")
    return adapter_dir, merged_dir, replaced


def exported_from(path):
    """'iter N of CKPT', from the mark an export leaves."""
    try:
        with open(os.path.join(path, EXPORT_MARK)) as f:
            mark = json.load(f)
        return f"iter {mark.get('iter')} of {mark.get('ckpt')}"
    except (OSError, ValueError, AttributeError):
        return "an earlier export"


@contextmanager
def claimed(path, key):
    """`path` for this export alone while the block runs: .<name>.export.lock beside it, held with
    flock (let go by the kernel when its process ends: never stale). A second export into `path`
    meanwhile is refused."""
    import fcntl
    parent, name = os.path.split(os.path.abspath(path))
    # the folders made for it, deepest first: removed again if nothing is written
    made, d = [], parent
    while not os.path.isdir(d):
        made, d = made + [d], os.path.dirname(d)
    os.makedirs(parent, exist_ok=True)
    lock = os.path.join(parent, f".{name}.export.lock")
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise UserError(f"{key} {path} is taken: another export (PID {pid}) is writing it "
                            f"now; wait for it to end, or give another --{key}") from None
        # the holder removes the file as it lets go: a lock on a removed file holds nothing, again
        try:
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    try:
        yield
    finally:
        os.remove(lock)  # removed while still held, so that no one takes a lock on it as it goes
        os.close(fd)
        for d in made if not os.path.exists(path) else []:
            try:
                os.rmdir(d)
            except OSError:  # something else was put there meanwhile: left as it is
                break


class Terminated(BaseException):
    """SIGTERM during an export: raised where the process is, so that each writer removes its
    partial directory on the way out (as for Ctrl-C), instead of the process ending at once."""


def _terminate(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the clean-up short
    raise Terminated()


def main(argv):
    cfg = configure(defaults, argv)
    run, path = run_and_checkpoint(cfg)
    if not os.path.isfile(path):  # before any lock or folder is made: a mistyped run leaves nothing
        load_checkpoint(path)  # its one-line error: not found, or a directory
    # refused before any lock is taken or file written
    adapter_dir, merged_dir, _ = output_dirs(cfg, run)
    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread (called as a function): SIGTERM stays as it is
        previous = None
    try:
        with ExitStack() as held:
            # the run's lock: a training run in this directory is refused (its checkpoint is still
            # moving); a run directory this user cannot write to (another user's) is read without it
            if os.path.isdir(run) and os.access(run, os.W_OK):
                busy = "wait for the run to end (export reads its checkpoint)"
                held.enter_context(run_lock(run, busy=busy))
            for key, out in (("adapter_dir", adapter_dir), ("merged_dir", merged_dir)):
                if out:
                    held.enter_context(claimed(out, key))
            # again: they are ours from here on
            adapter_dir, merged_dir, replaced = output_dirs(cfg, run)
            export(cfg, path, adapter_dir, merged_dir, replaced)
    except Terminated:
        print("terminated (SIGTERM): the export stopped; nothing half-written is left",
              file=sys.stderr)
        sys.exit(143)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


@contextmanager
def written(out, key):
    """Turn a failed write (a full disk, a file too large, a lost mount) into one line naming `out`;
    the writer has already removed its partial directory."""
    try:
        yield
    except (OSError, Exception) as e:  # safetensors' own error wraps the OS error in its message
        if not isinstance(e, OSError) and type(e).__name__ != "SafetensorError":
            raise
        reason = (e.strerror or str(e)) if isinstance(e, OSError) else str(e).split(": ", 1)[-1]
        raise UserError(f"cannot write {key} {out}: {reason}; nothing of it was left behind: free "
                        f"space there, or give another --{key}") from None


def export(cfg, path, adapter_dir, merged_dir, replaced):
    ckpt = load_checkpoint(path)
    if "lora" not in ckpt or "base_ckpt" not in ckpt:
        raise UserError(f"{path} is not a train_grpo.py checkpoint (no LoRA adapter): give the out_dir of a GRPO run")
    base, run_cfg = resolve_base(ckpt, path, cfg["base_ckpt"]), ckpt["config"]  # as sample.py finds it
    if not os.path.isdir(base):
        raise UserError(f"the run's base {base} is a train_base.py checkpoint, which peft and transformers cannot "
                        f"read: export needs a run on a Hugging Face model directory (train_grpo.py --base_ckpt=DIR)")
    source = {"ckpt": os.path.abspath(path), "iter": ckpt.get("iter_num"), "base": os.path.abspath(base)}
    said = f"iter {source['iter']} of {path}"
    model, _, _ = load_policy(path, base_ckpt=base)  # base + adapter, checked against the base's identity
    bad = nonfinite_weight(model, adapter=True)
    if bad is not None:  # peft and transformers would load it without a word
        raise UserError(f"{path}: LoRA weight {bad} holds NaN/Inf (the run diverged), so it is "
                        f"not exported: give an earlier checkpoint, --ckpt=RUN/ckpt_NNNNNN.pt")
    again = lambda d: " (replacing an earlier export)" if d in replaced else ""  # noqa: E731
    with written(adapter_dir, "adapter_dir"):
        r, alpha = run_cfg["lora_r"], run_cfg["lora_alpha"]
        save_peft_adapter(model, adapter_dir, base, r, alpha, source)
    n = len(lora_modules(model))
    print(f"wrote {adapter_dir}{again(adapter_dir)}: peft LoRA adapter of {said} (r={run_cfg['lora_r']}, "
          f"{n} layers, on {base})")
    if merged_dir:
        with written(merged_dir, "merged_dir"):
            save_pretrained(merge_lora(model), merged_dir, base, hf_dtype(base), source)
        print(f"wrote {merged_dir}{again(merged_dir)}: the merged model of {said} ({hf_dtype(base)})")


if __name__ == "__main__":
    cli_main(main)
