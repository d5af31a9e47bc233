# expect: signal 6 (SIGABRT)
# user-frame: no
"""``os.abort()``: the process dies by SIGABRT and Python prints nothing."""

import faulthandler
import os
import resource


def main() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file for this deliberate crash
    faulthandler.disable()  # make the case independent of PYTHONFAULTHANDLER / -X faulthandler
    print("about to abort")
    os.abort()


if __name__ == "__main__":
    main()
