"""python -m bench: every row of bench/run.py (its docstring lists them and the knobs)."""
# configurator first: a Ctrl-C during the slow imports below (torch) is one line, not a traceback
from configurator import cli_main, quiet_start
quiet_start(__name__)
from bench.run import main  # noqa: E402

cli_main(main)
