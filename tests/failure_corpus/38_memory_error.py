# expect: MemoryError: cannot allocate 44 GiB for the pivot table
"""A size check raises MemoryError explicitly before trying a huge allocation."""

ROWS = 2_000_000
COLUMNS = 3_000
BYTES_PER_CELL = 8
LIMIT_BYTES = 4 * 2**30


def allocate_pivot(rows: int, columns: int) -> list[float]:
    needed = rows * columns * BYTES_PER_CELL
    if needed > LIMIT_BYTES:
        raise MemoryError(f"cannot allocate {needed // 2**30} GiB for the pivot table")
    return [0.0] * (rows * columns)


if __name__ == "__main__":
    print(len(allocate_pivot(ROWS, COLUMNS)))
