"""Building the executor image, with or without a container registry.

Two ways, picked automatically (``source="auto"``):

* ``registry``: ``FROM python:3.11-slim-bookworm`` when that image is present locally or a registry answers, and
  the machine's own apt (a Debian bookworm host) downloads the system packages the image adds;
* ``offline``: a Debian bookworm root filesystem made with ``debootstrap`` (from the machine's own Debian
  mirror) with those packages, imported with ``docker import``.

Either way the image has the same system packages (``procps``: ``ps``, ``pkill``, ``pgrep``, ``top``, what
agents and the frameworks' shell tools reach for; no set-uid file, no protection lost: the code reads its own
``/proc`` anyway), checked in the build.

Either way the Python packages come from a wheelhouse downloaded on the host (pinned in
``images/executor/requirements.txt``) and the build runs with ``--network none``. The tag is a hash of the
image's inputs (Dockerfile, requirements, in-sandbox helpers), so nothing rebuilds when nothing changed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from sandbox_runtime.errors import ImageError
from sandbox_runtime.policy import SandboxPolicy
from sandbox_runtime.sandbox.backend import ImageBuilder, ProgressCallback

__all__ = [
    "IMAGE_REPOSITORY",
    "SYSTEM_PACKAGES",
    "ImageBuildReport",
    "build_executor_image",
    "default_cache_dir",
    "executor_image_tag",
    "sandbox_image",
]

logger = logging.getLogger(__name__)

IMAGE_REPOSITORY = "sandbox-runtime-executor"
SLIM_BASE = "python:3.11-slim-bookworm"
_REGISTRY_HOST = "registry-1.docker.io"
_DEBIAN_SUITE = "bookworm"
SYSTEM_PACKAGES = ("procps", "libproc2-0")  # added to either base (libproc2-0: procps's library, not in the slim one)
_DEBOOTSTRAP_PACKAGES = ",".join(("python3", "python3-venv", "passwd", *SYSTEM_PACKAGES))
_MANYLINUX_TAGS = ("manylinux2014", "manylinux_2_17", "manylinux_2_28")
_IMAGE_FILES = (
    "Dockerfile",
    "requirements.txt",
    "run.py",
    "confine.py",
    "selfcheck.py",
    "executor.py",
    "sandbox_tools.py",
    "keeper.py",
    "stdin_feed.py",
    "files.py",
)
_SUBPROCESS_TIMEOUT_S = 900

Source = Literal["auto", "registry", "offline"]


class ImageBuildReport(BaseModel):
    """What ``image build`` did."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tag: str
    source: Literal["registry", "offline", "existing"]
    base_image: str | None
    built: bool


def _image_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "_data" / "images" / "executor"


def executor_image_tag() -> str:
    """``sandbox-runtime-executor:<16 hex>``, a hash of everything that goes into the image."""
    digest = hashlib.sha256(f"{_DEBIAN_SUITE}|{_DEBOOTSTRAP_PACKAGES}\0".encode())
    folder = _image_dir()
    for name in _IMAGE_FILES:
        digest.update(name.encode() + b"\0" + (folder / name).read_bytes() + b"\0")
    return f"{IMAGE_REPOSITORY}:{digest.hexdigest()[:16]}"


def sandbox_image(policy: SandboxPolicy) -> str:
    """The image sandboxes run: the policy's ``sandbox.image``, else the locally built one (its content tag)."""
    return policy.image or executor_image_tag()


def default_cache_dir(environment: Mapping[str, str] | None = None) -> Path:
    """Where wheelhouses and root filesystems are kept: ``$XDG_CACHE_HOME/sandbox-runtime``."""
    env = os.environ if environment is None else environment
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", "/root")) / ".cache")
    return Path(base) / "sandbox-runtime"


