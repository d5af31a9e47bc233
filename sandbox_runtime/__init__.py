"""sandbox-runtime: hardened per-conversation sandboxes and a data path that bypasses model output."""
