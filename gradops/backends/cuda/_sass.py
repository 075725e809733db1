"""Static analysis of the compiled kernels' SASS: no GPU, no CuPy.

Every instantiation is compiled to a cubin with NVRTC (:func:`_build._compiled`, as the compile
check does), disassembled with NVIDIA's ``nvdisasm`` (``nvidia-cuda-nvdisasm`` wheel) and
``cuobjdump -res-usage`` (``nvidia-cuda-cuobjdump`` wheel), and read here:

* **resources**: registers, spills and shared memory (ptxas ``-v``, cross-checked against
  ``cuobjdump -res-usage``) and the occupancy they allow at the launcher's block size
  (:func:`occupancy`, the formula of CUDA's ``cuda_occupancy.h``);
* **memory instructions**: every global/shared load and store with its width in bytes
  (``LDG.E.U16`` is 2, ``LDG.E`` 4, ``LDG.E.64`` 8, ``LDG.E.128`` 16);
* **control flow**: basic blocks, dominators and natural loops (:class:`CFG`), and the
  instruction count of a path through a loop's body (:meth:`CFG.path_table`).

The path counting model (what "the steady-state path" means)
------------------------------------------------------------
A path is a walk through one iteration of a loop, from its header to a latch (a block with
the back edge).  Blocks that ``CALL`` a subroutine (the compiler's slow paths: 64-bit integer
division with operands wider than 32 bits, the full-range double division for subnormal or
huge operands) are *cold*: a path may not use them.  Inner loops are taken as a whole,
``trips`` times (an iteration count the caller gives per nesting depth, with optionally the
number of counted loads each iteration makes), or as many times as the cheapest path needs.
Among the remaining paths, :meth:`CFG.path_table` gives, for each number ``k`` of *counted
loads* (the caller's predicate, e.g. "a global load of the element width"), the cheapest path
that performs exactly ``k`` of them.  So a kernel's per-element count is asked for by the
work the element needs ("9 taps: 18 two-byte loads, the multiplier loop once per tap"), and
the guards that skip work are resolved by that, not by guessing branch probabilities.  Every
instruction on the path counts once (predicated-off instructions issue too); ``BSSY``,
``BSYNC`` and branches count as instructions.

Nothing here knows a kernel: the work model per kernel family lives in
:mod:`gradops.bench.static_report`.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

# --------------------------------------------------------------------------- NVIDIA's tools

#: Where NVIDIA's wheels put their binaries under ``site-packages/nvidia/``.
WHEEL_BIN_DIRS = ("cu13/bin", "cuda_nvdisasm/bin", "cuda_cuobjdump/bin", "cu12/bin")


def tool(name: str) -> Path:
    """The path of ``nvdisasm`` or ``cuobjdump``: NVIDIA's wheels on ``sys.path`` first (the
    ``static`` and ``test`` extras install them), then ``CUDA_PATH``/``CUDA_HOME``, then PATH."""
    candidates = []
    for entry in sys.path:
        base = Path(entry or ".") / "nvidia"
        candidates += [base / sub / name for sub in WHEEL_BIN_DIRS]
    candidates += [Path(os.environ[v]) / "bin" / name for v in ("CUDA_PATH", "CUDA_HOME") if os.environ.get(v)]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    found = shutil.which(name)
    if found:
        return Path(found)
    raise FileNotFoundError(f"{name} not found: pip install 'gradops[static]' (nvidia-cuda-nvdisasm and "
                            f"nvidia-cuda-cuobjdump wheels), or set CUDA_PATH to a CUDA toolkit")


@lru_cache(maxsize=None)
def tool_version(name: str) -> str:
    """``"13.5.37"``-style version of an NVIDIA tool (``V13.5.37`` in its ``--version``)."""
    out = subprocess.run([str(tool(name)), "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"\bV(\d+\.\d+\.\d+)", out)
    return m.group(1) if m else out.strip().splitlines()[-1]


def nvrtc_version() -> str:
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


def _run_on_cubin(args: list[str], cubin: bytes) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernels.cubin"
        path.write_bytes(cubin)
        result = subprocess.run([*args, str(path)], capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"{' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def disassemble(cubin: bytes) -> str:
    """``nvdisasm -c`` of a cubin: the code sections only, with labels and branch targets."""
    return _run_on_cubin([str(tool("nvdisasm")), "-c"], cubin)


_RES_FUNCTION = re.compile(r"^\s*Function ([^\s:]+):")
_RES_FIELDS = re.compile(r"\b(REG|STACK|SHARED|LOCAL):(\d+)")


def parse_res_usage(text: str) -> dict[str, dict[str, int]]:
    """``cuobjdump -res-usage`` -> ``{mangled name: {REG, STACK, SHARED, LOCAL}}``."""
    out, current = {}, None
    for line in text.splitlines():
        if m := _RES_FUNCTION.match(line):
            current = out.setdefault(m.group(1), {})
        elif current is not None and (fields := _RES_FIELDS.findall(line)):
            current.update({k: int(v) for k, v in fields})
            current = None
    return out


def res_usage(cubin: bytes) -> dict[str, dict[str, int]]:
    return parse_res_usage(_run_on_cubin([str(tool("cuobjdump")), "-res-usage"], cubin))


# --------------------------------------------------------------------------- listing


@dataclass
class Instruction:
    offset: int
    opcode: str          # with modifiers: "LDG.E.U16.CONSTANT"
    operands: str
    predicate: str | None = None

    @property
    def base(self) -> str:
        """The opcode without modifiers: ``LDG``."""
        return self.opcode.split(".")[0]

    @property
    def target(self) -> str | None:
        """The label a branch or call names (``BRA `(.L_x_7)``), if any."""
        m = re.search(r"`\(([^)]+)\)", self.operands)
        return m.group(1) if m else None

    def __str__(self) -> str:
        pred = f"@{self.predicate} " if self.predicate else ""
        return f"/*{self.offset:04x}*/ {pred}{self.opcode} {self.operands}".rstrip()


