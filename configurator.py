"""
A strict take on nanoGPT's "poor man's configurator":
`cfg = configure(defaults, sys.argv[1:])`,
e.g. `python train_base.py config/tiny_base.py --max_iters=100`.
Arguments apply left to right: a bare path is a Python config file whose
top-level names are overrides; `--key=value` overrides one key.
Unlike nanoGPT, a typo'd key or a wrongly typed value is an error
(with a suggestion), not a silent no-op or a late crash.
A script's start-up and its one-line errors: `quiet_start(__name__)` right
after importing it, `cli_main(main)` at the end. Importing this module
changes nothing in the process (no signal handler, no torch).
"""
import ast
import difflib
import math
import os
import re
import signal
import sys
import traceback
import types
from pathlib import Path


def _interrupted_while_starting(signum, frame):
    print("interrupted (Ctrl-C) while starting up: nothing was done",
          file=sys.stderr)
    os._exit(130)


def quiet_start(name):
    """A script's first line after importing configurator:
    `quiet_start(__name__)`. Run as a script (`python X.py`,
    `python -m analysis.plot`: name is "__main__"), a Ctrl-C during its slow
    imports (torch) is one line instead of a traceback; cli_main hands
    Ctrl-C back to Python (KeyboardInterrupt). Imported (a test, another
    script, a notebook), nothing changes. Nor where Ctrl-C is ignored
    (under nohup)."""
    default = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if name == "__main__" and default:
        signal.signal(signal.SIGINT, _interrupted_while_starting)


class Terminated(KeyboardInterrupt):
    """SIGTERM (a job scheduler, `kill`) under cli_main: the run ends as
    after Ctrl-C (its last checkpoint kept, the command that resumes it
    said, its lock let go), exit status 143."""


def _terminate(signum, frame):
    # a second one must not cut the clean-up short
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated()


class UserError(ValueError):
    """A mistake in the user's input (config, checkpoint, prompt...).
    Scripts print it as one line: `error: ...` and exit 2."""


def read_config_file(path):
    if not Path(path).is_file():
        raise UserError(f"config file not found: {path}")
    try:
        # so tracebacks name the config file
        code = compile(Path(path).read_text(), path, "exec")
    except SyntaxError as e:
        raise UserError(f"syntax error in config file {path}, "
                        f"line {e.lineno}: {e.msg}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read config file {path}: {e}") from None
    ns = {}
    try:
        exec(code, ns)
    # NameError, sys.exit(): the file's own line, not ours
    except (Exception, SystemExit) as e:
        frames = traceback.extract_tb(e.__traceback__)
        line = [f.lineno for f in frames if f.filename == path][-1:] or ["?"]
        raise UserError(f"config file {path}, line {line[0]}: "
                        f"{type(e).__name__}: {e}") from None
    # private names (__builtins__, _helpers) and imported modules
    # (`import math`) are not settings
    return {k: v for k, v in ns.items()
            if not k.startswith("_") and not isinstance(v, types.ModuleType)}


def _parse_cli_value(raw, default):
    try:
        # numbers, bools, None, lists, quoted strings
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        value = raw  # so --out_dir=out/run1 needs no quotes
    if isinstance(default, float) and isinstance(value, str):
        try:
            # --grad_clip=inf (then refused where Inf makes no sense)
            return float(raw)
        except ValueError:
            return value
    if isinstance(default, str) and not isinstance(value, str):
        return raw  # a text key takes the text as typed: --question=1234
    sequence = isinstance(default, (list, tuple))
    if sequence and isinstance(value, str):
        # --reward_funcs=correctness,format
        return [_parse_cli_value(v.strip(), None) for v in value.split(",")]
    if sequence and not isinstance(value, (list, tuple)):
        return [value]  # --reward_weights=1.0
    return value


def _check_type(key, value, default):
    """Return value (converted where lossless)
    or raise UserError if it does not fit the default's type."""
    if default is None:  # None means "no fixed type", e.g. an optional path
        return value
    # bool is a subclass of int, so it is excluded explicitly:
    # --batch_size=True is surely a mistake
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value  # --lr=1 means 1.0
    elif isinstance(default, (list, tuple)):
        ok = isinstance(value, (list, tuple))
        value = type(default)(value) if ok else value
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise UserError(f"config key '{key}' expects "
                        f"{type(default).__name__}, "
                        f"got {value!r} ({type(value).__name__})")
    return value


