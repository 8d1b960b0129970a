"""The project's speed and memory measurements: `python -m bench` (bench/run.py says what each row is).
Not part of the library: nothing outside bench/ and tests/ imports it. bench/memory.py holds the standard
step at a given size, for harnesses that time a peer library beside it (bench/trl_peer.py).
Nothing is imported here: `python -m bench.X` runs X's start-up (configurator.quiet_start) before torch."""
