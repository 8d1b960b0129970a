"""
A strict take on nanoGPT's "poor man's configurator": `cfg = configure(defaults, sys.argv[1:])`, e.g.
`python train_base.py config/tiny.py --max_iters=100`. Arguments apply left to right: a bare path is a
Python config file whose top-level names are overrides; `--key=value` overrides one key. Unlike nanoGPT,
a typo'd key or a wrongly typed value is an error (with a suggestion), not a silent no-op or a late crash.
"""
import ast
import difflib
import sys
import types
from pathlib import Path


class UserError(ValueError):
    """A mistake in the user's input (config, checkpoint, prompt...). Scripts print it as one line: `error: ...` and exit 2."""


def _read_config_file(path):
    if not Path(path).is_file():
        raise UserError(f"config file not found: {path}")
    try:
        code = compile(Path(path).read_text(), path, "exec")   # so tracebacks name the config file
    except SyntaxError as e:
        raise UserError(f"syntax error in config file {path}, line {e.lineno}: {e.msg}") from None
    ns = {}
    exec(code, ns)
    # private names (__builtins__, _helpers) and imported modules (`import math`) are not settings
    return {k: v for k, v in ns.items() if not k.startswith("_") and not isinstance(v, types.ModuleType)}


def _parse_cli_value(raw):
    try:
        return ast.literal_eval(raw)            # numbers, bools, None, lists, quoted strings
    except (ValueError, SyntaxError):
        return raw                              # so --out_dir=out/run1 needs no quotes


def _check_type(key, value, default):
    """Return value (converted where lossless) or raise UserError if it does not fit the default's type."""
    if default is None:                         # None means "no fixed type", e.g. an optional path
        return value
    # bool is a subclass of int, so it is excluded explicitly: --batch_size=True is surely a mistake
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value   # --lr=1 means 1.0
    elif isinstance(default, (list, tuple)):
        ok = isinstance(value, (list, tuple))
        value = type(default)(value) if ok else value
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise UserError(f"config key '{key}' expects {type(default).__name__}, "
                        f"got {value!r} ({type(value).__name__})")
    return value


def configure(defaults: dict, argv: list[str]) -> dict:
    """Return a new dict: `defaults` with the config files and --key=value overrides in argv applied."""
    cfg = dict(defaults)
    for arg in argv:
        if arg.startswith("--"):
            if "=" not in arg:
                raise UserError(f"bad argument {arg!r}: overrides are written --key=value, e.g. {arg}=<value>")
            key, raw = arg[2:].split("=", 1)
            overrides, source = {key: _parse_cli_value(raw)}, "command line"
        else:
            overrides, source = _read_config_file(arg), arg
        for key, value in overrides.items():
            if key not in defaults:
                close = difflib.get_close_matches(key, list(defaults), n=3)
                hint = f"did you mean: {', '.join(close)}?" if close else "see the defaults at the top of the script"
                raise UserError(f"unknown config key '{key}' (from {source}); {hint}")
            cfg[key] = _check_type(key, value, defaults[key])
            print(f"Overriding: {key} = {cfg[key]}")
    return cfg


def cli_main(main, argv=None):
    """Run main(argv); a UserError becomes a one-line `error: ...` on stderr and exit status 2."""
    try:
        main(sys.argv[1:] if argv is None else argv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