def configure(defaults: dict, argv: list[str],
              saved: dict | None = None) -> dict:
    """Return a new dict: `defaults` with the config files and --key=value
    overrides in argv applied.

    saved: a resumed run's config. It replaces the defaults (a resume
    continues the run as it was configured), and only what argv gives
    overrides it; each key whose final value differs from the saved run's
    is printed once, after every argument (a later one may undo an
    earlier one)."""
    cfg = dict(defaults)
    rank0 = os.environ.get("RANK", "0") == "0"  # torchrun: rank 0 speaks
    say = print if rank0 else (lambda *a, **k: None)
    if saved is not None:
        saved = {k: _check_type(k, v, defaults[k])
                 for k, v in saved.items() if k in defaults}
        cfg.update(saved)
    given = {}  # the keys argv sets, in the order first given
    # the keys a config file set last: {key: its path}
    # (set_in names it in errors)
    sources = {}
    for arg in argv:
        if arg.startswith("--"):
            if "=" not in arg and isinstance(defaults.get(arg[2:]), bool):
                arg += "=True"  # a plain flag: --quick is --quick=True
            if "=" not in arg:
                raise UserError(f"bad argument {arg!r}: overrides are "
                                f"written --key=value, e.g. {arg}=<value>")
            key, raw = arg[2:].split("=", 1)
            overrides = {key: _parse_cli_value(raw, defaults.get(key))}
            source = "command line"
        # not a file: a dash too few
        elif arg.startswith("-") and not os.path.isfile(arg):
            raise UserError(f"bad argument {arg!r}: not a config file; "
                            f"did you mean -{arg}? "
                            "(overrides are written --key=value)")
        else:
            overrides, source = read_config_file(arg), arg
        for key, value in overrides.items():
            if key not in defaults:
                close = difflib.get_close_matches(key, list(defaults), n=3)
                if close:
                    hint = f"did you mean: {', '.join(close)}?"
                else:
                    hint = "see the defaults at the top of the script"
                raise UserError(f"unknown config key '{key}' "
                                f"(from {source}); {hint}")
            value = _check_type(key, value, defaults[key])
            # bad: what Python makes of a command-line byte that is not
            # UTF-8: no text to print, tokenize or write (the 'Overriding'
            # line below would already fail)
            bad = None
            if isinstance(value, str):
                surrogates = (c for c in value if "\ud800" <= c <= "\udfff")
                bad = next(surrogates, None)
            if bad is not None:
                raise UserError(f"{key} holds U+{ord(bad):04X}, "
                                "a lone surrogate (a byte that is not UTF-8, "
                                "from a terminal or file in another "
                                "encoding?): give it as UTF-8 text")
            # quoted or in a config file: no shell expanded it
            tilde = isinstance(value, str) and value.startswith("~")
            if tilde and PATH_KEY.search(key):
                value = _home(key, value)
            if saved is None:
                say(f"Overriding: {key} = {value}")
            cfg[key] = given[key] = value
            if source == "command line":
                sources.pop(key, None)
            else:
                sources[key] = source
    for key in given if saved is not None else ():
        kept = key in ("init_from", "out_dir")
        if key in saved and saved[key] != cfg[key] and not kept:
            say(f"resume: {key} = {cfg[key]} "
                f"(the saved run had {saved[key]})")
    return Config(cfg, sources)


class Config(dict):
    """The knobs configure settles on, and `sources`:
    {key: the config file that set it last}. A copy ({**cfg}, what
    a checkpoint saves) is a plain dict of the knobs."""

    def __init__(self, knobs, sources):
        super().__init__(knobs)
        self.sources = sources


def set_in(cfg, key):
    """The config file that set cfg[key] (configure's argv), or None:
    typed on the command line, a default, or a resumed run's. Errors name
    it, so no one looks for a --key they never typed."""
    return getattr(cfg, "sources", {}).get(key)


def named(cfg, key):
    """"config key 'K' = V", with the config file that set it:
    "(set in config/x.py)"."""
    where = set_in(cfg, key)
    set_by = f" (set in {where})" if where else ""
    return f"config key '{key}' = {cfg[key]!r}" + set_by


# a path's name
PATH_KEY = re.compile(r"(^|_)(dir|root|ckpt|file|json|html|figure|config|path)$")


def _home(key, value):
    """A path knob's ~ or ~user as the shell would expand it:
    never a folder named '~'."""
    path = os.path.expanduser(value)
    if path.startswith("~"):
        raise UserError(f"{key} {value!r} starts with a ~ that names no home "
                        "directory here: give the path in full")
    return path


def check(cfg, key, ok, allowed):
    """Raise a one-line UserError naming the key, its value and what is
    allowed, unless ok."""
    if not ok:
        raise UserError(f"{named(cfg, key)} is not allowed: {allowed}")


# a float knob beyond it is Inf in a float32 tensor
FLOAT32_MAX = 3.4028234663852886e38
# torch.manual_seed's 64 bits hold seed + a step too
SEED_MIN, SEED_MAX = -2 ** 63, 2 ** 63 - 1


