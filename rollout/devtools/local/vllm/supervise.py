"""Run a command and stop it when the process that started us dies (fate sharing for vLLM).

``python supervise.py PARENT_PID -- CMD...`` (run as a file, not ``-m``: nothing of the project is
imported, so it starts in about 20 ms under any python). The command runs in this process's
process group (the caller starts this one in a new session); this process:

* exits with the command's exit status once it exits;
* forwards SIGTERM and SIGINT to it;
* once ``PARENT_PID`` is no longer its parent (the caller died, even by SIGKILL), sends SIGTERM to
  its whole process group (vLLM's API server, engine core and worker), then SIGKILL after 10 s.

vLLM's own entry point cannot take a ``--parent-pid`` flag as the local stack's servers do
(:func:`rollout.core.fate.share_fate`), and ``PR_SET_PDEATHSIG`` would follow the starting thread,
hence this wrapper.
"""

import os
import signal
import subprocess
import sys
import time

_GRACE_S = 10.0
_POLL_S = 0.5


def main(argv: list[str]) -> int:
    """Run ``argv[2:]`` (after ``--``) under parent ``argv[0]``; returns its exit status."""
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: supervise.py PARENT_PID -- CMD...\n")
        return 2
    parent, cmd = int(argv[0]), argv[2:]
    if os.getppid() != parent:
        return 1
    child = subprocess.Popen(cmd)
    term_at: list[float] = []

    def forward(signum, frame) -> None:
        if not term_at:
            term_at.append(time.monotonic())
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        code = child.poll()
        if code is not None:
            return code if code >= 0 else 128 - code
        if not term_at and os.getppid() != parent:
            sys.stderr.write(f"supervise: parent {parent} is gone; stopping the process group\n")
            term_at.append(time.monotonic())
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            os.killpg(0, signal.SIGTERM)
        if term_at and time.monotonic() - term_at[0] > _GRACE_S:
            os.killpg(0, signal.SIGKILL)  # this process too
        time.sleep(_POLL_S)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