@dataclass
class Function:
    name: str
    instructions: list[Instruction]
    labels: dict[str, int]   # label -> index of the instruction it precedes
    subroutines: dict[str, int] = field(default_factory=dict)  # "$__internal_..." -> index


_SECTION = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)")
_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@(!?U?P\w+)\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)\s*(.*?)\s*;")
_LABEL = re.compile(r"^([.$\w][\w.$]*):\s*$")


def parse_listing(text: str) -> dict[str, Function]:
    """``nvdisasm -c`` output -> ``{entry function name: Function}``.

    Each ``.text.<name>`` section is one entry function followed by the subroutines the
    compiler placed in it (``$__internal_*``); a label line names the next instruction.
    """
    functions: dict[str, Function] = {}
    current: Function | None = None
    for raw in text.splitlines():
        line = raw.split("//", 1)[0] if not raw.lstrip().startswith("/*") else raw
        if m := _SECTION.match(line):
            current = functions.setdefault(m.group(1), Function(m.group(1), [], {}))
            continue
        if current is None:
            continue
        if m := _INSTR.match(line):
            offset, pred, opcode, operands = m.groups()
            current.instructions.append(Instruction(int(offset, 16), opcode, operands.strip(), pred))
        elif m := _LABEL.match(line.strip()):
            label = m.group(1)
            current.labels[label] = len(current.instructions)
            if label.startswith("$"):
                current.subroutines[label] = len(current.instructions)
    return functions


# --------------------------------------------------------------------------- memory instructions

_GLOBAL_LOADS = {"LDG", "LD"}
_GLOBAL_STORES = {"STG", "ST"}
_WIDTH_MODIFIERS = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "32": 4, "64": 8, "128": 16}


def access_width(instruction: Instruction) -> int | None:
    """Bytes per thread of a load or store (``LDG.E.U16``: 2; no size modifier: 4), else None."""
    if instruction.base not in {"LDG", "LD", "STG", "ST", "LDS", "STS", "LDL", "STL", "ATOMG", "RED"}:
        return None
    for modifier in instruction.opcode.split(".")[1:]:
        if modifier in _WIDTH_MODIFIERS:
            return _WIDTH_MODIFIERS[modifier]
    return 4


_REGISTER = re.compile(r"\bR(\d+)\b")


def load_round_trips(instructions) -> int:
    """Dependent global-load round trips of a straight run of instructions issued in order,
    each load's latency taken as longer than the whole run: a round trip ends where an
    instruction reads a register that a global load issued since the last wait writes (the
    warp waits for every load issued so far).  A load's destination is its first operand,
    ``access_width / 4`` consecutive registers from it."""
    waits, pending = load_waits(instructions)
    return waits + (1 if pending else 0)