def _run(command: list[str], progress: ProgressCallback, what: str) -> None:
    progress(f"{what}: {' '.join(command[:3])} …")
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=_SUBPROCESS_TIMEOUT_S, check=False)
    except FileNotFoundError as exc:
        raise ImageError(f"{what}: {command[0]} is not installed ({exc})") from exc
    except subprocess.TimeoutExpired as exc:
        raise ImageError(f"{what}: {command[0]} did not finish in {_SUBPROCESS_TIMEOUT_S} s") from exc
    if completed.returncode != 0:
        tail = "\n".join((completed.stderr or completed.stdout).strip().splitlines()[-15:])
        raise ImageError(f"{what} failed (exit code {completed.returncode}):\n{tail}")


def _wheelhouse(cache_dir: Path, progress: ProgressCallback) -> Path:
    requirements = _image_dir() / "requirements.txt"
    machine = os.uname().machine  # the wheels must fit the engine's machine: x86_64 or aarch64
    key = hashlib.sha256(requirements.read_bytes() + machine.encode()).hexdigest()[:16]
    target = cache_dir / "wheels" / key
    if (target / ".complete").exists():
        progress(f"wheelhouse {target} is ready")
        return target
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.11",
        "--implementation",
        "cp",
        "-d",
        str(target),
        "-r",
        str(requirements),
    ]
    for tag in _MANYLINUX_TAGS:
        command[4:4] = ["--platform", f"{tag}_{machine}"]
    _run(command, progress, "download wheels")
    (target / ".complete").write_text("ok\n")
    return target


def _debian_mirror(sources_dir: Path = Path("/etc/apt")) -> str | None:
    """The first Debian mirror the machine's own apt uses, so debootstrap fetches where apt does."""
    candidates = [*sorted((sources_dir / "sources.list.d").glob("*.sources")), sources_dir / "sources.list"]
    for path in candidates:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            words = line.split()
            if words[:1] == ["URIs:"] and len(words) > 1 and "security" not in words[1]:
                return words[1]
            if words[:1] == ["deb"] and len(words) > 2 and "security" not in words[1] and words[1] != "[":
                return words[1]
    return None


def _offline_base(backend: ImageBuilder, cache_dir: Path, progress: ProgressCallback) -> str:
    mirror = _debian_mirror()
    key = hashlib.sha256(f"{_DEBIAN_SUITE}|{_DEBOOTSTRAP_PACKAGES}|minbase".encode()).hexdigest()[:12]
    reference = f"sandbox-runtime-base:{_DEBIAN_SUITE}-{key}"
    if backend.image_exists(reference):
        progress(f"base image {reference} is present")
        return reference
    cache_dir.mkdir(parents=True, exist_ok=True)
    packed = cache_dir / f"rootfs-{_DEBIAN_SUITE}-{key}.tar"  # kept: a second engine imports the same base
    if not packed.is_file():
        _make_rootfs(cache_dir, packed, mirror, progress)
    else:
        progress(f"root filesystem {packed} is cached")
    backend.import_rootfs(str(packed), reference, progress)
    return reference


def _make_rootfs(cache_dir: Path, packed: Path, mirror: str | None, progress: ProgressCallback) -> None:
    """debootstrap a minimal Debian into a folder and pack it as ``packed`` (renamed there once whole)."""
    if shutil.which("debootstrap") is None:
        raise ImageError("the offline build needs debootstrap: apt-get install -y debootstrap")
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix="rootfs-") as work:
        rootfs = Path(work) / "rootfs"
        command = [
            "debootstrap",
            "--variant=minbase",
            f"--include={_DEBOOTSTRAP_PACKAGES}",
            _DEBIAN_SUITE,
            str(rootfs),
        ]
        if mirror:
            command.append(mirror)
        progress("making a Debian root filesystem with debootstrap (about a minute)")
        _run(command, progress, "debootstrap")
        tar_path = Path(work) / "rootfs.tar"
        _run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(tar_path), "."], progress, "pack rootfs")
        tar_path.replace(packed)


