"""CPU-bound work for py-spy to record in Kiln's e2e tests."""
import time


def kiln_spy_fib(n):
    return n if n < 2 else kiln_spy_fib(n - 1) + kiln_spy_fib(n - 2)


def main():
    end = time.time() + 2.0
    while time.time() < end:
        kiln_spy_fib(20)


if __name__ == "__main__":
    main()
