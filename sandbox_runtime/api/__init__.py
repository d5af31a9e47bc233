"""The Python API a host embeds: a :class:`~.runtime.Runtime` per state directory and a
:class:`~.conversation.Conversation` per id (both exported from :mod:`sandbox_runtime`)."""