def _system_debs(cache_dir: Path, progress: ProgressCallback) -> list[Path] | None:
    """The system packages' ``.deb`` files for the slim base, downloaded by this machine's apt; None when this is no
    Debian bookworm host with apt (the offline base is built instead)."""
    try:
        release = Path("/etc/os-release").read_text()
    except OSError:
        return None
    if f"VERSION_CODENAME={_DEBIAN_SUITE}" not in release.split() or shutil.which("apt-get") is None:
        return None
    folder = cache_dir / "debs" / hashlib.sha256(_DEBOOTSTRAP_PACKAGES.encode()).hexdigest()[:12]
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob("*.deb"))
    if len(found) == len(SYSTEM_PACKAGES):
        return found
    progress(f"downloading {', '.join(SYSTEM_PACKAGES)} with apt")
    try:
        subprocess.run(
            ["apt-get", "download", *SYSTEM_PACKAGES],
            cwd=folder,
            check=True,
            capture_output=True,
            timeout=_SUBPROCESS_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        logger.info("apt-get download failed: %s", exc)
        return None
    found = sorted(folder.glob("*.deb"))
    return found if len(found) == len(SYSTEM_PACKAGES) else None


def _registry_answers() -> bool:
    try:
        socket.getaddrinfo(_REGISTRY_HOST, 443, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return True


def _registry_base(backend: ImageBuilder, source: Source, progress: ProgressCallback) -> str | None:
    if backend.image_exists(SLIM_BASE):
        progress(f"base image {SLIM_BASE} is present")
        return SLIM_BASE
    if source == "auto" and not _registry_answers():
        progress("no container registry answers: building offline")
        return None
    try:
        backend.pull_image(SLIM_BASE, progress)
    except ImageError:
        if source == "registry":
            raise
        logger.info("pulling %s failed; building offline", SLIM_BASE, exc_info=True)
        progress(f"pulling {SLIM_BASE} failed: building offline")
        return None
    return SLIM_BASE


def build_executor_image(
    backend: ImageBuilder,
    *,
    source: Source = "auto",
    cache_dir: Path | None = None,
    progress: ProgressCallback = lambda _line: None,
    force: bool = False,
) -> ImageBuildReport:
    """Build the executor image unless an image with the same input hash already exists."""
    tag = executor_image_tag()
    if not force and backend.image_exists(tag):
        progress(f"image {tag} is up to date")
        return ImageBuildReport(tag=tag, source="existing", base_image=None, built=False)
    cache = cache_dir or default_cache_dir()
    base = None if source == "offline" else _registry_base(backend, source, progress)
    debs = None if base is None else _system_debs(cache, progress)
    if base is not None and debs is None:
        if source == "registry":
            raise ImageError(f"the {SLIM_BASE} build needs {', '.join(SYSTEM_PACKAGES)} from a Debian bookworm apt")
        progress("the system packages cannot be downloaded here: building offline")
        base = None
    chosen: Literal["registry", "offline"] = "registry" if base else "offline"
    if base is None:
        base = _offline_base(backend, cache, progress)
    wheels = _wheelhouse(cache, progress)
    with tempfile.TemporaryDirectory(prefix="sandbox-runtime-build-") as context:
        for name in _IMAGE_FILES:
            shutil.copy2(_image_dir() / name, Path(context) / name)
        shutil.copytree(wheels, Path(context) / "wheels", ignore=shutil.ignore_patterns(".complete"))
        (Path(context) / "debs").mkdir()  # empty for the offline base, which has the packages already
        for deb in debs or []:
            shutil.copy2(deb, Path(context) / "debs" / deb.name)
        progress(f"building {tag} from {base} with no network")
        backend.build_image(
            context,
            tag,
            {"BASE_IMAGE": base},
            {"io.sandbox-runtime.image-base": base, "io.sandbox-runtime.image-source": chosen},
            progress,
        )
    return ImageBuildReport(tag=tag, source=chosen, base_image=base, built=True)
