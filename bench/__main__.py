"""python -m bench: every row of bench/run.py (its docstring lists them and the knobs)."""
from bench.run import main
from configurator import cli_main

cli_main(main)
