# expect: ZeroDivisionError: division by zero
"""Average order value per region; one region has no orders yet."""

ORDERS = {"north": [120.0, 80.5, 99.9], "south": [45.0], "east": []}


def average(values: list[float]) -> float:
    return sum(values) / len(values)


def main() -> None:
    for region, values in ORDERS.items():
        print(f"{region:6} {average(values):8.2f}")


if __name__ == "__main__":
    main()
