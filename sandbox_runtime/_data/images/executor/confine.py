"""In-sandbox confinement the runner applies to itself just before it starts the code, which inherits it.

* ``no_new_privs`` is set, and a seccomp filter is installed that refuses (EPERM) the system calls a sandboxed
  script never needs and an escape always does: namespaces (``unshare``, ``setns``, ``clone`` with namespace
  flags; ``clone3`` answers ENOSYS so the C library falls back to ``clone``), ``mount``, keyrings, ``bpf``,
  ``ptrace``, ``perf_event_open``, ``userfaultfd``, ``io_uring``, kernel modules and other host-wide calls.
  Docker's default profile already does this for ``runc``; gVisor applies that profile only to the
  container's first process, not to ``docker exec``, so without this filter code run under ``runsc`` could
  create user namespaces inside gVisor. Filters stack: under ``runc`` this is a second, narrower layer.
* Under gVisor, ``RLIMIT_NPROC`` keeps a fork bomb from reaching the host's pids limit, which would end the
  whole gVisor sandbox instead of failing ``fork`` with EAGAIN.

The filter's system call numbers are x86_64's. On other machines only ``no_new_privs`` and the rlimit are
applied here: under ``runc`` Docker's filter still holds; under ``runsc`` the host's self-check, which tries a
user namespace from inside, then fails closed and no sandbox starts.

:func:`forbid_inspection` makes the runner itself non-dumpable, so a script of the same uid cannot open its
memory or (under runc) its descriptors through ``/proc``; ``exec`` resets it, so the script stays dumpable.
Standard library only: this file runs inside the executor image.
"""

import ctypes
import os
import resource
import struct

PR_SET_DUMPABLE = 4
PR_SET_NAME = 15
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
CLONE_NAMESPACE_FLAGS = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET

RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
RET_KILL_PROCESS = 0x80000000
EPERM, ENOSYS = 1, 38

LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06

SYSCALL_CLONE = 56
SYSCALL_CLONE3 = 435
REFUSED = {
    "ptrace": 101,
    "syslog": 103,
    "personality": 135,
    "adjtimex": 159,
    "chroot": 161,
    "acct": 163,
    "settimeofday": 164,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "iopl": 172,
    "ioperm": 173,
    "init_module": 175,
    "delete_module": 176,
    "quotactl": 179,
    "lookup_dcookie": 212,
    "clock_settime": 227,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "move_pages": 279,
    "perf_event_open": 298,
    "fanotify_init": 300,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "clock_adjtime": 305,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "pivot_root": 155,
    "vhangup": 153,
}


def _program():
    """The filter as (code, jt, jf, k) rows; jumps name labels and are resolved to offsets below."""
    rows = [
        (LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        (JEQ_K, None, "kill", AUDIT_ARCH_X86_64),
        (LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
        (JGE_K, "eperm", None, X32_SYSCALL_BIT),
    ]
    rows += [(JEQ_K, "eperm", None, number) for number in sorted(REFUSED.values())]
    rows += [
        (JEQ_K, "clone", None, SYSCALL_CLONE),
        (JEQ_K, "enosys", None, SYSCALL_CLONE3),
        (RET_K, 0, 0, RET_ALLOW),
        ("clone",),
        (LD_W_ABS, 0, 0, 16),  # the low 32 bits of args[0]: clone's flags
        (JSET_K, "eperm", None, CLONE_NAMESPACE_FLAGS),
        (RET_K, 0, 0, RET_ALLOW),
        ("eperm",),
        (RET_K, 0, 0, RET_ERRNO | EPERM),
        ("enosys",),
        (RET_K, 0, 0, RET_ERRNO | ENOSYS),
        ("kill",),
        (RET_K, 0, 0, RET_KILL_PROCESS),
    ]
    labels, code = {}, []
    for row in rows:
        if len(row) == 1:
            labels[row[0]] = len(code)
        else:
            code.append(row)
    return [
        (op, _offset(labels, jt, index), _offset(labels, jf, index), k) for index, (op, jt, jf, k) in enumerate(code)
    ]


def _offset(labels, target, index):
    """A jump from row ``index`` to ``target`` counts the rows in between (0: the next row)."""
    return 0 if target is None or isinstance(target, int) else labels[target] - index - 1


def install(nproc_max):
    """Confine the calling process and every process it starts from now on."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if nproc_max > 0:
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc_max, nproc_max))
    if os.uname().machine != "x86_64":
        return  # the numbers below are x86_64's; elsewhere Docker's filter is the only one (see the docstring)
    rows = _program()
    blob = b"".join(struct.pack("=HBBI", *row) for row in rows)
    buffer = ctypes.create_string_buffer(blob)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = SockFprog(len(rows), ctypes.addressof(buffer))
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def forbid_inspection():
    """Make the calling process non-dumpable: ``/proc/<pid>/mem``, ``environ`` and ``fd`` need CAP_SYS_PTRACE."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


def allow_inspection():
    """Make the calling process dumpable again (a forked run, as a script ``exec`` started would be)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


def set_name(name):
    """Set the calling process's name (``/proc/<pid>/comm``, at most 15 bytes)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NAME) failed")
