# expect: ConfigError: could not load report settings from settings.json
"""A settings loader wraps the JSON error with ``raise ... from``: two chained tracebacks."""

import json
import tempfile
from pathlib import Path


class ConfigError(Exception):
    """The report settings are unusable."""


def load_settings(path: Path) -> dict[str, object]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"could not load report settings from {path.name}") from exc


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "settings.json"
        path.write_text('{"title": "Sales", "currency": "EUR",}', encoding="utf-8")
        print(load_settings(path))


if __name__ == "__main__":
    main()
