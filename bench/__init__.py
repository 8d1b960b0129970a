"""The project's speed and memory measurements: `python -m bench` (bench/run.py says what each row is).
Not part of the library: nothing outside bench/ and tests/ imports it. The standard step at a given
size is exported here for harnesses that time a peer library beside it (bench/trl_peer.py)."""
# configurator first: a Ctrl-C while torch is imported below is one line, not a traceback
import configurator  # noqa: F401
from bench.memory import project_grpo_step, step_inputs  # noqa: F401
__all__ = ["project_grpo_step", "step_inputs"]
