"""Writes the benchmarks' 1,000,000-operation JSONL trace to argv[1]: allocations of
1 B to 16 MiB, each live one freed at random half the time (seed 1, so every run and
every benchmark replays the same operations)."""
import random
import sys

random.seed(1)
live = []
with open(sys.argv[1], "w") as f:
    for i in range(1_000_000):
        if live and random.random() < 0.5:
            f.write('{"op":"free","id":%d}\n' % live.pop(random.randrange(len(live))))
        else:
            f.write('{"op":"alloc","id":%d,"size":%d}\n' % (i, random.randint(1, 1 << 24)))
            live.append(i)
