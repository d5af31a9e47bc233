"""No engine: :class:`FakeBackend` keeps containers as records and runs commands as host processes under the
runner's contract. It confines nothing, and says so (``FakeBackend.not_enforced``)."""

from sandbox_runtime.sandbox.fake.backend import FakeBackend

__all__ = ["FakeBackend"]
