"""The sandbox's first process where the engine gives it no init (a Kubernetes pod; ``podman kube play``): it
keeps the container alive and reaps the processes that end up its children, as Docker's ``--init`` does.

Usage: python -I -S keeper.py

As pid 1 of the container's pid namespace it is never reached by the code's ``kill(-1)`` sweeps, whatever its
uid, and signals it has no handler for are not delivered to it. Orphans are reparented to it; each one that ends
is reaped at once (SIGCHLD is blocked and waited for, so none is missed between two looks), so a run's
processes never linger as zombies that count against the pids limit. It runs no code of its own and reads
nothing.

Standard library only: this file runs inside the executor image.
"""

import os
import signal


def main():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    while True:
        while True:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        signal.sigwait({signal.SIGCHLD})


if __name__ == "__main__":
    main()
