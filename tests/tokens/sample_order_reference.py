#!/usr/bin/env python3
"""An independent Python rendering of tandem's SampleOrder permutation (data/sample_order.h).

It produced the golden values of sample_order_test.cc, and shows a Python tool how to list
the samples a tandem run reads:

  sample_order_reference.py SEED SAMPLES_PER_EPOCH EPOCH FIRST COUNT

prints the samples at positions [FIRST, FIRST + COUNT) of epoch EPOCH's order.

The permutation: SplitMix64's output function Mix64; epoch key Mix64(Mix64(seed) ^ epoch);
six round keys Mix64(epoch_key + round * 0x9e3779b97f4a7c15); a balanced Feistel network on
2h bits (the least h >= 1 with 4^h >= N) whose round maps (left, right) to
(right, left ^ (Mix64(right ^ key) & mask)); cycle-walked until the value is below N.
"""
import sys

MASK64 = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15


def mix64(value):
    value = (value + GOLDEN_GAMMA) & MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & MASK64
    return value ^ (value >> 31)


def round_keys(seed, epoch):
    epoch_key = mix64(mix64(seed) ^ (epoch & MASK64))
    return [mix64((epoch_key + r * GOLDEN_GAMMA) & MASK64) for r in range(6)]


def sample_at(seed, samples, epoch, index):
    half_bits = 1
    while (1 << (2 * half_bits)) < samples:
        half_bits += 1
    mask = (1 << half_bits) - 1
    keys = round_keys(seed, epoch)
    value = index
    while True:
        left, right = value >> half_bits, value & mask
        for key in keys:
            left, right = right, left ^ (mix64(right ^ key) & mask)
        value = (left << half_bits) | right
        if value < samples:
            return value


def main():
    if len(sys.argv) != 6:
        print(__doc__, file=sys.stderr)
        return 2
    seed, samples, epoch, first, count = (int(x) for x in sys.argv[1:])
    print(" ".join(str(sample_at(seed, samples, epoch, i)) for i in range(first, first + count)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