def check_finite(cfg, *allowed_inf):
    """Every number knob is one the tensors can take: no float NaN, nor
    beyond float32's range (1e39 is Inf as a float32), nor +-Inf unless
    listed (grad_clip=inf: no clipping); a seed ('seed', '*_seed') a signed
    64-bit integer: torch.manual_seed(seed + step) never overflows."""
    for k, v in cfg.items():
        if isinstance(v, float) and k not in allowed_inf:
            check(cfg, k, math.isfinite(v), "must be a finite number")
            check(cfg, k, abs(v) <= FLOAT32_MAX,
                  "must fit a float32 (at most 3.4e38 in size)")
        is_seed = k == "seed" or k.endswith("_seed")
        if is_seed and isinstance(v, int) and not isinstance(v, bool):
            check(cfg, k, SEED_MIN <= v <= SEED_MAX,
                  "must be a 64-bit integer, -2**63 to 2**63 - 1 "
                  "(what torch.manual_seed takes), e.g. 1337")


def check_adam_lr(cfg, beta1, *keys):
    """AdamW's first step moves a weight by lr / (1 - beta1), converted to
    a float32: beyond its range that is an overflow error inside the
    optimizer, not a divergence the loop reports."""
    for k in keys:
        largest = FLOAT32_MAX * (1 - beta1)
        check(cfg, k, cfg[k] / (1 - beta1) <= FLOAT32_MAX,
              f"must be at most {largest:.3g}: AdamW moves by it / "
              f"(1 - beta1={beta1:g}), which must fit a float32 (3.4e38)")


def check_decay(cfg):
    """The cosine decays learning_rate down to min_lr: a min_lr above it
    would climb instead (the last steps the largest), which no one means."""
    check(cfg, "min_lr", cfg["min_lr"] <= cfg["learning_rate"],
          f"must be at most learning_rate={cfg['learning_rate']:g}: "
          "the rate decays from learning_rate down to min_lr")


def check_positive(cfg, *keys):
    for k in keys:
        check(cfg, k, cfg[k] > 0, "must be > 0")


def check_nonnegative(cfg, *keys):
    for k in keys:
        check(cfg, k, cfg[k] >= 0, "must be >= 0")


def check_choice(cfg, key, choices):
    listed = ", ".join(repr(c) for c in choices)
    check(cfg, key, cfg[key] in choices, f"must be one of {listed}")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C in a training loop; its message says where the run stopped
    and how to resume it."""


def cli_main(main, argv=None):
    """Run main(argv). A UserError, or an OS error (disk full, permission
    denied), becomes a one-line `error: ...` on stderr and exit status 2;
    Ctrl-C one line and exit status 130 (128 + SIGINT)."""
    if signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # SIGTERM as Ctrl-C, in one process
    # (torchrun's workers keep its own handling)
    default_term = signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    on_term = default_term and os.environ.get("WORLD_SIZE", "1") == "1"
    try:
        if on_term:
            signal.signal(signal.SIGTERM, _terminate)
    # not the main thread (called as a function): SIGTERM stays as it is
    except ValueError:
        on_term = False
    try:
        main(sys.argv[1:] if argv is None else argv)
        if launched():
            # under torchrun: end now, the work is done (distributed.finish)
            exit_now(0)
    except UserError as e:
        # one write: ranks' lines never interleave
        sys.stderr.write(f"error: {e}\n")
        _exit(2)
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        reason = e.strerror or e
        sys.stderr.write(f"error: {where}{reason}\n")
        _exit(2)
    except KeyboardInterrupt as e:
        # _terminate ran
        sigterm = signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        term = on_term and sigterm
        what = "terminated (SIGTERM)" if term else "interrupted"
        if str(e):
            message = f"{what}: {e}"
        elif term:
            message = what
        else:
            message = "interrupted (Ctrl-C)"
        print(message, file=sys.stderr)
        _exit(143 if term else 130)
    # a crash under torchrun: its traceback, then end at once (see _exit)
    except Exception:
        if launched_world_size() == 1:
            raise
        traceback.print_exc()
        _exit(1)
    finally:
        if on_term:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        # a script's end: Ctrl-C now would only cut short the interpreter's
        # own clean-up (torch's atexit: a traceback); SIGTERM would end the
        # finished work with 143 and no word: both ignored
        if argv is None:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            if on_term:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)


# torchrun's environment, read here (configurator imports no torch) and by scale/distributed.py
def launched():
    """Started by torchrun (RANK, WORLD_SIZE and LOCAL_RANK set)?"""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def launched_world_size():
    """The number of processes torchrun started (1 without torchrun), known before any process
    group exists: for the knob checks and the exit below."""
    return int(os.environ["WORLD_SIZE"]) if launched() else 1


def _exit(code):
    """sys.exit(code); under torchrun os._exit, so that the other ranks are
    not left waiting in a collective for this one (distributed.fail)."""
    if launched_world_size() > 1:
        exit_now(code)
    sys.exit(code)


def exit_now(code):
    """os._exit after flushing: no interpreter finalisation, where torchrun's
    process group can wait on other ranks or abort (distributed.finish)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
