# expect: RecursionError: maximum recursion depth exceeded
"""Walk an org chart that contains a cycle (a manager reports to their own report)."""

MANAGER_OF = {"ceo": None, "cfo": "ceo", "controller": "cfo", "analyst": "controller"}
MANAGER_OF["ceo"] = "analyst"  # bad data: the cycle


def chain_of_command(person: str) -> list[str]:
    manager = MANAGER_OF[person]
    if manager is None:
        return [person]
    return [person, *chain_of_command(manager)]


if __name__ == "__main__":
    print(" -> ".join(chain_of_command("analyst")))
