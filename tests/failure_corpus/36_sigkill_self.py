# expect: signal 9 (SIGKILL)
# user-frame: no
"""The process is killed with SIGKILL, as the kernel's OOM killer would do; nothing is printed."""

import os
import signal


def main() -> None:
    buffers = [bytearray(1024) for _ in range(10)]
    print(f"allocated {len(buffers)} buffers")
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
