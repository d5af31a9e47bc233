# expect: KeyboardInterrupt
"""KeyboardInterrupt raised explicitly (e.g. a long loop's "stop" switch); Python then dies by SIGINT."""


def crunch(limit: int) -> int:
    total = 0
    for step in range(limit):
        total += step * step
        if step == 1000:
            raise KeyboardInterrupt
    return total


if __name__ == "__main__":
    print(crunch(10_000))
