"""The project's speed and memory measurements: `python -m bench` (bench/run.py says what each row is).
Not part of the library: nothing outside bench/ and tests/ imports it."""