def load_waits(instructions) -> tuple[int, bool]:
    """(waits, pending) of a straight run (see :func:`load_round_trips`): the round trips that
    end inside the run, and whether loads issued since the last of them are still in flight at
    its end."""
    pending: set[int] = set()
    waits = 0
    for ins in instructions:
        regs = [int(r) for r in _REGISTER.findall(ins.operands.split("desc[", 1)[0] if ins.base == "LDG"
                                                  else ins.operands)]
        if ins.base == "LDG":
            sources = [int(r) for r in _REGISTER.findall(ins.operands.split(",", 1)[1])] if "," in ins.operands else []
        else:
            sources = regs
        if pending & set(sources):
            waits += 1
            pending.clear()
        if ins.base == "LDG" and regs:
            pending.update(range(regs[0], regs[0] + max(1, access_width(ins) // 4)))
    return waits, bool(pending)


def memory_kind(instruction: Instruction) -> str | None:
    """``"LDG.128"``-style key for loads/stores (op and width), None for anything else."""
    width = access_width(instruction)
    if width is None:
        return None
    return f"{instruction.base}.{8 * width}"


def is_global_load(instruction: Instruction, width: int | None = None) -> bool:
    return instruction.base in _GLOBAL_LOADS and (width is None or access_width(instruction) == width)


#: Instruction classes reported along a path, and the pipe model of the roofline: the class of an
#: opcode is the first whose prefix set holds its base.
CLASSES = {
    "fp64": ("DFMA", "DADD", "DMUL", "DSETP", "DMNMX"),
    "mufu": ("MUFU",),
    "conversion": ("F2F", "F2I", "I2F", "I2I", "I2FP", "F2IP"),
    "imad": ("IMAD",),
    "int": ("IADD3", "IADD", "LOP3", "LOP", "ISETP", "SHF", "SHL", "SHR", "LEA", "SEL", "IMNMX", "VIMNMX", "IABS",
            "PLOP3"),
    "fp32": ("FFMA", "FADD", "FMUL", "FMNMX", "FSETP", "FSEL"),
    "fp16": ("HFMA2", "HADD2", "HMUL2"),
    "tensor": ("HMMA", "IMMA", "DMMA", "HGMMA"),
    "control": ("BRA", "BSSY", "BSYNC", "EXIT", "CALL", "RET", "WARPSYNC", "BAR", "NOP", "YIELD"),
}
_CLASS_OF = {op: cls for cls, ops in CLASSES.items() for op in ops}


def instruction_class(instruction: Instruction) -> str:
    if access_width(instruction) is not None:
        return "memory"
    if instruction.opcode == "HFMA2.MMA":  # a register move the compiler sends to the FMA pipe
        return "other"
    return _CLASS_OF.get(instruction.base, "other")


def summarize(instructions) -> Counter:
    """Counts of a path's or region's instructions: ``total``, each :data:`CLASSES` class,
    each memory kind (``LDG.16``) and the bases the tiled kernels are judged by (the staged
    fractional kernel's FP64 share and sum arithmetic among them)."""
    counts: Counter = Counter()
    for ins in instructions:
        counts["total"] += 1
        counts[f"class:{instruction_class(ins)}"] += 1
        if kind := memory_kind(ins):
            counts[kind] += 1
        if ins.base in ("HMMA", "LDS", "LDSM", "LDG", "STS", "STG", "BAR", "FFMA", "LDGSTS", "DFMA", "DMUL", "DADD"):
            counts[ins.base] += 1
    return counts


# --------------------------------------------------------------------------- control flow


@dataclass
class Block:
    index: int
    start: int   # first instruction index in the function
    end: int     # one past the last
    succs: list[int] = field(default_factory=list)
    preds: list[int] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)


@dataclass
class Loop:
    header: int
    blocks: frozenset[int]
    latches: tuple[int, ...]
    parent: "Loop | None" = None
    children: list["Loop"] = field(default_factory=list)

    @property
    def depth(self) -> int:
        return 1 + (self.parent.depth if self.parent else 0)


_BRANCHES = {"BRA", "BRX", "JMP", "JMX"}
_ENDS = {"EXIT", "RET", "KILL"}


class PathError(ValueError):
    """No path through a loop performs the requested work."""


class CFG:
    """Basic blocks of an entry function (reachable from its first instruction, calls not
    followed), their dominators and natural loops."""

    def __init__(self, function: Function):
        self.function = function
        ins = function.instructions
        leaders = {0}
        targets = {}
        for i, x in enumerate(ins):
            if self._is_jump(x) and x.target in function.labels:
                targets[i] = function.labels[x.target]
                leaders.add(targets[i])
            if (self._is_jump(x) or x.base in _ENDS) and i + 1 < len(ins):
                leaders.add(i + 1)
            if x.base == "CALL" and i + 1 < len(ins):
                leaders.add(i + 1)  # a call ends a block so that cold blocks stay small
        leaders.update(idx for idx in function.labels.values() if idx < len(ins))
        starts = sorted(leaders)
        by_start = {}
        blocks = []
        for n, s in enumerate(starts):
            e = starts[n + 1] if n + 1 < len(starts) else len(ins)
            by_start[s] = n
            blocks.append(Block(n, s, e))
        for b in blocks:
            last = ins[b.end - 1]
            # "@P0 BRA", "BRA.U !UP0, `(...)" and "BRA.DIV UR4, `(...)" may fall through.
            unconditional = (last.predicate in (None, "PT")
                             and not last.operands.split("`", 1)[0].strip().rstrip(","))
            # Unconditional calls of subroutines only (a slow path); calls of local labels are jumps.
            b.calls = [x.target for x in ins[b.start:b.end]
                       if x.base == "CALL" and x.target and x.target.startswith("$") and x.predicate in (None, "PT")]
            if self._is_jump(last) and (b.end - 1) in targets:
                b.succs.append(by_start[targets[b.end - 1]])
                if not unconditional and b.end < len(ins):
                    b.succs.append(by_start[b.end])
            elif last.base in _ENDS:
                if not unconditional and b.end < len(ins):
                    b.succs.append(by_start[b.end])
            elif b.end < len(ins):
                b.succs.append(by_start[b.end])
        # Keep the blocks reachable from the entry (drops the subroutines' code and padding).
        seen, stack = set(), [0]
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            stack.extend(blocks[n].succs)
        self.blocks = {n: blocks[n] for n in sorted(seen)}
        for b in self.blocks.values():
            b.succs = list(dict.fromkeys(s for s in b.succs if s in self.blocks))
            for s in b.succs:
                self.blocks[s].preds.append(b.index)
        self.dominators = self._dominators()
        self.loops = self._loops()

    @staticmethod
    def _is_jump(x: Instruction) -> bool:
        """A branch, or a ``CALL`` to a label of the function itself (not a ``$`` subroutine):
        sm_80 code leaves loops by ``@P0 CALL.REL.NOINC `(.L_x_7)``, which never returns."""
        return x.base in _BRANCHES or (x.base == "CALL" and bool(x.target) and not x.target.startswith("$"))

    # ---- structure

    def instructions(self, block: int) -> list[Instruction]:
        b = self.blocks[block]
        return self.function.instructions[b.start:b.end]

    def cold(self, block: int) -> bool:
        """A block that always calls a subroutine: a slow path no steady-state path takes."""
        return bool(self.blocks[block].calls)

    def _dominators(self) -> dict[int, set[int]]:
        nodes = list(self.blocks)
        dom = {n: set(nodes) for n in nodes}
        dom[0] = {0}
        changed = True
        while changed:
            changed = False
            for n in nodes:
                if n == 0:
                    continue
                preds = [dom[p] for p in self.blocks[n].preds]
                new = (set.intersection(*preds) if preds else set()) | {n}
                if new != dom[n]:
                    dom[n], changed = new, True
        return dom

    def _loops(self) -> list[Loop]:
        by_header: dict[int, tuple[set[int], list[int]]] = {}
        for b in self.blocks.values():
            for s in b.succs:
                if s in self.dominators[b.index]:  # back edge b -> s
                    body, latches = by_header.setdefault(s, ({s}, []))
                    latches.append(b.index)
                    stack = [b.index]
                    while stack:
                        n = stack.pop()
                        if n not in body:
                            body.add(n)
                            stack.extend(self.blocks[n].preds)
        loops = [Loop(h, frozenset(body), tuple(latches)) for h, (body, latches) in by_header.items()]
        loops.sort(key=lambda lp: len(lp.blocks))
        for i, inner in enumerate(loops):
            for outer in loops[i + 1:]:
                if inner.blocks < outer.blocks:
                    inner.parent = outer
                    outer.children.append(inner)
                    break
        return sorted(loops, key=lambda lp: self.blocks[lp.header].start)

    def top_loops(self) -> list[Loop]:
        return [lp for lp in self.loops if lp.parent is None]

    def loop_instructions(self, loop: Loop, include_cold: bool = False) -> list[Instruction]:
        """Every instruction of the loop's blocks (nested loops' too), in address order."""
        return [x for n in sorted(loop.blocks) if include_cold or not self.cold(n) for x in self.instructions(n)]

    def loop_round_trips(self, loop: Loop, limit: int = 4096) -> int:
        """The most :func:`load_round_trips` of one iteration of ``loop`` along any of its
        paths (header to a latch, cold blocks excluded), a path's blocks in execution order:
        the two sides of a branch never both run, so their waits do not add up.  A loop with
        nested loops, or with more than ``limit`` paths, is counted in address order instead
        (every block once: an upper bound)."""
        if loop.children:
            return load_round_trips(self.loop_instructions(loop))
        paths: list[list[int]] = []
        stack = [[loop.header]]
        while stack:
            path = stack.pop()
            last = self.blocks[path[-1]]
            if last.index in loop.latches and loop.header in last.succs:
                paths.append(path)
            for s in last.succs:
                if s != loop.header and s in loop.blocks and s not in path and not self.cold(s):
                    stack.append(path + [s])
            if len(paths) + len(stack) > limit:
                return load_round_trips(self.loop_instructions(loop))
        if not paths:
            raise PathError(f"no path through the loop at {self.blocks[loop.header].start} avoids the cold blocks")
        return max(load_round_trips([x for n in path for x in self.instructions(n)]) for path in paths)

    # ---- paths

    def path_table(self, loop: Loop, counted=lambda ins: False, trips: dict | None = None,
                   kmax: int = 64) -> dict[int, tuple[int, Counter]]:
        """``{k: (instructions, counts)}``: the cheapest path through one iteration of ``loop``
        (header to a latch, cold blocks excluded) that executes exactly ``k`` instructions for
        which ``counted(instruction)`` holds, for every reachable ``k <= kmax`` (``counted`` may
        return an int weight instead: ``k`` is then the sum of the weights; ``kmax`` may be a
        :class:`KeyLimit`).

        ``trips`` maps the depth of an inner loop *relative to* ``loop`` (1: directly nested) to
        ``(iterations, counted per iteration or None)``: each time the path enters such a loop
        it runs it that many times (the header that many times); loops at other depths run as
        often as the cheapest path wants (at least once when entered).
        """
        cycle, _ = self._tables(loop, counted, trips or {}, kmax, loop.depth)
        if not cycle:
            raise PathError(f"no path through the loop at {self.blocks[loop.header].start} avoids the cold blocks")
        return cycle

    def function_table(self, counted=lambda ins: False, trips: dict | None = None, kmax: int = 64,
                       through=()) -> dict[int, tuple[int, Counter]]:
        """``{k: (instructions, counts)}``: the cheapest path through the whole kernel, from its
        first instruction to an ``EXIT``, with exactly ``k`` counted instructions (a staged tile
        kernel's thread runs its body once, not a grid-stride loop).  ``trips`` as in
        :meth:`path_table`, by depth (top-level loops are depth 1).  ``through``: blocks every
        path must pass (in each iteration of the loops holding them), e.g. the barriers and the
        unchecked inner loop of a tiled kernel; this keeps a path from mixing a branch's two
        sides that no thread combines (skipping the sums but storing them)."""
        region = Loop(0, frozenset(self.blocks), ())
        region.children = self.top_loops()
        ends, _ = self._tables(region, counted, trips or {}, kmax, 0, frozenset(through), terminal=True)
        if not ends:
            raise PathError("no path from the entry to an EXIT avoids the cold blocks and passes the required blocks")
        return ends

    def path(self, loop: Loop, k: int, counted=lambda ins: False, trips: dict | None = None) -> tuple[int, Counter]:
        """The cheapest path of :meth:`path_table` with exactly ``k`` counted instructions."""
        table = self.path_table(loop, counted, trips, kmax=max(k, 0))
        if k not in table:
            raise PathError(f"no path through the loop at block {loop.header} makes exactly {k} counted accesses "
                            f"(possible: {sorted(table)})")
        return table[k]

    def _tables(self, loop: Loop, counted, trips, kmax, base_depth, through=frozenset(), terminal=False):
        """(cycle table, {exiting block: table}) of one iteration of ``loop``: header to the end
        of a latch, and header to the end of each block with an edge leaving the loop.  With
        ``terminal`` (the whole function as a region) the first table is instead the paths to
        the end of a block that ends in ``EXIT``.  Paths pass every block of ``through`` that the
        region holds (a nested loop holding one is passed as a whole)."""
        child_of = {}
        for child in loop.children:
            for n in child.blocks:
                child_of[n] = child
        # Region nodes: own blocks by index, child loops by ("loop", header).
        def node(n):
            c = child_of.get(n)
            return ("loop", c.header) if c else n

        children = {("loop", c.header): c for c in loop.children}
        own = [n for n in loop.blocks if n not in child_of]
        nodes = set(own) | set(children)
        edges: dict = {v: [] for v in nodes}   # v -> [(successor node, via exiting block or None)]
        for n in own:
            if self.cold(n):
                continue
            for s in self.blocks[n].succs:
                if s == loop.header or s not in loop.blocks:
                    continue
                edges[n].append((node(s), None))
        child_tables = {}
        for key, child in children.items():
            cyc, exits = self._tables(child, counted, trips, kmax, base_depth, through)
            child_tables[key] = (cyc, exits)
            for u in exits:
                for s in self.blocks[u].succs:
                    if s in loop.blocks and s not in child.blocks and s != loop.header:
                        edges[key].append((node(s), u))
        ends_allowed = _require(edges, {node(b) for b in through if b in loop.blocks}, nodes)
        # Topological order of the region (back edges to the header removed; reducible CFGs
        # give a DAG once inner loops are collapsed).
        indegree = Counter()
        for v, outs in edges.items():
            for w, _ in outs:
                indegree[w] += 1
        order, ready = [], [v for v in nodes if indegree[v] == 0]
        while ready:
            v = ready.pop()
            order.append(v)
            for w, _ in edges[v]:
                indegree[w] -= 1
                if indegree[w] == 0:
                    ready.append(w)
        if len(order) != len(nodes):
            raise PathError("irreducible control flow in a loop body")

        into: dict = {v: {} for v in nodes}
        into[node(loop.header)] = {0: (0, Counter())}
        done: dict = {}       # node -> table at its end (blocks), or {exiting block: table} (loops)
        for v in order:
            table = into[v]
            if not table:
                continue
            if v in children:
                cyc, exits = child_tables[v]
                depth = children[v].depth - base_depth
                fixed = trips.get(depth)
                per_exit = {}
                for u, ex in exits.items():
                    per_exit[u] = _combine(table, _repeat(cyc, ex, fixed, kmax), kmax)
                done[v] = per_exit
                for w, u in edges[v]:
                    _merge(into[w], per_exit.get(u, {}))
            else:
                if self.cold(v):
                    continue
                instructions = self.instructions(v)
                k_here = sum(int(counted(x)) for x in instructions)  # a bool, or a weight
                cost = len(instructions)
                summary = summarize(instructions)
                out = {}
                for k, (c, counts) in table.items():
                    if _fits(k + k_here, kmax):
                        out[k + k_here] = (c + cost, counts + summary)
                done[v] = out
                for w, _ in edges[v]:
                    _merge(into[w], out)
        cycle: dict = {}
        for latch in loop.latches:
            # (a back edge from inside a child loop is not followed)
            if latch in own and latch in done and latch in ends_allowed:
                _merge(cycle, done[latch])
        exits = {}
        for n in own:
            if n in done and n in ends_allowed and any(s not in loop.blocks for s in self.blocks[n].succs):
                exits[n] = done[n]
        for key, child in children.items():  # a child loop's exit straight out of this loop
            for u, table in done.get(key, {}).items():
                if key in ends_allowed and any(s not in loop.blocks for s in self.blocks[u].succs):
                    _merge(exits.setdefault(u, {}), table)
        if terminal:
            ends: dict = {}
            for n in own:
                if n in done and n in ends_allowed and self._exits_kernel(n):
                    _merge(ends, done[n])
            for key in children:
                for u, table in done.get(key, {}).items():
                    if key in ends_allowed and self._exits_kernel(u):
                        _merge(ends, table)
            return ends, exits
        return cycle, exits

    def cheapest_tail(self, start: int, through: tuple[Loop, ...] = ()) -> int:
        """The fewest instructions outside top-level loops on a path from block ``start`` to an
        ``EXIT`` that enters each loop of ``through`` (top-level loops collapsed to nodes that
        cost nothing: a caller charges their iterations; cold blocks excluded).  Optional code
        after a loop, such as the remainder blocks ptxas adds to an unrolled copy loop, costs
        only the threads whose trip counts take it: summing every block a start dominates
        charges them all."""
        top = self.top_loops()
        loop_of = {n: lp.header for lp in top for n in lp.blocks}

        def node(n):
            return ("loop", loop_of[n]) if n in loop_of else n

        edges: dict = {}
        for n, b in self.blocks.items():
            if self.cold(n):
                continue
            v = node(n)
            edges.setdefault(v, [])
            for s in b.succs:
                w = node(s)
                if w != v and not self.cold(s):
                    edges[v].append((w, None))
        first = node(start)
        required = {("loop", lp.header) for lp in through}
        if not required <= _reach(edges, first, forward=True):  # _require's paths start above them
            raise PathError(f"a required loop is not reachable from block {start}")
        ends = _require(edges, required, set(edges))
        cost = {v: 0 if isinstance(v, tuple) else len(self.instructions(v)) for v in edges}
        best, order, stack, seen = {first: cost[first]}, [], [(first, False)], set()
        while stack:  # a depth-first post-order of the DAG reachable from start
            v, done = stack.pop()
            if done:
                order.append(v)
            elif v not in seen:
                seen.add(v)
                stack.append((v, True))
                stack.extend((w, False) for w, _ in edges[v] if w not in seen)
        for v in reversed(order):
            if v in best:
                for w, _ in edges[v]:
                    best[w] = min(best.get(w, math.inf), best[v] + cost[w])
        finals = [best[v] for v in best if v in ends and not isinstance(v, tuple) and self._exits_kernel(v)]
        if not finals:
            raise PathError(f"no path from block {start} to an EXIT enters the required loops")
        return min(finals)

    def _exits_kernel(self, block: int) -> bool:
        """Whether a block ends in ``EXIT`` (or ``RET``), predicated or not."""
        return self.instructions(block)[-1].base in _ENDS


def _require(edges: dict, required: set, nodes: set) -> set:
    """Keeps only the edges of paths through every node of ``required`` (in place) and returns
    the nodes such a path may end at.  For one required node r of the DAG: its ancestors A and
    descendants D; an edge stays when it runs within A, from A to r, from r into D or within D
    (an edge from A past r into D bypasses it); a path ends in D or at r."""
    allowed = set(nodes)
    for r in required:
        ancestors, descendants = _reach(edges, r, forward=False), _reach(edges, r, forward=True)
        before, after = ancestors | {r}, descendants | {r}
        for v in edges:
            edges[v] = [(w, u) for w, u in edges[v]
                        if (v in ancestors and w in before) or (v in after and w in descendants)]
        allowed &= after
    return allowed


def _reach(edges: dict, start, forward: bool) -> set:
    """Nodes reachable from ``start`` (forward) or reaching it (not ``start`` itself unless on a cycle)."""
    if forward:
        step = {v: [w for w, _ in outs] for v, outs in edges.items()}
    else:
        step = {v: [] for v in edges}
        for v, outs in edges.items():
            for w, _ in outs:
                step.setdefault(w, []).append(v)
    seen, stack = set(), list(step.get(start, []))
    while stack:
        v = stack.pop()
        if v not in seen:
            seen.add(v)
            stack.extend(step.get(v, []))
    return seen


def _merge(into: dict, table: dict) -> None:
    for k, (c, counts) in table.items():
        if k not in into or c < into[k][0]:
            into[k] = (c, counts)


class KeyLimit:
    """A ``kmax`` that also bounds the digits of a key packed from several counts: ``k`` fits
    when ``k <= kmax`` and ``valid(k)`` (e.g. no count past its radix, where it would alias)."""

    def __init__(self, kmax: int, valid):
        self.kmax, self.valid = kmax, valid


def _fits(k: int, kmax) -> bool:
    if isinstance(kmax, KeyLimit):
        return k <= kmax.kmax and kmax.valid(k)
    return k <= kmax


def _bound(kmax) -> int:
    return kmax.kmax if isinstance(kmax, KeyLimit) else kmax


def _combine(a: dict, b: dict, kmax: int) -> dict:
    """Min-plus convolution: a path of ``a`` followed by one of ``b``."""
    out: dict = {}
    for ka, (ca, na) in a.items():
        for kb, (cb, nb) in b.items():
            k = ka + kb
            if _fits(k, kmax) and (k not in out or ca + cb < out[k][0]):
                out[k] = (ca + cb, na + nb)
    return out


def _repeat(cycle: dict, exit_table: dict, fixed, kmax: int) -> dict:
    """An inner loop run as a whole: ``t - 1`` full iterations then the last one to an exit.
    ``fixed``: ``(t, counted per iteration or None)``, or None for any ``t >= 1``; the count per
    iteration may be a predicate on an iteration's key (a packed key's digits)."""
    if fixed is not None:
        t, per = fixed
        if per is not None:  # the last header visit may also leave before any counted access
            ok = per if callable(per) else (lambda k: k == per)  # a predicate on one iteration's key
            cycle = {k: v for k, v in cycle.items() if ok(k)}
            exit_table = {k: v for k, v in exit_table.items() if k == 0 or ok(k)}
        out = exit_table
        for _ in range(t - 1):
            out = _combine(cycle, out, kmax)
        return out
    best = dict(exit_table)
    acc = exit_table
    for _ in range(_bound(kmax) + 1):
        acc = _combine(cycle, acc, kmax)
        before = dict(best)
        _merge(best, acc)
        if best == before:
            break
    return best


# --------------------------------------------------------------------------- occupancy


@dataclass(frozen=True)
class ArchLimits:
    """Per-SM limits of a compute capability (CUDA C++ Programming Guide, "Technical
    Specifications per Compute Capability"; cuda_occupancy.h for the granularities)."""

    arch: int
    max_threads: int = 2048
    max_blocks: int = 32
    registers: int = 65536
    registers_per_block: int = 65536
    register_granularity: int = 256   # registers, per warp
    sub_partitions: int = 4
    shared_per_sm: int = 0            # bytes, the largest carveout
    shared_per_block: int = 0         # bytes, opt-in maximum
    shared_reserved_per_block: int = 1024
    shared_granularity: int = 128


ARCH_LIMITS = {
    80: ArchLimits(80, shared_per_sm=164 * 1024, shared_per_block=163 * 1024),
    90: ArchLimits(90, shared_per_sm=228 * 1024, shared_per_block=227 * 1024),
}


def occupancy(arch: int, registers: int, shared_bytes: int, block: int) -> dict:
    """Resident blocks and warps per SM for a kernel of ``registers`` per thread and
    ``shared_bytes`` of shared memory per block launched with ``block`` threads.

    As ``cuda_occupancy.h`` computes it: warps per block ``W = ceil(block / 32)``; registers
    per warp rounded up to 256, allocated per sub-partition (4 per SM), so
    ``warps(regs) = 4 * floor(65536 / 4 / ceil(32 * regs, 256))``; blocks by registers
    ``floor(warps(regs) / W)``; by shared memory ``floor(smem_SM / ceil(smem + 1 KB reserved,
    128))`` with the largest carveout (164 KB sm_80, 228 KB sm_90); by threads
    ``floor(2048 / (32 W))``; at most 32 blocks.  The smallest limit wins.
    """
    lim = ARCH_LIMITS[arch]
    warps_per_block = -(-block // 32)
    regs_per_warp = -(-registers * 32 // lim.register_granularity) * lim.register_granularity
    limits = {"blocks": lim.max_blocks, "threads": lim.max_threads // (32 * warps_per_block)}
    if regs_per_warp:
        per_partition = (lim.registers // lim.sub_partitions) // regs_per_warp
        fits = regs_per_warp * (-(-warps_per_block // lim.sub_partitions) * lim.sub_partitions) <= lim.registers_per_block
        limits["registers"] = (per_partition * lim.sub_partitions) // warps_per_block if fits else 0
    smem = shared_bytes + lim.shared_reserved_per_block
    smem = -(-smem // lim.shared_granularity) * lim.shared_granularity
    limits["shared memory"] = lim.shared_per_sm // smem if shared_bytes <= lim.shared_per_block else 0
    blocks = min(limits.values())
    limiter = "+".join(sorted(k for k, v in limits.items() if v == blocks))
    warps = blocks * warps_per_block
    return {"blocks_per_sm": blocks, "warps_per_sm": warps, "occupancy": warps / (lim.max_threads // 32),
            "limiter": limiter, "limits": limits}


# --------------------------------------------------------------------------- compile + analyse


@dataclass
class KernelSass:
    """One compiled instantiation: its resources and its control-flow graph."""

    source: str
    arch: str
    expression: str
    mangled: str
    ptxas: dict
    res_usage: dict
    cfg: CFG

    @property
    def function(self) -> Function:
        return self.cfg.function

    def memory_instructions(self, loop: Loop | None = None) -> Counter:
        """Static count of each memory kind (``LDG.16``) in the kernel (or one loop, cold blocks
        left out)."""
        instructions = self.function.instructions if loop is None else self.cfg.loop_instructions(loop)
        return Counter(k for x in instructions if (k := memory_kind(x)))


def compile_kernels(archs=("sm_80", "sm_90"), sources=None, texts: dict | None = None, only=None,
                    options: dict | None = None) -> list[KernelSass]:
    """Compile every instantiation of ``sources`` (None: all; ``only``: just these name
    expressions) for each arch and analyse it; ``texts`` overrides source files' text and
    ``options`` adds NVRTC options (see :func:`._build._compiled`)."""
    from . import _build

    out = []
    for filename, arch, expressions, code, log in _build._compiled(archs, sources, ptxas_verbose=True, texts=texts,
                                                                     only=only, options=options):
        cubin = bytes(code.code)
        listing = parse_listing(disassemble(cubin))
        usage = res_usage(cubin)
        stats = _build.parse_ptxas_log(log)
        for expression in expressions:
            mangled = code.symbol_mapping[expression]
            mangled = mangled.decode() if isinstance(mangled, bytes) else mangled
            out.append(KernelSass(filename, arch, expression, mangled, stats[mangled], usage.get(mangled, {}),
                                  CFG(listing[mangled])))
    return out
