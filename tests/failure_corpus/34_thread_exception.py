# expect: ValueError: worker could not parse chunk 2
# exit-code: 0
"""A worker thread fails: threading's excepthook prints the traceback, yet the process exits with 0."""

import threading

CHUNKS = ["1,2,3", "4,5,6", "7,eight,9"]
results: dict[int, int] = {}


def worker(index: int, chunk: str) -> None:
    try:
        results[index] = sum(int(part) for part in chunk.split(","))
    except ValueError as exc:
        raise ValueError(f"worker could not parse chunk {index}") from exc


def main() -> None:
    threads = [threading.Thread(target=worker, args=(i, chunk)) for i, chunk in enumerate(CHUNKS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"parsed {len(results)} of {len(CHUNKS)} chunks")


if __name__ == "__main__":
    main()
