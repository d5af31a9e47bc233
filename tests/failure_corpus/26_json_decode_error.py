# expect: JSONDecodeError: Expecting ',' delimiter
# message: raised inside json/decoder.py
"""Parse a hand-written JSON chart spec that lacks a comma."""

import json

SPEC = """
{
  "title": "Revenue by region",
  "series": [
    {"name": "North", "values": [12, 15, 19]}
    {"name": "South", "values": [8, 9, 14]}
  ]
}
"""


def load_chart_spec(text: str) -> dict[str, object]:
    return json.loads(text)


if __name__ == "__main__":
    print(load_chart_spec(SPEC)["title"])
