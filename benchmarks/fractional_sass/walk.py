"""Count the SASS instructions one thread executes along a path through a kernel.

sass_lines(path, function_substring) -> [(addr, text)]
walk(lines, decisions) follows the code from address 0: a conditional branch (@P BRA / @P EXIT)
takes the next entry of decisions[addr] (True: taken); unconditional BRA jumps; EXIT ends.
Returns (instruction count, per-address visit counts)."""
import re, sys
from collections import Counter

LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")

def sass_lines(path, name):
    out, inside = [], False
    for line in open(path):
        if "Function :" in line:
            inside = name in line
            continue
        m = LINE.search(line)
        if inside and m:
            out.append((int(m.group(1), 16), m.group(2)))
    return out

def walk(lines, decisions, limit=100000):
    index = {a: i for i, (a, _) in enumerate(lines)}
    iters = {a: iter(v) for a, v in decisions.items()}
    used = Counter()
    i, count, visits = 0, 0, Counter()
    while True:
        addr, text = lines[i]
        count += 1
        visits[addr] += 1
        if count > limit:
            raise RuntimeError("runaway")
        pred = text.startswith("@")
        op = text.split()[1] if pred else text.split()[0]
        if op in ("BRA", "EXIT"):
            if pred:
                try:
                    taken = next(iters[addr])
                except (KeyError, StopIteration):
                    raise RuntimeError(f"no decision for branch at {addr:#x}: {text}")
                used[addr] += 1
            else:
                taken = True
            if taken:
                if op == "EXIT":
                    break
                target = int(text.split()[-1], 16)
                i = index[target]
                continue
        i += 1
    left = {a: list(it) for a, it in iters.items()}
    left = {a: v for a, v in left.items() if v}
    if left:
        raise RuntimeError(f"unused decisions: {left}")
    return count, visits
