# Ctrl-C sent to a child process in a test: the child gets Python's default SIGINT handling (a
# KeyboardInterrupt) however the suite was started. Under `nohup python -m pytest ... &` SIGINT is
# ignored, and children inherit an ignored signal, so a Ctrl-C sent to them would do nothing.
# Use: subprocess.Popen(argv, ..., preexec_fn=default_ctrl_c)
import signal


def default_ctrl_c():
    """Run in the child before it starts Python: SIGINT back to SIG_DFL, which Python turns into
    its KeyboardInterrupt handler at start-up (it keeps a SIG_IGN it inherits)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
