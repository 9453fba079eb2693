"""synthetic:arith in Python: a port of src/worker/arith.rs and data.rs's SplitMix64 `Rng`.

Sequence i is a pure function of (seed, i), exactly as in the worker; the bench driver checks
the port against `fdbench arith` before it trains, so both sides see the same tokens.
"""

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
PLUS, MINUS, TIMES, EQUALS, END = 10, 11, 12, 13, 14
VOCAB = 16
MAX_VALUE = 99


class Rng:
    """SplitMix64, as `data::Rng`."""

    def __init__(self, state):
        self.state = state & MASK

    @staticmethod
    def for_index(seed, index):
        r = Rng(seed ^ 0x5851F42D4C957F2D)
        r.state ^= Rng((index * GOLDEN) & MASK).next_u64()
        return Rng(r.next_u64())

    def next_u64(self):
        self.state = (self.state + GOLDEN) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def below(self, n):
        return (self.next_u64() * n) >> 64


def sequence(seed, index, length):
    """Chained facts such as 3+4=7;7*2=14; cut to `length` tokens (see arith.rs)."""
    rng = Rng.for_index(seed, index)
    out = []
    a = rng.below(10)
    while len(out) < length:
        b = rng.below(10)
        op = rng.below(3)
        if op == 0 and a + b <= MAX_VALUE:
            op, c = PLUS, a + b
        elif op == 1 and a >= b:
            op, c = MINUS, a - b
        elif op == 2 and a * b <= MAX_VALUE:
            op, c = TIMES, a * b
        elif a >= b:
            op, c = MINUS, a - b
        else:
            op, c = PLUS, a + b
        out.extend(int(d) for d in str(a))
        out.append(op)
        out.extend(int(d) for d in str(b))
        out.append(EQUALS)
        out.extend(int(d) for d in str(c))
        out.append(END)
        a = c
    return out[:length]


if __name__ == "__main__":
    import sys

    seed, first, count, length = (int(x) for x in sys.argv[1:5])
    for i in range(first, first + count):
        print(sequence(seed, i, length))
