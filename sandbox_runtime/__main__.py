"""``python -m sandbox_runtime``: the ``sandbox-runtime`` command."""

import sys

from sandbox_runtime.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
