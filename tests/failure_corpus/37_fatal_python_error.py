# expect: Fatal Python error: Segmentation fault
# user-frame: no-source
"""A segfault in native code with faulthandler on: "Fatal Python error" and a most-recent-first stack."""

import ctypes
import faulthandler
import resource


def read_native_buffer(address: int) -> bytes:
    return ctypes.string_at(address)


def main() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file for this deliberate crash
    faulthandler.enable()
    print(read_native_buffer(8))


if __name__ == "__main__":
    main()
