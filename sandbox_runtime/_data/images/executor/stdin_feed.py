"""A command's standard input, fed from the host while the command runs (``executor.py``).

The host sends the bytes as ``input`` lines of the run (``{"op": "input", "nonce": N, "data": BASE64}``, then
``{"op": "input", "nonce": N, "end": true}``); the executor writes them to the command's stdin pipe as the command
reads them, never blocking its loop. At most BUFFER_MAX_BYTES wait here: past that the executor stops reading its
own stdin until the command has taken some, so the host's socket fills and the host waits (nothing is held whole,
however large the input). A command that closes its stdin (or ends) gets no more: the rest is dropped.

Standard library only: this file runs inside the executor image.
"""

import base64
import binascii
import os
import select

BUFFER_MAX_BYTES = 1 << 20


class Feed:
    """The executor's end of one command's stdin pipe (non-blocking), watched on the executor's poller."""

    def __init__(self, fd, poller):
        self.fd = fd  # None once closed
        self.poller = poller
        self.data = bytearray()
        self.ended = False  # the host said the input is over
        self._watching = False

    @property
    def full(self):
        """Whether the executor should stop reading the host until the command takes some."""
        return len(self.data) >= BUFFER_MAX_BYTES

    def take(self, request):
        """One ``input`` request of the run (op and nonce already checked); False when it is malformed or
        comes after the end."""
        if self.ended:
            return False
        if request.keys() == {"op", "nonce", "end"} and request["end"] is True:
            self.ended = True
            return True
        if request.keys() != {"op", "nonce", "data"} or not isinstance(request["data"], str):
            return False
        try:
            chunk = base64.b64decode(request["data"], validate=True)
        except (binascii.Error, ValueError):
            return False
        if self.fd is not None:
            self.data += chunk
        return True

    def settle(self):
        """Watch the pipe for room while bytes wait; close it once the input is over and all written."""
        if self.fd is None:
            return
        if self.data and not self._watching:
            self.poller.register(self.fd, select.POLLOUT)
            self._watching = True
        elif not self.data and self._watching:
            self.poller.unregister(self.fd)
            self._watching = False
        if not self.data and self.ended:
            self.close()

    def write(self):
        """Write what the pipe takes now; a command that closed its end gets nothing more."""
        try:
            written = os.write(self.fd, self.data)
        except BlockingIOError:
            return
        except OSError:  # EPIPE: the command closed its stdin (SIGPIPE is ignored by the executor)
            self.close()
            return
        del self.data[:written]
        self.settle()

    def close(self):
        if self.fd is None:
            return
        if self._watching:
            self.poller.unregister(self.fd)
            self._watching = False
        os.close(self.fd)
        self.fd = None
        self.data.clear()
