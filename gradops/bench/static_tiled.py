"""Static model of the staged tile kernels: **predicted, not measured**.

The depthwise input gradient's tiled kernel (``depthwise_conv2d_native_backprop_input_tiled``)
and the fractional average pooling gradient (``fractional_avg_pool_grad``) have no grid-stride
loop whose iteration is one element: a CTA stages a tile in shared memory, synchronises, and
each thread computes several outputs from it.  So one thread's whole run is the unit here.

What is counted (per kernel instantiation and launch choice)
-----------------------------------------------------------
**The common path of one thread**: the cheapest path from the kernel's first instruction to an
``EXIT`` (:meth:`gradops.backends.cuda._sass.CFG.function_table`) that

* passes every block holding a barrier (``BAR``) and, for depthwise, the block holding the most
  FFMA/DFMA instructions (the unchecked inner loop: finite filter; its FFMA count is checked
  against the tap arithmetic of the source, :func:`depthwise_fma_per_slice`), in every
  iteration of the loops holding them, so that no path skips the sums yet stores them;
* makes at least the global loads of the staging width and exactly the global stores of the
  result width that a thread of a full, interior tile makes (the busiest lane of each warp:
  guarded last steps counted as taken), computed from the tile shape below, with the fewest
  such loads any path has (a guarded load that the compiler predicated counts either way);
* runs the multiplier-slice loop ``slices`` times; the staging loops that are loops in SASS
  (the scalar NHWC loop unrolled by 4; the NCHW channel loop of the measured revision, before
  the plane-row staging, whose loops are unrolled) as often as their loads need.

NCHW plane-row staging (``stage_planes``, :meth:`DepthwiseTile.plane_steps`): the load count
is the busiest thread's tile loads (chunks or elements); with chunks of several elements the
filter's element loads are not counted, so a path may leave out the one of them that a branch
guards (the last step's; a few instructions per thread).  The staging stores a chunk a run of
columns at a time, or element by element, by one run-time condition per launch (the tiles'
first staged column a multiple of the run, :attr:`DepthwiseTile.run`): without runs no path
may hold a store wider than an element, with runs a path takes them wherever they store no
more words.
Before 2026-11-27 the filter loop's guard could end it in any step, so a path could leave out
most of the filter's loads and stores, and the model took run stores whether or not the launch
could: its NCHW figures were low, by up to ~180 instructions per thread at 5x5.

Every instruction on the path counts once (predicated or not, branches and ``BSSY``/``BSYNC``
included).  Every warp of the CTA is charged the whole path (a warp issues the union of its
lanes' paths; warps whose lanes skip a guarded last load are over-counted by those few
instructions).  Per output element: ``path x threads per CTA / outputs per CTA`` (outputs of a
full tile).  Per shape, every CTA of the launch grid is charged the interior CTA's cost: tiles
that overhang the image (7x7 and 14x14 maps in 8 x 16 tiles) pay for positions they do not
store, so a shape's SASS per element can be far above the kernel's.

Edge tiles take checked staging and stores (a few more instructions per load and store);
that is not counted.  The depthwise kernel's shared memory is static; occupancy comes from the
launcher's block size, the registers and the shared memory (:func:`._sass.occupancy`).

Fractional average pooling (:func:`predict_fractional`)
------------------------------------------------------
Its threads do unequal work (a tile's staging slots go to its first threads; a position lies
in one or two row and column cells), so every warp of every tile of the launch is enumerated
from the launcher's own ``plan()``, ``cell_tables()`` and ``tile_cell_ranges()``
(:func:`fractional_warps`) and charged its busiest lane's path (:func:`fractional_warp_cost`):
the whole-kernel *frame* (:func:`fractional_frame_cost`: both barriers, the lane's staged cells
with their 16-byte loads and at least their shares' words stored to shared memory, one position
of 1 x 1 cells) plus, per position in place of that one, the cheapest iteration of the position
loop reading the position's cells' words from shared memory with the source's table loads
(:func:`fractional_position_cost`).  SASS per element: 32 x the warps' instructions / elements.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass

from .static_report import template_args

#: dwconv:: constants of cuda_src/depthwise_conv2d_native_backprop_input.cu.
POSITION_BYTES, LANE_BYTES, VECTOR_BYTES, BATCH = 128, 8, 16, 12
#: dwconv::kBatchWords: registers of the NCHW plane-row staging's loads in flight per thread.
NCHW_BATCH_WORDS = 40
C_WIDTHS = {"__half": 2, "__nv_bfloat16": 2, "float": 4, "double": 8}


@dataclass(frozen=True)
class DepthwiseTile:
    """The tile shape of one tiled instantiation (``dwconv::Shape``, ``Axis``, ``Block``) and
    what one thread of an interior tile loads and stores, for a launch choice: ``vector``
    (16-byte staging), ``paired`` (multiplier 2 staged as one slice), ``slices`` (passes of the
    multiplier-slice loop)."""

    width: int
    acc: int
    nchw: bool
    kh: int
    kw: int
    sh: int
    sw: int
    r: int
    vector: bool
    paired: bool
    slices: int
    #: NCHW only: the plane-row staging and quad stores (``stage_planes``, ``store_quad``,
    #: issue 15); False: the earlier staging of 32 consecutive staged positions per warp and
    #: channel (the H100-measured revision).  ``vector`` then means 16-byte row chunks.
    rows: bool = True
    #: NCHW with ``rows``: columns per result store (4, 2 or 1: ``nchw_store_cols``).
    store_cols: int = 4
    #: NCHW with ``rows`` and ``vector``: bytes per staging load (16, 8 or 4).
    chunk: int = VECTOR_BYTES
    #: Work items across a tile (``Shape``'s C); 0: the full tile's (4, or 2 for 5x5 stride 1),
    #: as in revisions whose kernel had no C.
    c: int = 0
    #: NCHW with ``rows`` and chunks of several elements: columns per staging store
    #: (``stage_planes``: runs of min(chunk elements, 4) where the tiles' first staged column is
    #: a multiple of the run, else 1: element by element, as SAME padding mostly gives),
    #: :func:`~gradops.backends.cuda.depthwise_conv2d_native_backprop_input.nchw_staging_run`.
    run: int = 1

    @classmethod
    def of(cls, expression: str, vector: bool, paired: bool, multiplier: int, rows: bool = True,
           store_cols: int = 4, chunk: int = VECTOR_BYTES, run: int = 1) -> "DepthwiseTile":
        a = template_args(expression)
        kh, kw, sh, sw, r = (int(x) for x in a[3:8])
        c = int(a[8]) if len(a) > 8 else 0
        nchw = a[2] == "1"
        rows = nchw and rows
        return cls(C_WIDTHS[a[0]], C_WIDTHS[a[1]], nchw, kh, kw, sh, sw, r, vector and (rows or not nchw), paired,
                   1 if paired else multiplier, rows, store_cols if rows else 1, chunk, c, run)

    # ---- dwconv::Shape / Block / Axis
    @property
    def tall(self) -> bool:
        """7 x 4 work items (``Shape::TALL``): every stride-1 kernel; in the measured revision
        (no ``C``), 5x5 stride 1 only."""
        if not self.c:
            return (self.kh, self.kw, self.sh, self.sw) == MEASURED_TALL
        return (self.sh, self.sw) == (1, 1)

    @property
    def item(self) -> tuple[int, int]:
        return (7 if self.tall else 4), 4

    @property
    def tile(self) -> tuple[int, int]:
        """(rows, cols) of input positions per CTA."""
        return self.item[0] * self.r, 4 * (self.c or (2 if self.tall else 4))

    @property
    def channels(self) -> int:
        """Staged channels per CTA (``Block::CHANNELS``)."""
        return POSITION_BYTES // self.acc

    @property
    def v(self) -> int:
        return LANE_BYTES // self.acc

    @property
    def threads(self) -> int:
        rows, cols = self.tile
        return 16 * (rows // self.item[0]) * (cols // self.item[1])

    @property
    def staged(self) -> tuple[int, int]:
        """Staged out_backprop rows and columns (tile / stride + halo)."""
        rows, cols = self.tile
        return rows // self.sh + (self.kh - 1) // self.sh, cols // self.sw + (self.kw - 1) // self.sw

    @property
    def window(self) -> tuple[int, int]:
        return ((self.item[0] - 1) // self.sh + (self.kh - 1) // self.sh + 1,
                (self.item[1] - 1) // self.sw + (self.kw - 1) // self.sw + 1)

    @property
    def outputs(self) -> int:
        """Input-gradient elements one full CTA produces: tile positions x its input channels."""
        rows, cols = self.tile
        return rows * cols * (self.channels // (2 if self.paired else 1))

    # ---- one thread's global memory instructions (busiest lane, full interior tile)
    def _vector_steps(self) -> tuple[int, int]:
        """(filter loads, tile loads) of the 16-byte staging."""
        per_position = self.channels // (VECTOR_BYTES // self.width)
        slots = self.threads // per_position
        rows, cols = self.staged
        filter_steps = -(-self.kh * self.kw // slots)
        if slots >= cols:
            steps = -(-rows // (slots // cols))
        else:
            steps = -(-rows * cols // slots)
        return filter_steps, steps

    def plane_steps(self) -> tuple[int, int, int]:
        """NCHW row staging (``stage_planes``): (elements per load, unit steps, rows per unit step)
        of the busiest thread."""
        vec = self.chunk // self.width if self.vector else 1
        rows, cols = self.staged
        units = (cols + 2 * (vec - 1)) // vec * self.channels

        def cost(groups):  # dwconv::staging_cost / row_groups
            pairs = -(-units * groups // self.threads)
            return pairs * -(-rows // groups) + pairs

        groups = min(range(1, rows + 1), key=lambda g: (cost(g), g))
        return vec, -(-units * groups // self.threads), -(-rows // groups)

    @property
    def max_run(self) -> int:
        """NCHW row staging: the longest run a staging store may take (``stage_planes``' RUN =
        min(chunk elements, 4)); 1 without chunks of several elements (and NHWC)."""
        if not (self.nchw and self.rows and self.vector):
            return 1
        return min(self.chunk // self.width, 4)

    def filter_steps(self) -> int:
        """Filter values one thread loads and stores per slice when the filter is staged one
        element at a time (the busiest thread: every step of the loop)."""
        return -(-self.kh * self.kw * self.channels // self.threads)

    def loads(self) -> int:
        """Global loads of the staging width per thread (all slices); NCHW 16-byte row staging:
        its tile loads only (the filter's element loads come with them)."""
        if self.nchw and self.rows:
            _, unit_steps, steps = self.plane_steps()
            filter_loads = 0 if self.vector else self.filter_steps()
            return self.slices * (filter_loads + unit_steps * steps)
        if self.vector:
            return sum(self._vector_steps())
        filter_loads = self.filter_steps()
        if self.nchw:
            steps, (chunks, _) = self.channel_steps()
            tile_loads = steps * chunks
        else:
            tile_loads = self.nhwc_staging_loads()
        return self.slices * (filter_loads + tile_loads)

    def nhwc_staging_loads(self) -> int:
        """Scalar NHWC staging: elements of the staged tile per thread (its first thread's count)."""
        rows, cols = self.staged
        return -(-rows * cols * self.channels // self.threads)

    @property
    def load_width(self) -> int:
        if self.nchw and self.rows and self.vector:
            return self.chunk
        return VECTOR_BYTES if self.vector else self.width

    def stores(self) -> int:
        """Global stores per thread: NHWC one per position of the work item (both channels in one
        store, or the pair sum); NCHW with row staging the work item's rows of each channel (quads
        of 4 columns, one store each, two for float64, or 4 element stores); the measured
        revision's NCHW the shared-memory transpose's per-thread share."""
        if not self.nchw:
            return self.item[0] * self.item[1]
        if self.rows:
            rows, cols = self.tile
            slots = self.channels // (2 if self.paired else 1)
            steps = -(-slots * rows * (cols // 4) // self.threads)
            if self.store_cols == 4:
                return steps * (2 if self.width == 8 else 1)
            return steps * 4 // self.store_cols
        positions = self.tile[0] * self.tile[1]
        if self.threads >= positions:
            return -(-self.channels // (self.threads // positions))
        return -(-positions // self.threads) * self.channels

    @property
    def store_width(self) -> int:
        if self.nchw and self.store_cols > 1:
            return min(self.store_cols * self.width, VECTOR_BYTES)
        return self.width if (self.nchw or self.paired or self.v == 1) else 2 * self.width

    def channel_steps(self) -> tuple[int, tuple[int, int]]:
        """NCHW staging: (iterations of the channel loop, (loads, shared words) per iteration):
        CHANNELS / warps channels per warp, one element per 32-position chunk."""
        rows, cols = self.staged
        chunks = -(-rows * cols // 32)
        return self.channels // (self.threads // 32), (chunks, chunks * self.acc // 4)

    def shared_words(self) -> int:
        """4-byte words a thread stores to shared memory (a lower bound: the filter's 16-byte
        stores, made by the warps whose slots hold taps, are left to the path): 16-byte staging
        widens each tile load to accumulators; scalar staging stores each value it loads; the
        measured revision's NCHW also passed its results (V, or the pair sum, per position)
        through shared memory (row staging stores them from registers)."""
        if self.nchw and self.rows:
            # thread 0's chunks at shift 0 (every element staged) and its filter element stores
            # (all of its taps: the last step's guard ends no loop of thread 0's); results go
            # out directly.  Counting the filter's keeps a path from leaving out staged elements
            # in their place.
            vec, unit_steps, steps = self.plane_steps()
            return self.slices * (unit_steps * steps * min(vec, self.staged[1]) + self.filter_steps()) * self.acc // 4
        if self.vector:
            return self._vector_steps()[1] * (VECTOR_BYTES // self.width) * self.acc // 4
        results = self.item[0] * self.item[1] * (1 if self.paired else self.v) if self.nchw else 0
        return (self.loads() + results) * self.acc // 4

    def round_trips(self) -> int:
        """Dependent global-load round trips per thread before its sums can start: per slice,
        16-byte staging issues its loads in batches of 12 (all at once up to 16); scalar NHWC
        staging one unrolled-by-4 step at a time after the filter; NCHW one channel at a time
        after the filter."""
        if self.nchw and self.rows:  # the filter, then all the thread's loads in batches (stage_planes)
            vec, unit_steps, steps = self.plane_steps()
            words = max(1, vec * self.width // 4)
            batch = NCHW_BATCH_WORDS // words
            return self.slices * (1 + -(-unit_steps * steps // batch))
        if self.vector:
            filter_steps, steps = self._vector_steps()
            return self.slices * (1 if steps <= 16 else -(-steps // BATCH))
        rows, cols = self.staged
        if self.nchw:
            per_slice = 1 + self.channels // (self.threads // 32)
        else:
            per_slice = 1 + -(-self.nhwc_staging_loads() // 4)
        return self.slices * per_slice

    def l2_bytes_per_cta(self) -> int:
        """out_backprop tile with its halo and the filter slice, read from L2 once per CTA, and
        the CTA's outputs written."""
        rows, cols = self.staged
        return self.width * (rows * cols * self.channels * self.slices + self.kh * self.kw * self.channels *
                             self.slices) + self.width * self.outputs


def depthwise_fma_per_slice(t: DepthwiseTile) -> int:
    """FMAs of one thread's unchecked inner loop per slice, from the source's loops
    (``accumulate``): every staged value of the window times every tap carrying it to one of the
    work item's positions, V channels each."""
    rows, cols = t.window
    halo_r, halo_c = (t.kh - 1) // t.sh, (t.kw - 1) // t.sw
    count = 0
    for wr in range(rows):
        for wc in range(cols):
            for i in range(t.item[0]):
                r = i - (wr - halo_r) * t.sh
                if not 0 <= r < t.kh:
                    continue
                for j in range(t.item[1]):
                    s = j - (wc - halo_c) * t.sw
                    if 0 <= s < t.kw:
                        count += t.v
    return count


def fma_count(instructions) -> int:
    return sum(1 for x in instructions if x.base in ("FFMA", "DFMA"))


def sums_run(cfg) -> list[int]:
    """The unchecked sums: the run of consecutive blocks holding FFMA/DFMA, each flowing into the
    next, that holds the most.  Usually one block; a branch target inside the straight-line sums
    would split it (two report runs found a float16 stride-1 kernel's richest block short of
    the source's FFMAs, other runs of the same commit did not; the cause was not found)."""
    runs, run = [[]], []
    for n, b in cfg.blocks.items():
        if not fma_count(cfg.instructions(n)):
            run = []
            continue
        prev = cfg.blocks[run[-1]] if run else None
        if prev is not None and prev.end == b.start and n in prev.succs:
            run.append(n)
        else:
            run = [n]
            runs.append(run)
    return max(runs, key=lambda r: sum(fma_count(cfg.instructions(n)) for n in r))


def through_blocks(cfg, inner_loop: bool = True) -> list[int]:
    """The blocks a tiled kernel's common path passes: every barrier's, and (``inner_loop``)
    those of the unchecked sums (:func:`sums_run`), last."""
    blocks = [n for n in cfg.blocks if any(x.base == "BAR" for x in cfg.instructions(n))]
    if inner_loop:
        blocks += [n for n in sums_run(cfg) if n not in blocks]
    return blocks


def _global(ins, base: str, width: int) -> bool:
    from ..backends.cuda import _sass

    return ins.base == base and _sass.access_width(ins) == width


def shared_words(ins) -> int:
    """4-byte words a shared-memory store writes (the compiler merges neighbouring stores)."""
    from ..backends.cuda import _sass

    return _sass.access_width(ins) // 4 if ins.base == "STS" else 0


def shared_reads(ins) -> int:
    """4-byte words a shared-memory load reads."""
    from ..backends.cuda import _sass

    return _sass.access_width(ins) // 4 if ins.base == "LDS" else 0


def common_path(kernel, stores: tuple[int, int], loads: tuple[int, int], shared: int, trips: dict,
                through, slack: int = 16, reads: int | None = None, store_words=None) -> tuple[int, Counter]:
    """(instructions, counts) of the cheapest kernel path through ``through`` with exactly the
    global stores ``(bytes per thread, count)``, the fewest global loads ``(bytes, count)`` at
    least the count, and then the fewest shared-memory words stored at least ``shared``;
    ``reads``: also exactly that many 4-byte words loaded from shared memory (the staged
    kernels that sum from shared memory; None: not counted).
    ``trips``: ``{loop depth: (iterations, (loads, shared words or None) per iteration, or None)}``.
    ``store_words``: the shared words an instruction counts (default :func:`shared_words`); None
    from it rules out every path through that instruction, and otherwise it must count a store's
    width, as the default does (a path's words are checked against its stores' widths).

    The shared words keep a path from leaving a staging loop's or the result pass's stores
    early (their guards are run-time conditions the CFG cannot evaluate).  The counts are
    one table key, ``stores + a x words + a b x read words + a b c x loads``, with radices a,
    b, c past any count the key may hold (stores sit in no loop; every staging loop iteration
    loads), checked on the chosen path (c = 1 and no read digit when ``reads`` is None)."""
    from ..backends.cuda._sass import KeyLimit, PathError

    load_kind, store_kind = f"LDG.{8 * loads[0]}", f"STG.{8 * stores[0]}"
    a = 1 + sum(1 for x in kernel.function.instructions if _global(x, "STG", stores[0]))
    b = 1 + shared + slack
    c = 1 if reads is None else reads + 2  # the read digit may reach reads + 1 (pruned past that)

    def valid(k) -> bool:
        return k % a <= stores[1] and (k // a) % b < b - 1 and (reads is None or (k // (a * b)) % c <= reads)

    limit = KeyLimit(a * b * c * (loads[1] + slack) + a * b * c - 1, valid)
    words_of = store_words or shared_words

    def counted(ins) -> int:
        if _global(ins, "LDG", loads[0]):
            return a * b * c
        words = words_of(ins)
        if words is None:
            return limit.kmax + 1  # past the limit: the table drops every path through it
        weight = int(_global(ins, "STG", stores[0])) + a * words
        return weight + (a * b * shared_reads(ins) if reads is not None else 0)
    # A loop given (trips, (loads, words or None) per iteration) runs exactly that work per iteration.
    def per_iteration(per):
        if per is None:
            return None
        loads_each, words_each = per
        return lambda k: k // (a * b * c) == loads_each and (words_each is None or (k // a) % b == words_each)

    trips = {d: (t, per_iteration(per)) for d, (t, per) in trips.items()}
    table = kernel.cfg.function_table(counted, trips, kmax=limit, through=through)
    candidates = []
    for k, (cost, counts) in table.items():
        words = (k // a) % b
        # A block's wide stores can carry the words digit past b - 1 into the next (valid()
        # sees only the digit): such a path's digit understates its words, so it is left out.
        stored = sum(n * int(kind.split(".")[1]) // 32 for kind, n in counts.items() if kind.startswith("STS."))
        if stored != words:
            continue
        if (counts[store_kind] == stores[1] and words >= shared and counts[load_kind] >= loads[1]
                and (reads is None or (k // (a * b)) % c == reads)):
            candidates.append((counts[load_kind], words, cost, counts))
    if not candidates:
        raise PathError(f"{kernel.expression}: no path with {stores[1]} {store_kind}, >= {loads[1]} {load_kind}, "
                        f">= {shared} words of shared stores" + ("" if reads is None else f", {reads} words read"))
    *_, cost, counts = min(candidates, key=lambda c: c[:3])  # fewest loads, then shared words, then cheapest
    return cost, counts


_PATHS: dict = {}


def depthwise_tiled_path(kernel, vector: bool, paired: bool, multiplier: int, rows: bool = True,
                         store_cols: int = 4, chunk: int = VECTOR_BYTES, run: int = 1,
                         idle: bool = False) -> dict:
    """One thread's common path of a tiled depthwise instantiation for a launch choice, with
    its per-element figures (see the module docstring); cached per kernel object and choice.
    ``rows`` / ``store_cols`` / ``chunk`` / ``run``: NCHW staging and stores
    (:class:`DepthwiseTile`).  ``idle``: instead the path of a thread whose work item lies
    wholly outside the image (the kernel's ``active`` false): the same staging and barriers, no
    sums and no stores."""
    key = (id(kernel), vector, paired, multiplier, rows, store_cols, chunk, run, idle)
    if key not in _PATHS or _PATHS[key][0] is not kernel:
        _PATHS[key] = (kernel, _depthwise_tiled_path(kernel, vector, paired, multiplier, rows, store_cols, chunk,
                                                     run, idle))
    return _PATHS[key][1]


def _depthwise_tiled_path(kernel, vector: bool, paired: bool, multiplier: int, rows: bool = True,
                          store_cols: int = 4, chunk: int = VECTOR_BYTES, run: int = 1,
                          idle: bool = False) -> dict:
    from ..backends.cuda._sass import PathError, access_width

    t = DepthwiseTile.of(kernel.expression, vector, paired, multiplier, rows, store_cols, chunk, run)
    cfg = kernel.cfg
    through = through_blocks(cfg, inner_loop=not idle)
    fma = sum(fma_count(cfg.instructions(n)) for n in sums_run(cfg))
    if fma != depthwise_fma_per_slice(t):
        raise PathError(f"{kernel.expression}: the unchecked sums hold {fma} FMAs, the source's tap loops "
                        f"{depthwise_fma_per_slice(t)}")
    # Every slice stages the same loads, in the slice loop; NHWC's 16-byte staging has one slice,
    # which since b6601c2 precedes the loop (its loads in flight no longer sit beside the live
    # accumulators), so the loop's one iteration is left free.
    trips = {1: (t.slices, None if t.vector and not t.nchw else (t.loads() // t.slices, None))}
    if t.nchw and not t.rows:  # the channel loop (unroll 1): CHANNELS / warps steps of one load and store per chunk
        trips[2] = t.channel_steps()
    elif not t.vector:  # the staging loop unrolled by 4: its remainder (< 4 loads) runs before it, unrolled
        trips[2] = (t.nhwc_staging_loads() // 4, (4, 4 * t.acc // 4))
    # NCHW row staging: room in the word digit for as many words again as the filter's element stores
    slack = 16 + (t.slices * t.filter_steps() * t.acc // 4 if t.nchw and t.rows else 0)
    words = shared_words
    if t.run < t.max_run:
        # stage_planes takes one kind of store for every chunk: elements here, so no path may
        # hold a wider store (the filter's are one element each).  With runs, a path takes them
        # wherever they store no more words than the element stores, being cheaper (the compiler
        # may split a run store, so widths alone cannot tell the two apart).
        def words(ins):
            if ins.base == "STS" and access_width(ins) > t.run * t.acc:
                return None
            return shared_words(ins)
    if t.vector and not t.nchw:
        # A thread with NHWC's 16-byte staging (before the slice loop) skips the loop's element
        # staging, which the CFG cannot tell: no path may take a global load of another width.
        stored = words

        def sixteen_byte_words(ins):
            if ins.base == "LDG" and access_width(ins) != t.load_width:
                return None
            return stored(ins)
        words = sixteen_byte_words
    cost, counts = common_path(kernel, (t.store_width, 0 if idle else t.stores()), (t.load_width, t.loads()),
                               t.shared_words(), trips, through, slack=slack, store_words=words)
    from .static_report import _path_summary

    return {"tile": t, "instructions": cost, "counts": counts, "path": _path_summary(counts),
            "per_element": cost * t.threads / t.outputs, "loads": t.loads(), "load_width": t.load_width,
            "stores": t.stores(), "store_width": t.store_width,
            "global_bytes_per_element": (t.loads() * t.load_width + t.stores() * t.store_width) * t.threads /
            t.outputs}


def classes_per_element(counts: Counter, scale: float) -> dict:
    return {k.removeprefix("class:"): v * scale for k, v in counts.items() if k.startswith("class:")}


def ctas_in_flight(device, occ: dict) -> float:
    return device.sms * max(occ["blocks_per_sm"], 1e-9)


def latency_limit_s(device, ctas: int, occ: dict, round_trips: float) -> float:
    """Waves of resident CTAs x dependent round trips per CTA x DRAM latency (at least one wave)."""
    if not occ["blocks_per_sm"]:
        return math.inf
    return max(1.0, ctas / ctas_in_flight(device, occ)) * round_trips * device.dram_latency_s


# --------------------------------------------------------------------------- launches and shapes

#: The commit whose depthwise kernel the H100 Nsight Compute run measured (before the tiled
#: kernel paired multiplier 2: every multiplier staged one slice per pass, scalar loads past 1).
MEASURED_DEPTHWISE_REVISION = "d2276ad"
#: Its only filter shape with 7 x 4 work items (14 x 8 tiles): 5x5 stride 1.
MEASURED_TALL = (5, 5, 1, 1)


@dataclass(frozen=True)
class DepthwiseLaunch:
    """The tiled depthwise kernel's launch choices for one shape (16-byte-aligned arrays, as the
    benchmark's freshly allocated ones are)."""

    vector: bool
    paired: bool
    ctas: int
    #: NCHW: plane-row staging (False: the measured revision's), columns per result store, and
    #: the staging chunk (bytes; ``vector`` when it holds more than one element).
    rows: bool = True
    store_cols: int = 4
    chunk: int = VECTOR_BYTES
    #: Whether the model credits warps whose work items lie wholly outside the image with the
    #: idle path (today's launch; the measured revision's calibration keeps its own model).
    idle_warps: bool = True
    #: NCHW row staging: columns per staging store (:attr:`DepthwiseTile.run`).
    run: int = 1


def depthwise_launch(g, dtype, revision: str | None = None) -> DepthwiseLaunch:
    """The launcher's choices for ``g`` today, or (``revision`` =
    :data:`MEASURED_DEPTHWISE_REVISION`) those of the measured revision: no pairing, 16-byte
    staging only at multiplier 1, 32 (float accumulators) input channels per CTA."""
    import importlib

    dw = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_input")
    from ..backends.cuda import _runtime

    if revision is None:
        if g.data_format == "NCHW":
            import numpy as _np

            chunk = dw.nchw_chunk_bytes(g, dtype)
            itemsize = _np.dtype(dtype).itemsize
            return DepthwiseLaunch(chunk > itemsize, dw.pair_multipliers(g, dtype),
                                   math.prod(dw.tile_grid(g, dtype)), True, dw.nchw_store_cols(g), chunk,
                                   run=dw.nchw_staging_run(g, chunk // itemsize))
        return DepthwiseLaunch(dw.use_vector_loads(g, dtype, ()), dw.pair_multipliers(g, dtype),
                               math.prod(dw.tile_grid(g, dtype)), True, dw.nchw_store_cols(g))
    if revision != MEASURED_DEPTHWISE_REVISION:
        raise ValueError(f"launch rules of revision {revision} are not known here")
    rows, cols, _ = measured_tile(g)  # no narrow tiles then, 7-row work items only at 5x5 stride 1
    across, down = dw.tile_counts(g, rows, cols)
    vector = g.data_format == "NHWC" and g.depth_multiplier == 1 and g.in_depth % _runtime.vector_width(dtype) == 0
    return DepthwiseLaunch(vector, False, across * -(-g.in_depth // dw.tile_channels(dtype)) * down * g.batch,
                           False, 1, idle_warps=False)


def depthwise_idle_warps(g, launch: DepthwiseLaunch) -> int:
    """Warps of the tiled input-gradient kernel's whole launch whose two work items both lie
    wholly outside the image (the kernel's ``active`` false in all 32 threads: the warp skips the
    sums and the stores), walked warp by warp over one image's tiles with the launcher's tile
    shape and pairing (``columns_per_warp``); every channel block and image repeats them (a
    channel block's lane 0 always holds a channel)."""
    import importlib

    dw = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_input")
    tile_rows, tile_cols, items = dw.tile_shape(g)
    item_rows_per_tile = dw.item_rows_per_tile(g)
    item_cols_per_tile = items // item_rows_per_tile
    item_rows, item_cols = tile_rows // item_rows_per_tile, tile_cols // item_cols_per_tile
    columns = item_rows_per_tile == 2 and dw.columns_per_warp(g)
    across, down = dw.tiles(g)
    idle = 0
    for tile_row in range(down):
        y0 = tile_row * tile_rows - g.pad_top % g.stride_rows
        for tile_col in range(across):
            x0 = tile_col * tile_cols - g.pad_left % g.stride_cols
            for warp in range(items // 2):
                active = False
                for item in (2 * warp, 2 * warp + 1):
                    r, c = (item % 2, item // 2) if columns else divmod(item, item_cols_per_tile)
                    y, x = y0 + r * item_rows, x0 + c * item_cols
                    active |= y < g.in_rows and y + item_rows > 0 and x < g.in_cols and x + item_cols > 0
                idle += not active
    blocks = launch.ctas // (across * down * g.batch)
    return idle * blocks * g.batch


def predict_depthwise(case, dtype_name: str, device, kernel, g, launch: DepthwiseLaunch) -> dict:
    """The roofline of one depthwise input-gradient shape run by the tiled kernel: every CTA of
    the launch grid costs the interior CTA's common path (module docstring), but for its warps
    whose work items lie wholly outside the image, which cost the idle path (staging and
    barriers only; :func:`depthwise_idle_warps`); issue, DRAM (compulsory bytes), L2 (each CTA's
    staged tile with halo, filter slice and outputs) and the latency limit (waves of resident
    CTAs x dependent staging round trips x DRAM latency)."""
    from ..backends.cuda import _sass
    from .metrics import bytes_moved
    from .static_report import DTYPES, roofline, with_latency_limit

    width = DTYPES[dtype_name].itemsize
    choice = (kernel, launch.vector, launch.paired, g.depth_multiplier, launch.rows, launch.store_cols, launch.chunk,
              launch.run)
    path = depthwise_tiled_path(*choice)
    t = path["tile"]
    elements = math.prod(g.input_shape)
    threads = launch.ctas * t.threads
    idle_warps = depthwise_idle_warps(g, launch) if launch.idle_warps else 0
    idle = depthwise_tiled_path(*choice, idle=True) if idle_warps else {"instructions": 0, "counts": Counter()}
    busy_threads = threads - 32 * idle_warps
    per_element = (path["instructions"] * busy_threads + idle["instructions"] * 32 * idle_warps) / elements
    pipes = (Counter(classes_per_element(path["counts"], busy_threads / elements))
             + Counter(classes_per_element(idle["counts"], 32 * idle_warps / elements)))
    traffic = bytes_moved(case, g, width)
    l2 = launch.ctas * t.l2_bytes_per_cta()
    occ = _sass.occupancy(device.arch, kernel.ptxas["registers"], kernel.ptxas["shared_bytes"], t.threads)
    limits = roofline(device, elements, per_element, pipes, traffic, l2, occ["warps_per_sm"] * 32)
    with_latency_limit(limits, device, traffic, latency_limit_s(device, launch.ctas, occ, t.round_trips()))
    return {"suite": case.suite, "label": case.label, "op": case.op, "dtype": dtype_name, "device": device.key,
            "kernel": kernel.expression, "elements": elements, "bytes": traffic, "l2_bytes": l2,
            "sass_per_element": per_element, "resident_warps_per_sm": occ["warps_per_sm"], **limits,
            "tiled": {"ctas": launch.ctas, "threads_per_cta": t.threads, "vector_loads": launch.vector,
                      "load_bytes": t.load_width, "store_bytes": t.store_width,
                      "paired_multipliers": launch.paired, "slices": t.slices,
                      "thread_instructions": path["instructions"], "kernel_per_element": path["per_element"],
                      "idle_warps": idle_warps, "idle_thread_instructions": idle["instructions"],
                      "round_trips": t.round_trips(), "blocks_per_sm": occ["blocks_per_sm"],
                      "tile_fill": elements / (launch.ctas * t.outputs)}}


# --------------------------------------------------------------------------- fractional average pooling

#: The H100 Nsight Compute run measured the fractional kernel of the same commit as the depthwise one.
MEASURED_FRACTIONAL_REVISION = MEASURED_DEPTHWISE_REVISION
FRACTIONAL_LAUNCHER = "gradops.backends.cuda.fractional_avg_pool_grad"
_LAUNCHERS: dict = {}


def measured_name(expression: str) -> str:
    """A full-width tiled depthwise instantiation of today's source as
    :data:`MEASURED_DEPTHWISE_REVISION` names it: its kernel had no ``C`` (every tile full
    width), so its name ends at ``R``."""
    return expression.rsplit(", ", 1)[0] + ">"


def measured_tile(g) -> tuple[int, int, int]:
    """(tile rows, tile cols, work items down) of :data:`MEASURED_DEPTHWISE_REVISION`'s tiled
    kernel for ``g``: 8 x 16 positions, or for 5x5 stride 1 (its only 7-row work items) 14 x 8,
    and 7 x 8 on images of at most 7 rows."""
    if (g.filter_rows, g.filter_cols, g.stride_rows, g.stride_cols) == MEASURED_TALL:
        down = 1 if g.in_rows <= 7 else 2
        return 7 * down, 8, down
    return 8, 16, 2


def measured_depthwise_expression(g, dtype) -> str:
    """The tiled instantiation :data:`MEASURED_DEPTHWISE_REVISION` launched for ``g``."""
    import importlib

    dw = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_input")
    shape = (g.filter_rows, g.filter_cols, g.stride_rows, g.stride_cols)
    return measured_name(dw._tiled_expression(dtype, g.data_format, shape, measured_tile(g)[2]))


def fractional_launcher(revision: str | None = None):
    """The fractional average pooling launcher module: today's, or (``revision``) that commit's
    ``gradops/backends/cuda/fractional_avg_pool_grad.py`` (``git show``) run as a sibling module,
    so its own :func:`plan` and tables decide the launch of the kernel it launched."""
    import importlib

    if revision is None:
        return importlib.import_module(FRACTIONAL_LAUNCHER)
    if revision not in _LAUNCHERS:
        import subprocess
        import sys
        import types
        from pathlib import Path

        path = FRACTIONAL_LAUNCHER.replace(".", "/") + ".py"
        text = subprocess.check_output(["git", "show", f"{revision}:{path}"], text=True,
                                       cwd=Path(__file__).resolve().parents[2])
        name = f"{FRACTIONAL_LAUNCHER}_at_{revision}"
        module = types.ModuleType(name)
        module.__package__, module.__file__ = FRACTIONAL_LAUNCHER.rsplit(".", 1)[0], f"{revision}:{path}"
        sys.modules[name] = module  # dataclasses look their module up
        exec(compile(text, module.__file__, "exec"), module.__dict__)
        _LAUNCHERS[revision] = module
    return _LAUNCHERS[revision]


def fractional_plan(g, expression: str, revision: str | None = None):
    """The launcher's plan of ``g`` for the instantiation ``expression`` (its element type, index
    type and vector width forced as the expression names them; aligned tensors)."""
    fr = fractional_launcher(revision)
    element, index, vector = template_args(expression)
    dtype = next(d for d, c in fr.ELEMENT_TYPES.items() if c == element)
    return fr.plan(g, dtype, index=index, vector=int(vector))


@dataclass(frozen=True)
class FractionalWarp:
    """What one warp of the staged fractional kernel does in one tile (its busiest lane per
    phase): ``staged`` cells a lane stages (one per staging slot it visits: the launcher's
    ``stage_cols`` is at least the tile's column cells) with ``vectors`` 16-byte (or element)
    loads each, then per position it sums and stores, the row cells of that position (``rows``), each
    with ``cols`` column cells (a lane's column is fixed: the warp's most)."""

    staged: int
    vectors: int
    cols: int
    rows: tuple[int, ...]


def fractional_warps(g, p, fr=None) -> tuple[Counter, dict]:
    """(``{FractionalWarp: warps}`` over the whole launch, {"ctas": tiles, "staged_cells": cells
    staged in all, "round_trips": ...}) for geometry ``g`` and plan ``p``, from the launcher's own
    cell tables and tile ranges (``fr``: the launcher module).  Every tile must take the staged
    path, stage one batch item and each position lie in a cell (the benchmark shapes do);
    otherwise :class:`PathError` (not modelled)."""
    import numpy as np

    from ..backends.cuda._sass import PathError

    fr = fr or fractional_launcher()
    row_offsets, row_cells, _ = fr.cell_tables(g.row_starts, g.row_ends, g.in_rows)
    col_offsets, col_cells, _ = fr.cell_tables(g.col_starts, g.col_ends, g.in_cols)
    row_ranges = fr.tile_cell_ranges(row_offsets, row_cells, p.tile_height).reshape(-1, 2)
    col_ranges = fr.tile_cell_ranges(col_offsets, col_cells, p.tile_cols).reshape(-1, 2)
    rows_at, cols_at = np.diff(row_offsets), np.diff(col_offsets)
    bx, by = p.block
    threads = bx * by
    if threads % 32:
        raise PathError(f"a block of {threads} threads is not whole warps")
    lane = np.arange(threads)
    cv, ty = lane % bx, lane // bx
    tcl, trl = p.tile_cols.bit_length() - 1, p.tile_rows.bit_length() - 1
    tx, tz, tn = ty & (p.tile_cols - 1), (ty >> tcl) & (p.tile_rows - 1), ty >> (tcl + trl)
    cell_doubles = p.cell_doubles
    cells_fit = p.share_cells if p.share_cells * cell_doubles <= fr.SHARE_CAPACITY else 0
    vectors_total = g.depth // p.vector
    warps: Counter = Counter()
    staged_cells = 0

    def weight(count_full, count_last, last_differs):
        return ((count_full, False), (count_last, True)) if last_differs else ((count_full + count_last, False),)

    batch_groups = weight(p.batch_tiles - 1, 1, g.batch % p.tile_batch != 0)
    channel_groups = weight(p.channel_blocks - 1, 1, vectors_total % p.block_vectors != 0)
    for ct, (col_lo, col_hi) in enumerate(col_ranges):
        nc = int(col_hi - col_lo + 1)
        x = ct * p.tile_cols + tx
        for by_, (row_lo, row_hi) in enumerate(row_ranges):
            nr = int(row_hi - row_lo + 1)
            if not (nr > 0 and nc > 0 and nr <= cells_fit and nc <= cells_fit and nr * nc <= cells_fit):
                raise PathError(f"tile ({by_}, {ct}) takes the direct path ({nr} x {nc} cells, {cells_fit} fit)")
            # Staging: slots thread, thread + threads, ... below nr x stage_cols; a slot's columns
            # j = slot % stage_cols, + stage_cols, ... below nc.
            slots = nr * p.stage_cols
            per_lane = np.zeros(threads, np.int64)
            for first in range(0, slots, threads):
                slot = lane + first
                per_lane += np.where(slot < slots, np.maximum(0, -(-(nc - slot % p.stage_cols) // p.stage_cols)), 0)
            y0 = by_ * p.tile_height + tz
            positions = np.where(y0 < g.in_rows, np.minimum(p.rows_per_thread, -(-(g.in_rows - y0) // p.tile_rows)), 0)
            for nb, last_batch in batch_groups:
                n_first = (p.batch_tiles - 1 if last_batch else 0) * p.tile_batch
                staged_batch = min(p.tile_batch, g.batch - n_first)
                if staged_batch > 1:
                    raise PathError(f"a tile stages {staged_batch} batch items (modelled: one)")
                for ncb, last_channels in channel_groups:
                    cb = p.channel_blocks - 1 if last_channels else 0
                    vectors = min(bx, vectors_total - cb * p.block_vectors)
                    c = cb * p.block_vectors * p.vector + cv * p.vector
                    has = (n_first + tn < g.batch) & (c < g.depth) & (x < g.in_cols)
                    tiles = nb * ncb
                    staged_cells += tiles * nr * nc * staged_batch
                    for w in range(threads // 32):
                        lanes = slice(32 * w, 32 * w + 32)
                        h = has[lanes]
                        count = int(positions[lanes][h].max()) if h.any() else 0
                        rows = []
                        for i in range(count):
                            ys = (y0[lanes] + i * p.tile_rows)[h]
                            ys = ys[ys < g.in_rows]
                            rows.append(int(rows_at[ys].max()))
                        cols = int(cols_at[x[lanes][h]].max()) if count else 0
                        if count and (min(rows) == 0 or cols_at[x[lanes][h]].min() == 0):
                            raise PathError("a position in no pooling cell (stores zeros): not modelled")
                        key = FractionalWarp(int(per_lane[lanes].max()), vectors, cols, tuple(rows))
                        warps[key] += tiles
    ctas = p.channel_blocks * p.col_tiles * p.row_tiles * p.batch_tiles
    return warps, {"ctas": ctas, "staged_cells": staged_cells, "threads": threads}


def _fractional_kinds(kernel) -> dict:
    """Widths of one staged fractional instantiation: element, vector V, the staging load (16
    bytes, or the element when V = 1) and the result store (V elements)."""
    from .static_report import element_width

    vector = template_args(kernel.expression)[2]
    width, v = element_width(kernel.expression), int(vector)
    return {"width": width, "v": v, "load": 16 if v > 1 else width,
            "store": v * width}


def position_loop(cfg):
    """The staged path's position loop: the innermost loop holding both a shared-memory load and a
    global store (the direct path's loop reads no shared memory)."""
    from ..backends.cuda._sass import PathError

    loops = [lp for lp in cfg.loops
             if {"LDS", "STG"} <= {x.base for x in cfg.loop_instructions(lp)}]
    if not loops:
        raise PathError("no loop both reads shared memory and stores to global memory")
    return min(loops, key=lambda lp: len(lp.blocks))


_FRACTIONAL: dict = {}


def fractional_position_cost(kernel, rows: int, cols: int) -> tuple[int, Counter]:
    """(instructions, counts) of one iteration of the position loop summing a position in ``rows``
    row cells x ``cols`` column cells: exactly 2V words read from shared memory per cell and the
    source's table loads, any width (two row offsets, one row-cell id per row cell, one
    column-cell id per row cell and column cell past the first two; the loop loads nothing else
    from global memory) - the second count tells the row-cell loop from the second column cell,
    which read the same words."""
    from ..backends.cuda import _sass
    from ..backends.cuda._sass import KeyLimit, PathError

    key = ("position", id(kernel), rows, cols)
    if key in _FRACTIONAL and _FRACTIONAL[key][0] is kernel:
        return _FRACTIONAL[key][1]
    k = _fractional_kinds(kernel)
    cfg = kernel.cfg
    loop = position_loop(cfg)
    radix = 64
    index_loads = 2 + rows + rows * max(cols - 2, 0)
    words = 2 * k["v"] * rows * cols
    if index_loads >= radix:
        raise PathError(f"{rows} x {cols} cells: too many table loads to count")

    def counted(ins) -> int:  # every global load of the loop is a table load (64-bit tables' ids may load as 32-bit)
        return radix * shared_reads(ins) + int(_sass.is_global_load(ins))

    table = cfg.path_table(loop, counted, {}, kmax=KeyLimit(radix * words + radix - 1, lambda q: q % radix < radix - 1))
    target = radix * words + index_loads
    if target not in table:
        raise PathError(f"{kernel.expression}: no position-loop iteration reads {words} words and makes "
                        f"{index_loads} index loads ({rows} x {cols} cells)")
    _FRACTIONAL[key] = (kernel, table[target])
    return table[target]


def fractional_frame_cost(kernel, staged: int, vectors: int, positions: bool) -> tuple[int, Counter]:
    """(instructions, counts) of a thread's whole path through the staged tile with one position
    of 1 x 1 cells (or none): every barrier passed, the grid loops and the staging batch loop
    run once, ``staged`` cells staged (the slot loop ``staged`` times, the column loop once per
    slot: ``vectors`` loads of the staging width per cell, at least 2V words stored to shared
    memory per vector), exactly one store of V elements and 2V words read
    (:func:`common_path`); the position loop's nested loops run as the counts allow (never,
    for one 1 x 1 position)."""
    key = ("frame", id(kernel), staged, vectors, positions)
    if key in _FRACTIONAL and _FRACTIONAL[key][0] is kernel:
        return _FRACTIONAL[key][1]
    k = _fractional_kinds(kernel)
    trips = {d: (1, None) for d in range(1, 7)}
    trips[5] = (max(staged, 1), None)  # the slot loop (depth 5; the position loop's inner loops are not entered)
    result = common_path(kernel, (k["store"], int(positions)), (k["load"], staged * vectors),
                         staged * vectors * 2 * k["v"], trips, through_blocks(kernel.cfg, inner_loop=False),
                         reads=2 * k["v"] * int(positions))
    _FRACTIONAL[key] = (kernel, result)
    return result


def fractional_warp_cost(kernel, w: FractionalWarp) -> tuple[int, Counter]:
    """One warp's path in one tile: the frame (:func:`fractional_frame_cost`, its one position
    a 1 x 1 one) plus, per position, its position-loop iteration in place of the frame's."""
    cost, counts = fractional_frame_cost(kernel, w.staged, w.vectors, bool(w.rows))
    counts = Counter(counts)
    if w.rows:
        base, base_counts = fractional_position_cost(kernel, 1, 1)
        cost -= base
        counts.subtract(base_counts)
        for r in w.rows:
            c, cc = fractional_position_cost(kernel, r, w.cols)
            cost += c
            counts.update(cc)
    return cost, counts


def staging_serialised(kernel) -> bool:
    """Whether the staging lane's loads of one cell's vectors are issued one after another: each
    in its own block, which ends in the branch on that vector's finiteness (so the next load waits
    for this one's data)."""
    k = _fractional_kinds(kernel)
    cfg = kernel.cfg
    loop = position_loop(cfg)
    blocks = [n for n in cfg.blocks if n not in loop.blocks
              and any(_global(x, "LDG", k["load"]) for x in cfg.instructions(n))]
    return len(blocks) >= 2 and all(sum(_global(x, "LDG", k["load"]) for x in cfg.instructions(n)) == 1
                                    for n in blocks)


def fractional_tiled(kernel, g, p, fr=None) -> dict:
    """The whole launch of ``g`` with plan ``p``: issued warp-instructions (every warp of every
    tile its busiest lane's path, :func:`fractional_warp_cost`), per element, per pipe class."""
    warps, info = fractional_warps(g, p, fr)
    total, counts = 0, Counter()
    for w, n in warps.items():
        cost, c = fractional_warp_cost(kernel, w)
        total += n * cost
        for key, v in c.items():
            counts[key] += n * v
    elements = g.batch * g.in_rows * g.in_cols * g.depth
    return {"warp_instructions": total, "per_element": 32 * total / elements, "counts": counts,
            "classes_per_element": classes_per_element(counts, 32 / elements), "warps": warps, **info,
            "elements": elements}


def fractional_round_trips(kernel, warps: Counter) -> int:
    """Dependent DRAM round trips per tile before its sums: 1 for the table chain (the tile's cell
    ranges, then the cell sizes: L2-resident, counted as one) plus the busiest staging lane's
    out_backprop loads of its cells: one per vector when they are serialised (:func:`staging_serialised`), else
    one for all."""
    vectors = max((w.vectors for w in warps if w.staged), default=0)
    cells = max((w.staged for w in warps), default=0)
    return 1 + cells * (vectors if staging_serialised(kernel) else min(vectors, 1))


def predict_fractional(case, dtype_name: str, device, kernel, g, p, fr=None) -> dict:
    """The roofline of one fractional average pooling shape run by the staged tile kernel with the
    launcher's plan ``p`` (module docstring): issue (every warp of every tile), DRAM (compulsory
    bytes and the plan's cell tables), L2 (each tile's staged cells read, the outputs written),
    latency (waves of resident CTAs x the tile's dependent round trips x DRAM latency)."""
    from ..backends.cuda import _sass
    from .metrics import bytes_moved
    from .static_report import DTYPES, roofline, with_latency_limit

    fr = fr or fractional_launcher()
    width = DTYPES[dtype_name].itemsize
    model = fractional_tiled(kernel, g, p, fr)
    elements = model["elements"]
    tables = sum(len(t) for t in fr.kernel_tables(g, p)) * fr.INDEX_TYPES[p.index].itemsize
    traffic = bytes_moved(case, g, width) + tables
    l2 = model["staged_cells"] * p.block_vectors * p.vector * width + width * elements + tables
    occ = _sass.occupancy(device.arch, kernel.ptxas["registers"], kernel.ptxas["shared_bytes"], model["threads"])
    limits = roofline(device, elements, model["per_element"], model["classes_per_element"], traffic, l2,
                      occ["warps_per_sm"] * 32)
    trips = fractional_round_trips(kernel, model["warps"])
    with_latency_limit(limits, device, traffic, latency_limit_s(device, model["ctas"], occ, trips))
    warps_per_tile = model["threads"] // 32
    return {"suite": case.suite, "label": case.label, "op": case.op, "dtype": dtype_name, "device": device.key,
            "kernel": kernel.expression, "elements": elements, "bytes": traffic, "l2_bytes": l2,
            "sass_per_element": model["per_element"], "resident_warps_per_sm": occ["warps_per_sm"], **limits,
            "tiled": {"ctas": model["ctas"], "threads_per_cta": model["threads"], "plan": _plan_dict(p),
                      "staging_warps_per_cta": sum(n for w, n in model["warps"].items() if w.staged) / model["ctas"],
                      "mean_positions_per_warp": sum(len(w.rows) * n for w, n in model["warps"].items()) /
                      (model["ctas"] * warps_per_tile),
                      "round_trips": trips, "blocks_per_sm": occ["blocks_per_sm"],
                      "staging_serialised": staging_serialised(kernel)}}


def _plan_dict(p) -> dict:
    from dataclasses import asdict

    return asdict(p)


# --------------------------------------------------------------------------- the tensor-core depthwise kernel

#: HMMA.16816 (m16n8k16, f32 accumulation) results per clock per SM assumed for mma.sync, in the
#: units of ``Device.pipes`` (a warp-instruction takes 32): one every 2 clocks per SM, i.e. 2048
#: dense FLOP per clock per SM (A100's datasheet 312 TFLOP/s at 1.41 GHz on 108 SMs; ASSUMED the
#: same for H100's mma.sync, which does not reach its wgmma peak).  An HMMA.1688 (half the
#: products) is ASSUMED to take half the tensor pipe's time of an HMMA.16816.
TENSOR_LANES = 16


def hmma_16816_equivalents(instructions) -> float:
    """The tensor pipe's work of some HMMA instructions in HMMA.16816 units (an HMMA.1688: 1/2)."""
    return sum(0.5 if ".1688." in x.opcode + "." else 1.0 for x in instructions if x.base == "HMMA")


def mma_template(expression: str) -> tuple[int, int]:
    """(K, M) of a ``depthwise_conv2d_native_backprop_input_mma<T, K, M[, PLANE]>`` expression."""
    args = template_args(expression)
    return int(args[1]), int(args[2])


def mma_form_of(expression: str) -> int:
    """The FORM of a tensor-core input-gradient expression (an index of the launcher's MMA_FORMS:
    0 rows, 1 whole planes, 2 packed images, 3 rows with 16-byte result runs)."""
    args = template_args(expression)
    return int(args[3]) if len(args) > 3 else 0


#: The runs form (MMA_FORMS' "runs"): a lane's one 16-byte result store a unit.
MMA_RUNS_FORM = 3


def _mma_kinds(vec: int, pairs: bool, runs: bool = False) -> tuple[str, str, int]:
    """The staging load kind, the result store kind and stores per unit of one lane."""
    if runs:
        return f"LDG.{16 * vec}", "STG.128", 1
    return f"LDG.{16 * vec}", ("STG.32" if pairs else "STG.16"), (4 if pairs else 8)


def mma_unit_loads(expression: str, vec: int, plane_elements: int = 0) -> int:
    """Staging loads of the busiest lane per unit, per multiplier slice: dwmma::stage_rows, ROWS
    rows x 32 columns in chunks of ``vec`` elements dealt to 32 lanes; the whole-plane and packed
    forms (dwmma::stage_plane, stage_packed), the ``plane_elements`` they stage a slice (one plane;
    four) in chunks of ``vec`` (packed: 1) dealt to 32 lanes."""
    k, m = mma_template(expression)
    if mma_form_of(expression) in (1, 2):  # whole planes, packed images
        if plane_elements <= 0 or plane_elements % vec:
            raise ValueError(f"{expression}: a plane of {plane_elements} elements in chunks of {vec}")
        return -(-plane_elements // vec // 32) * m
    return -(-(16 + k - 1) * (32 // vec) // 32) * m


def mma_paths(kernel, vec: int, pairs: bool = True, plane_elements: int = 0) -> dict:
    """One lane's cheapest path through one unit of the tensor-core kernel (every HMMA of every
    tap row, its staging loads of ``vec`` elements (:func:`mma_unit_loads`; ``plane_elements``:
    out_backprop's plane, for the whole-plane form), its result stores: the runs form's one
    16-byte store, else pairs where in_cols is even, else elements; the checked sums not taken),
    and through the whole kernel with one
    unit, whose difference is the fixed cost of a warp (its band fragments; the whole-plane
    form's pair offsets and zeroed tiles too).  ``tensor``: the unit's HMMAs in HMMA.16816 units
    (:func:`hmma_16816_equivalents`)."""
    from ..backends.cuda import _sass
    from ..backends.cuda._sass import KeyLimit, PathError

    cfg = kernel.cfg
    k, m = mma_template(kernel.expression)
    load_kind, store_kind, stores = _mma_kinds(vec, pairs, mma_form_of(kernel.expression) == MMA_RUNS_FORM)
    loads = mma_unit_loads(kernel.expression, vec, plane_elements)
    hmma = 4 * k * m
    units = [lp for lp in cfg.top_loops() if any(x.base == "HMMA" for n in lp.blocks for x in cfg.instructions(n))]
    if len(units) != 1:
        raise PathError(f"{kernel.expression}: {len(units)} loops hold the HMMAs, expected the unit loop")
    # key = HMMA + a x staging loads + a b x result stores
    a, b = hmma + 2, loads + 2
    in_unit = {x.offset for n in units[0].blocks for x in cfg.instructions(n)}
    tensor = hmma_16816_equivalents(x for n in units[0].blocks for x in cfg.instructions(n))

    def counted(ins) -> int:
        kind = _sass.memory_kind(ins)
        weight = 1 if ins.base == "HMMA" else 0
        if kind == load_kind and (vec > 1 or ins.offset in in_unit):
            weight += a
        if kind == store_kind:
            weight += a * b
        return weight

    unit_key = hmma + a * loads + a * b * stores
    cost, counts = cfg.path(units[0], unit_key, counted)

    # The band's filter loads are predicated in the compiled code (every lane issues all of them),
    # so the cheapest whole-kernel path with exactly one unit's counts holds their real cost.
    table = cfg.function_table(counted, {1: (1, None)}, kmax=KeyLimit(unit_key + 1, lambda key: True))
    if unit_key not in table:
        raise PathError(f"{kernel.expression}: no path through the kernel with exactly one unit")
    whole_key = unit_key
    whole, whole_counts = table[whole_key]
    return {"unit": cost, "unit_counts": counts, "fixed": whole - cost, "fixed_counts": whole_counts - counts,
            "hmma": hmma, "tensor": tensor, "loads": loads, "load_kind": load_kind, "stores": stores,
            "store_kind": store_kind}


def _mean_sectors(row_bytes: int, start: int, span: int) -> float:
    """32-byte sectors an access of ``span`` bytes touches, from byte ``start`` of a row, averaged
    over rows ``row_bytes`` apart (the alignment repeats every 32 / gcd(row_bytes, 32) rows)."""
    period = 32 // math.gcd(row_bytes, 32)
    return sum(-(-((start + y * row_bytes) % 32 + span) // 32) for y in range(period)) / period


def mma_result_transfers(g, width: int, form: int) -> float:
    """Sector transfers of one in_backprop row's result stores by the tensor-core kernel, averaged
    over the rows' alignments (:func:`_mean_sectors`).  Stores of one instruction to one sector
    take one transfer, of two instructions two: per unit (16 columns from x0) the runs form stores
    a row's two 16-byte runs in one instruction; the other forms' accumulator stores put 8 columns
    from x0 + 8 j (j = 0, 1) of a row in one instruction: one piece as pairs (in_cols even), two as
    elements (every other column each; the packed form's element stores counted so too)."""
    import importlib

    dw = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_input")
    name, row = dw.MMA_FORMS[form], g.in_cols * width
    pairs = g.in_cols % 2 == 0 and name != "packed"
    transfers = 0.0
    for x0 in range(0, g.in_cols, 16):
        if name == "runs":
            transfers += _mean_sectors(row, x0 * width, min(16, g.in_cols - x0) * width)
            continue
        for j in range(2):
            first = x0 + 8 * j
            cols = min(8, g.in_cols - first)
            if cols <= 0:
                continue
            if pairs:
                transfers += _mean_sectors(row, first * width, cols * width)
            else:
                for e in range(2):  # columns first + e, + 2, ...: a span of up to 7
                    last = first + e + 2 * ((cols - 1 - e) // 2)
                    if last >= first + e:
                        transfers += _mean_sectors(row, (first + e) * width, (last - first - e + 1) * width)
    return transfers


def mma_l2_bytes(g, width: int, form: int, units: int, plane_elements: int = 0) -> float:
    """The tensor-core kernel's L2 traffic in 32-byte sectors: a partial-sector access takes a
    sector's transfer (as the planes kernel's direct stores, :func:`predict_depthwise_planes`).
    The rows forms stage M x (16 + K - 1) rows a unit, each the 32 columns (64 bytes) from the
    unit's a0 (a multiple of 8 elements): 2 or 3 sectors by where the row's byte lies in its
    sector (SAME 3x3 and 5x5 on 112 columns: a0 = x0 - 8, 3), counted as for an interior unit;
    the whole-plane and packed forms their planes' bytes.  The results: every in_backprop row's
    :func:`mma_result_transfers` (runs on 112 columns: one sector per 16 columns; pairs two)."""
    import importlib

    dw = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_input")
    k, m = g.filter_rows, g.depth_multiplier
    if dw.MMA_FORMS[form] in ("plane", "packed"):
        loads = units * m * plane_elements * width
    else:
        loads = units * m * (16 + k - 1) * 32 * _mean_sectors(g.out_cols * width, dw.mma_window_col0(g) * width,
                                                              32 * width)
    rows = g.batch * g.in_depth * g.in_rows
    return loads + rows * mma_result_transfers(g, width, form) * 32


def predict_depthwise_mma(case, dtype_name: str, device, kernel, g) -> dict:
    """The roofline of one depthwise input-gradient shape run by the tensor-core kernel: every
    unit of the launch costs the unit path and every warp the fixed path (:func:`mma_paths`, the
    launcher's staging chunk and stores), the tensor pipe its HMMAs (:data:`TENSOR_LANES`), DRAM
    the compulsory bytes, L2 the 32-byte sectors the unit's staging and result stores touch
    (:func:`mma_l2_bytes`), and the latency limit one DRAM round trip per unit a warp takes in turn
    (waves of resident CTAs)."""
    import importlib

    from ..backends.cuda import _sass
    from .metrics import bytes_moved
    from .static_report import DTYPES, roofline, with_latency_limit

    dw = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_input")
    dtype = DTYPES[dtype_name]
    width = dtype.itemsize
    form = dw.mma_form(g, dtype)
    if form != mma_form_of(kernel.expression):
        raise ValueError(f"{kernel.expression}: not the launcher's form for {g}")
    packed = dw.MMA_FORMS[form] == "packed"
    images = dw.MMA_PACK_IMAGES if packed else 1  # a unit's
    vec = 1 if packed else dw.mma_plane_chunk(g, dtype) or dw.mma_chunk(g, dtype)
    plane_elements = images * g.out_rows * g.out_cols if form else 0
    pairs = g.in_cols % 2 == 0 and not packed
    paths = mma_paths(kernel, vec, pairs, plane_elements)
    k, m = mma_template(kernel.expression)
    grid = dw.mma_grid(g)
    ctas = math.prod(grid)
    warps = ctas * dw.MMA_WARPS
    down, across = dw.mma_units(g)
    groups = -(-g.batch // images)
    units = groups * down * across * g.in_depth
    units_per_warp = -(-groups // (grid[2] * dw.MMA_WARPS))
    elements = math.prod(g.input_shape)
    per_element = 32 * (paths["unit"] * units + paths["fixed"] * warps) / elements
    pipes = (Counter(classes_per_element(paths["unit_counts"], 32 * units / elements))
             + Counter(classes_per_element(paths["fixed_counts"], 32 * warps / elements)))
    pipes["tensor"] = 32 * paths["tensor"] * units / elements
    traffic = bytes_moved(case, g, width)
    l2 = mma_l2_bytes(g, width, form, units, plane_elements)
    occ = _sass.occupancy(device.arch, kernel.ptxas["registers"], kernel.ptxas["shared_bytes"], 32 * dw.MMA_WARPS)
    limits = roofline(with_tensor_pipe(device), elements, per_element, pipes, traffic, l2,
                      occ["warps_per_sm"] * 32)
    with_latency_limit(limits, device, traffic, latency_limit_s(device, ctas, occ, units_per_warp))
    return {"suite": case.suite, "label": case.label, "op": case.op, "dtype": dtype_name, "device": device.key,
            "kernel": kernel.expression, "elements": elements, "bytes": traffic, "l2_bytes": l2,
            "sass_per_element": per_element, "resident_warps_per_sm": occ["warps_per_sm"], **limits,
            "tiled": {"ctas": ctas, "threads_per_cta": 32 * dw.MMA_WARPS, "units": units,
                      "units_per_warp": units_per_warp, "load_bytes": vec * width,
                      "store_bytes": 16 if dw.MMA_FORMS[form] == "runs" else 4 if pairs else 2,
                      "unit_thread_instructions": paths["unit"], "form": form,
                      "fixed_thread_instructions": paths["fixed"], "hmma_per_unit": paths["hmma"],
                      "tensor_per_unit": paths["tensor"],
                      "blocks_per_sm": occ["blocks_per_sm"], "tile_fill": dw.mma_fill(g)}}


def mma_nhwc_slots(k: int, m: int) -> int:
    """(chunk, pair) staging slots a thread of the NHWC tensor-core kernel takes per image
    (``dwmnhwc::Stage::SLOTS``): M chunks of (unit + K - 1)^2 / 2 pairs of positions over the
    launcher's MMA_NHWC_THREADS."""
    import importlib

    dw = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_input")
    rows = dw.MMA_UNIT + k - 1
    return -(-m * rows * rows // 2 // dw.MMA_NHWC_THREADS)


def mma_nhwc_paths(kernel) -> dict:
    """One thread's cheapest path through one image of the NHWC tensor-core kernel (its warp's
    HMMAs, all its staging slots: their 16-byte loads, both positions of every slot, predicated,
    so all count, and their 8 word stores each; its warp's 4 result-plane stores and its 16-byte
    result store; the checked sums not taken), and through the whole kernel with one image, whose
    difference is the fixed cost of a thread (zeroing the tiles' unstaged columns, its warp's
    band, its slots' offsets).  ``tensor``: a warp's HMMAs per image in HMMA.16816 units
    (:func:`hmma_16816_equivalents`)."""
    from ..backends.cuda import _sass
    from ..backends.cuda._sass import KeyLimit, PathError

    cfg = kernel.cfg
    k, m = mma_template(kernel.expression)
    slots = mma_nhwc_slots(k, m)
    loads, words = 2 * slots, 8 * slots + 4  # 16-byte loads; 4-byte shared stores (staging, result planes)
    hmma = 4 * k * m
    images = [lp for lp in cfg.top_loops() if any(x.base == "HMMA" for n in lp.blocks for x in cfg.instructions(n))]
    if len(images) != 1:
        raise PathError(f"{kernel.expression}: {len(images)} loops hold the HMMAs, expected the image loop")
    # key = HMMA + a x staging loads + b x result stores + c x shared word stores
    a = hmma + 1
    b = a * (loads + 1)
    c = 2 * b
    tensor = hmma_16816_equivalents(x for n in images[0].blocks for x in cfg.instructions(n))

    def counted(ins) -> int:
        kind = _sass.memory_kind(ins)
        return ((1 if ins.base == "HMMA" else 0) + (a if kind == "LDG.128" else 0) + (b if kind == "STG.128" else 0)
                + (c if kind == "STS.32" else 0))

    image_key = hmma + a * loads + b + c * words
    cost, counts = cfg.path(images[0], image_key, counted)
    # The whole kernel with one image: the first image's loads are issued before the loop, the
    # loop's (the next image's) not taken, so the loads count once either way.
    table = cfg.function_table(counted, {1: (1, None)}, kmax=KeyLimit(image_key + 1, lambda key: True))
    if image_key not in table:
        raise PathError(f"{kernel.expression}: no path through the kernel with exactly one image")
    whole, whole_counts = table[image_key]
    return {"image": cost, "image_counts": counts, "fixed": whole - cost, "fixed_counts": whole_counts - counts,
            "hmma": hmma, "tensor": tensor, "loads": loads, "shared_words": words}


def predict_depthwise_mma_nhwc(case, dtype_name: str, device, kernel, g) -> dict:
    """The roofline of one depthwise input-gradient shape run by the NHWC tensor-core kernel:
    every (CTA, image) iteration of the launch costs each of its 256 threads the image path and
    every CTA each thread's fixed path (:func:`mma_nhwc_paths`), the tensor pipe 8 warps' HMMAs an
    iteration (:data:`TENSOR_LANES`), DRAM the compulsory bytes, L2 each iteration's staged
    window ((16 + K - 1)^2 positions x 16 M bytes, halo included) and its results, and the
    latency limit one DRAM round trip per image a CTA takes in turn (waves of resident CTAs; the
    band's filter loads are issued after the first image's, and wait with them)."""
    import importlib

    from ..backends.cuda import _sass
    from .metrics import bytes_moved
    from .static_report import DTYPES, roofline, with_latency_limit

    dw = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_input")
    dtype = DTYPES[dtype_name]
    width = dtype.itemsize
    paths = mma_nhwc_paths(kernel)
    k, m = mma_template(kernel.expression)
    grid = dw.mma_nhwc_grid(g)
    ctas = math.prod(grid)
    threads = dw.MMA_NHWC_THREADS
    iterations = grid[0] * grid[1] * g.batch  # (unit position, channel block, image)
    images_per_cta = -(-g.batch // grid[2])
    elements = math.prod(g.input_shape)
    per_element = threads * (paths["image"] * iterations + paths["fixed"] * ctas) / elements
    pipes = (Counter(classes_per_element(paths["image_counts"], threads * iterations / elements))
             + Counter(classes_per_element(paths["fixed_counts"], threads * ctas / elements)))
    warps = threads // 32
    pipes["tensor"] = 32 * paths["tensor"] * warps * iterations / elements
    traffic = bytes_moved(case, g, width)
    l2 = iterations * (16 + k - 1) ** 2 * 16 * m + elements * width
    occ = _sass.occupancy(device.arch, kernel.ptxas["registers"], kernel.ptxas["shared_bytes"], threads)
    limits = roofline(with_tensor_pipe(device), elements, per_element, pipes, traffic, l2,
                      occ["warps_per_sm"] * 32)
    with_latency_limit(limits, device, traffic, latency_limit_s(device, ctas, occ, images_per_cta))
    return {"suite": case.suite, "label": case.label, "op": case.op, "dtype": dtype_name, "device": device.key,
            "kernel": kernel.expression, "elements": elements, "bytes": traffic, "l2_bytes": l2,
            "sass_per_element": per_element, "resident_warps_per_sm": occ["warps_per_sm"], **limits,
            "tiled": {"ctas": ctas, "threads_per_cta": threads, "iterations": iterations,
                      "images_per_cta": images_per_cta, "load_bytes": 16, "store_bytes": 16,
                      "image_thread_instructions": paths["image"], "fixed_thread_instructions": paths["fixed"],
                      "hmma_per_warp_image": paths["hmma"], "tensor_per_warp_image": paths["tensor"],
                      "blocks_per_sm": occ["blocks_per_sm"], "tile_fill": dw.mma_fill(g)}}


def with_tensor_pipe(device):
    """``device`` with the tensor pipe's rate (:data:`TENSOR_LANES`) among its pipes, unless it has one."""
    pipes = dict(device.pipes)
    pipes.setdefault("tensor", TENSOR_LANES)
    return _with_pipes(device, pipes)


def _with_pipes(device, pipes: dict):
    from dataclasses import replace

    return replace(device, pipes=tuple(pipes.items()))


# --------------------------------------------------------------------------- the planes input kernel (NCHW)

#: Source lines :func:`planes_loop_figures` compiles as constants: the checked sums off (they run
#: only in a CTA whose filter slices hold an Inf or NaN), the stride-2 sums' column phase
#: (pad_left % 2), the result stores' columns (``store_cols``), the staging loads' elements
#: (``load_elements``) and the staging stores' lead (``lead``: with load_elements, the one
#: staging loop that runs), each uniform over a launch.
PLANES_CHECKED = "const bool checked = __syncthreads_or(nonfinite);"
PLANES_PHASE = "} else if (pad_left % 2 == 0) {"
PLANES_STORES = ("store_item_row<T>(dst, acc[0], x, in_cols, store_cols);",
                 "store_item_row<T>(dst + in_cols, acc[1], x, in_cols, store_cols);")
PLANES_LOADS = "    // (load_elements is uniform over the launch: one branch, the staging loop inside each case)"
PLANES_LEAD = "    const int lead = ((-col_origin) % PER + PER) % PER;"
#: Result columns per store and column phases the planes figures are compiled for.
PLANES_STORE_COLS = (8, 4, 2, 1)
PLANES_PHASES = (0, 1)



def planes_widest_load(expression: str) -> int:
    """Elements of the widest staging load (16 bytes) of a planes instantiation: its
    ``load_elements`` for rows and arrays that allow it."""
    from .static_report import template_args

    return 16 // C_WIDTHS[template_args(expression)[0]]


def planes_source(store_cols: int, phase: int, load_elements: int = 1, lead: int = 1) -> str:
    """The input-gradient source with the planes kernel's launch-uniform choices as constants
    (:data:`PLANES_CHECKED`, :data:`PLANES_PHASE`, :data:`PLANES_STORES`, :data:`PLANES_LOADS`,
    :data:`PLANES_LEAD`)."""
    from ..backends.cuda import _build
    from .static_report import DEPTHWISE_SOURCE

    text = (_build.source_dir() / DEPTHWISE_SOURCE).read_text()
    for needle in (PLANES_CHECKED, PLANES_PHASE, *PLANES_STORES, PLANES_LOADS, PLANES_LEAD):
        if text.count(needle) != 1:
            raise ValueError(f"the planes kernel's source no longer holds {needle!r} once")
    text = text.replace(PLANES_CHECKED, "const bool checked = false; (void)__syncthreads_or(nonfinite);")
    text = text.replace(PLANES_PHASE, "} else if (%s) {" % ("false" if phase else "true"))
    for needle in PLANES_STORES:
        text = text.replace(needle, needle.replace("store_cols)", f"{store_cols})"))
    text = text.replace(PLANES_LOADS, f"    load_elements = {int(load_elements)};\n" + PLANES_LOADS)
    text = text.replace(PLANES_LEAD, f"    const int lead = {int(lead)};")
    return text


@functools.lru_cache(maxsize=None)
def planes_loop_figures(arch: str, store_cols: int, phase: int, load_elements: int = 1, lead: int = 1) -> dict:
    """Per planes instantiation (name expression) on ``arch``: each loop's steady-state path of
    the kernel compiled from :func:`planes_source` (the cheapest path through one iteration that
    does the loop's work, ``CFG.path_table``), as ``(instructions, counts)`` where the loop's
    pipes matter and instructions elsewhere:

    * ``sums``: one slice's sums of one work item (the item loop's inner loop);
    * ``rest``: the rest of an item that stores both its rows (index split, filter taps, stores);
      ``skip``: an item below the image (``y >= in_rows``: no sums, no stores);
    * ``staging``: a chunk of ``kChunk`` elements inside a row (``kChunk / load_elements`` loads,
      those of the dtypes whose loads are that wide; the others have no such path and no
      figures; where ``lead`` > 0, with the load of the ``lead`` values before the chunk that
      its first 16-byte staging store takes: "Staging stores" in the source);
      ``staging_edge``: a row's last, shorter chunk (which stores its last group again, with
      zeros past the row); ``staging_skip``: a chunk in a row the
      band does not stage (no loads); ``staging_trips``: a chunk's dependent load round
      trips (:func:`._sass.load_round_trips` of the loop without the tensor's last chunk's
      element loop);
    * ``zero``: per 16-byte zero store; ``filter``: per tap (``filter_unroll`` taps an iteration,
      ``filter_trips`` round trips each);
    * ``straight``: the instructions outside loops a thread runs: the blocks dominating the item
      loop's header, and the cheapest path from its exit to ``EXIT`` (through the copy-out's
      one-vector loop in the staged form; :meth:`._sass.CFG.cheapest_tail`).

    Compiled once per (arch, store_cols, phase, load_elements) in a process."""
    import importlib

    from ..backends.cuda import _build, _sass
    from .static_report import DEPTHWISE_SOURCE, template_args

    names = [e for e in _build.all_instantiations(int(arch.removeprefix("sm_")))[DEPTHWISE_SOURCE] if "_planes<" in e]
    chunk = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_input").PLANES_CHUNK

    def is_store(x):  # a result store: to in_backprop, or (the staged form) to the result image
        return x.base in ("STG", "STS")

    figures = {}
    source = planes_source(store_cols, phase, load_elements, lead)
    for k in _sass.compile_kernels((arch,), [DEPTHWISE_SOURCE], texts={DEPTHWISE_SOURCE: source}, only=names):
        itemsize = C_WIDTHS[template_args(k.expression)[0]]
        if load_elements * itemsize > 16:  # no such load for this dtype: its staging loop is gone
            continue
        per = 16 // C_WIDTHS[template_args(k.expression)[1]]  # accumulators a 16-byte staging store
        if lead >= per:  # no such lead for this accumulator: its staging loop is gone
            continue
        cfg = k.cfg
        f: dict = {}
        item = copy_loop = None
        staged = template_args(k.expression)[-1] == "true"
        for loop in cfg.top_loops():
            mem = k.memory_instructions(loop)
            if staged and not loop.children and "STG.128" in mem and "LDS.128" in mem:
                # The staged form's copy-out, per 16 bytes: ptxas unrolls it (16 copies) with a
                # remainder loop of one; a CTA of the small maps it serves has a vector or two a
                # thread, so the dearer loop's figure counts (its scalar head and tail, a few
                # elements a CTA, are left out).
                table = cfg.path_table(loop, lambda x: x.base == "STG")
                stores = max(table)
                n, counts = table[stores]
                per = (n / stores, Counter({c: v / stores for c, v in counts.items()}))
                if per[0] > f.get("copy", (0.0,))[0]:
                    f["copy"] = per
                    copy_loop = loop
                continue
            if staged:  # the item loop: its slices' sums (a nested loop) and stores to the image
                is_item = bool(loop.children) and any(m.startswith("STS") for m in mem) and not any(
                    m.startswith(("LDG", "STG")) for m in mem)
            else:
                is_item = any(m.startswith("STG") for m in mem)
            if is_item:
                if not loop.children:  # a copy for multiplier 0 (no slice loop) the compiler keeps
                    continue
                item = loop
                sums = cfg.path_table(loop.children[0])
                f["sums"] = min(sums.values(), key=lambda v: v[0])
                # The path that runs the sums once and stores both rows: the most shared-memory
                # loads and global stores (the compiler keeps a path past the sums, for M < 1).
                table = cfg.path_table(loop, lambda x: is_store(x) or x.base == "LDS", trips={1: (1, None)}, kmax=128)
                whole, whole_counts = table[max(table)]
                f["rest"] = (whole - f["sums"][0], whole_counts - f["sums"][1])
                f["skip"] = table[0][0]
            elif any(m.startswith("LDG") for m in mem):
                loads = sum(v for m, v in mem.items() if m.startswith("LDG"))
                if loads >= chunk:  # staging: one chunk an iteration (with the tensor's last chunk's
                    # element loads), interior and edge paths
                    # Paths through the nested loop (the tensor's last chunk, element by element)
                    # weigh past kmax, so neither table takes them.
                    # So do the element loads of the blocks unrolled from it, where a chunk's
                    # loads are wider.
                    tail = {id(x) for child in loop.children for x in cfg.loop_instructions(child)}
                    width = load_elements * itemsize  # bytes of a chunk's loads
                    wide = f"LDG.{8 * width}" if width > itemsize else None

                    def weigh(test, tail=tail):
                        def weight(x):
                            return 4 * chunk if id(x) in tail else int(test(x))
                        return weight

                    # A chunk's path: the fewest loads among those that make the chunk's loads
                    # (the values before it one more: the source loads 16 bytes' worth, which
                    # ptxas narrows to the lead's; the tensor's last chunk, element by element,
                    # makes more loads or, at one element a load, as many).
                    loads = cfg.path_table(loop, weigh(_sass.is_global_load), kmax=2 * chunk)
                    key = min(c for c, (n, counts) in loads.items()
                              if 0 < c and (counts[wide] if wide else counts["LDG"]) >= chunk // load_elements)
                    f["staging"], f["staging_skip"] = loads[key], loads[0][0]
                    # A short chunk's path: the chunk's loads and one 16-byte store more (its
                    # last group again), the fewest instructions that take them.
                    stores = cfg.path_table(loop, weigh(lambda x: x.base == "STS"), kmax=2 * chunk)
                    f["staging_edge"] = min(n for c, (n, counts) in stores.items()
                                            if c > f["staging"][1]["STS"] and counts["LDG"])
                    f["staging_trips"] = _chunk_round_trips(cfg, loop, key)
                else:  # the filter loop (unrolled, with a remainder loop): per tap
                    table = cfg.path_table(loop, _sass.is_global_load)
                    per = min(n / c for c, (n, _) in table.items() if c)
                    if per < f.get("filter", math.inf):
                        f.update(filter=per, filter_unroll=max(table), filter_trips=cfg.loop_round_trips(loop))
            elif mem and all(m == "STS.128" for m in mem):
                per = len(cfg.loop_instructions(loop)) / mem["STS.128"]
                f["zero"] = min(f.get("zero", per), per)
        missing = {"sums", "staging", "filter", "zero"} - set(f) | ({"copy"} - set(f) if staged else set())
        if item is None or missing:
            raise _sass.PathError(f"{k.expression}: no {'item loop' if item is None else ', '.join(sorted(missing))} "
                                  f"found in its SASS")
        in_loops = set().union(*(lp.blocks for lp in cfg.top_loops()))
        exit_block = next(s for n in item.blocks for s in cfg.blocks[n].succs if s not in item.blocks)
        # Before the item loop, the blocks on every path to it; after it, the cheapest path to
        # the exit that enters the copy-out's loop of one vector an iteration (the staged form):
        # a thread runs the remainder blocks of the unrolled copy loops only for the trip counts
        # that take them, which on the small maps this form serves are one or two vectors
        # (summing every block after the item loop charged each warp ~340 instructions more
        # and priced the staged form 1.3-3.5x the direct one's time, where the H100 measured
        # 0.42-1.33x: results/gpu_h100_2026-12-06/stride2_ab.md).
        before = sum(len(cfg.instructions(n)) for n in cfg.dominators[item.header]
                     if n not in in_loops and not cfg.cold(n))
        f["straight"] = before + cfg.cheapest_tail(exit_block, (copy_loop,) if staged else ())
        figures[k.expression] = f
    return figures


def _chunk_round_trips(cfg, loop, chunk: int, limit: int = 4096) -> int:
    """The fewest dependent load round trips (:func:`._sass.load_round_trips`) of a path through
    one iteration of the planes kernel's staging loop that makes exactly ``chunk`` global loads
    (a chunk's path, its loads and the lead's; the tensor's last chunk's element loads, unrolled,
    take more, or at one element a load as many, and the fewer round trips of the two count;
    nested loops are left out)."""
    from ..backends.cuda import _sass

    nested = set().union(*(c.blocks for c in loop.children)) if loop.children else set()
    best, stack, seen = None, [[loop.header]], 0
    while stack and seen < limit:
        path = stack.pop()
        last = cfg.blocks[path[-1]]
        if last.index in loop.latches and loop.header in last.succs:
            seen += 1
            run = [x for n in path for x in cfg.instructions(n)]
            loads = [x for x in run if _sass.is_global_load(x)]
            if len(loads) == chunk:
                trips = _sass.load_round_trips(run)
                best = trips if best is None else min(best, trips)
        for n in last.succs:
            if n != loop.header and n in loop.blocks and n not in nested and n not in path and not cfg.cold(n):
                stack.append(path + [n])
    if best is None:
        raise _sass.PathError(f"no path through the staging loop at {cfg.blocks[loop.header].start} makes {chunk} loads")
    return best


def _warp_groups(active, warps: int):
    """Per warp of a ``for (k = tid; k < len(active); k += 32 x warps)`` loop: (iterations in
    which some lane's ``active[k]`` holds, iterations in which none does).  A group of 32
    consecutive k is one iteration of one warp (group g: warp g % warps)."""
    import numpy as np

    lanes = np.zeros(-(-len(active) // 32) * 32, dtype=bool)
    lanes[:len(active)] = active
    busy = lanes.reshape(-1, 32).any(axis=1)
    warp = np.arange(len(busy)) % warps
    return (np.bincount(warp[busy], minlength=warps), np.bincount(warp[~busy], minlength=warps))


def planes_work(g, dtype, f: dict, staged: bool | None = None) -> dict:
    """The launch's warp-instructions, pipe counts (summed over warps), its busiest warp's
    dependent round trips, and the out_backprop rows a slice's bands stage in all (``staged_rows``,
    halo rows once per band) of the planes kernel for ``g`` (:func:`planes_loop_figures`' ``f``).
    Every warp is charged its busiest lane's path in each iteration of each loop (a warp issues
    the union of its lanes' paths): the filter loop, the zero fill, the staging loop (an
    iteration whose lanes' chunks all lie in rows the band does not stage, past out_backprop:
    ``staging_skip``), the item loop (an iteration whose lanes' items all lie below the image:
    ``skip``; else ``rest`` and ``multiplier x sums``), and the straight-line code once.  CTAs
    differ in their planes (the last channel group) and their rows (bands at the image's
    edges).  ``staged``: the result stores' form (None: the launcher's), which sets the CTA's
    planes and band."""
    import importlib

    import numpy as np

    dw = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_input")
    warps = dw.PLANES_THREADS // 32
    planes, band = dw.planes_plan(g, dtype, staged)
    groups, bands, batch = dw.planes_grid(g, dtype, staged)
    m = g.depth_multiplier
    segments = dw.planes_segments(g)
    rows_cap = dw.planes_rows_cap(g, band)
    per_row = dw.planes_chunks_per_row(g)
    edge = (g.out_cols % dw.PLANES_CHUNK != 0) / per_row  # a row's last chunk, where it is shorter
    chunk_cost = (1 - edge) * f["staging"][0] + edge * f["staging_edge"]
    staged = dw.planes_staged_rows(g, band)
    pitch = dw.planes_pitch(g)
    per_store = 16 // np.dtype(np.float64 if np.dtype(dtype) == np.float64 else np.float32).itemsize
    taps = g.filter_rows * g.filter_cols
    pairs = -(-band // dw.PLANES_ITEM_ROWS)
    shift = g.pad_top % g.stride_rows  # y0 = band index x band - shift
    # Each band's first input row and the out_backprop rows it stages (the kernel's rows_run).
    band_rows = []
    for b in range(bands):
        y0 = b * band - shift
        row_origin = (y0 + g.pad_top) // g.stride_rows - (g.filter_rows - 1) // g.stride_rows
        band_rows.append((y0, min(g.out_rows, row_origin + staged) - max(0, row_origin)))
    warp_instructions, trips, counts = 0.0, 0, Counter()
    kinds = Counter(min(planes, g.in_depth - group * planes) for group in range(groups))  # planes: CTAs
    for my_planes, copies in kinds.items():
        slices = my_planes * m
        zero, _ = _warp_groups(np.ones(-(-slices * staged * pitch // per_store), dtype=bool), warps)
        filt, _ = _warp_groups(np.ones(taps * slices, dtype=bool), warps)
        fixed = float((zero * f["zero"] + filt * f["filter"] + f["straight"]).sum())
        for y0, rows_run in band_rows:
            # A chunk k: row (k // per_row) % rows_cap of its slice, staged where below rows_run.
            k = np.arange(slices * rows_cap * per_row)
            loaded, passed = _warp_groups((k // per_row) % rows_cap < rows_run, warps)
            # An item k: plane k // items, pair (k % items) // segments, rows y0 + 2 pair.
            k = np.arange(my_planes * pairs * segments)
            full, skipped = _warp_groups(y0 + dw.PLANES_ITEM_ROWS * ((k % (pairs * segments)) // segments) < g.in_rows,
                                         warps)
            work = (full.sum() * (f["rest"][0] + m * f["sums"][0]) + skipped.sum() * f["skip"]
                    + loaded.sum() * chunk_cost + passed.sum() * f["staging_skip"])
            copied = np.zeros(warps)
            if "copy" in f:  # the staged form: the image's 16-byte vectors, consecutive threads
                run = my_planes * (min(g.in_rows, y0 + band) - max(y0, 0)) * g.in_cols * np.dtype(dtype).itemsize
                copied, _ = _warp_groups(np.ones(run // 16, dtype=bool), warps)
                work += copied.sum() * f["copy"][0]
            warp_instructions += copies * batch * (float(work) + fixed)
            chain = loaded * f["staging_trips"] + -(-filt // f["filter_unroll"]) * f["filter_trips"]
            trips = max(trips, int(chain.max()))
            for figure, times in ((f["rest"][1], full.sum()), (f["sums"][1], m * full.sum()),
                                  (f["staging"][1], loaded.sum()), (f.get("copy", (0, Counter()))[1], copied.sum())):
                counts.update({c: copies * batch * float(times) * v for c, v in figure.items()})
    return {"warp_instructions": warp_instructions, "counts": counts, "round_trips": trips,
            "ctas": groups * bands * batch, "planes": planes, "band": band,
            "staged_rows": sum(rows for _, rows in band_rows)}


def predict_depthwise_planes(case, dtype_name: str, device, kernel, g, path: str = "planes") -> dict:
    """The roofline of one depthwise input-gradient shape run by the planes kernel (NCHW): the
    launch's warp-instructions (:func:`planes_work`, from the loop figures of
    :func:`planes_loop_figures` at the launch's result-store columns and column phase), DRAM the
    compulsory bytes, L2 each CTA's staged out_backprop rows and filter slices and the results,
    and the latency limit the busiest warp's dependent round trips (filter and staging loops)
    in waves of resident CTAs.  Registers and occupancy are the real kernel's (``kernel``).
    ``path``: "planes" (the launcher's result-store form), "planes_direct" or "planes_staged"."""
    import importlib

    import numpy as np

    from ..backends.cuda import _sass
    from .metrics import bytes_moved
    from .static_report import DTYPES, roofline, with_latency_limit

    dw = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_input")
    dtype = DTYPES[dtype_name]
    width = dtype.itemsize
    staged = dw.planes_path_staged(g, dtype, path)
    if kernel.expression != dw.planes_expression(g, dtype, staged):
        raise ValueError(f"{kernel.expression}: not the planes instantiation of {g}")
    store_cols, phase = dw.planes_store_cols(g), g.pad_left % g.stride_cols
    load_elements = dw.planes_load_elements(g, dtype)
    lead = dw.planes_staging_lead(g, dtype)
    f = planes_loop_figures(kernel.arch, store_cols, phase, load_elements, lead)[kernel.expression]
    work = planes_work(g, np.dtype(dtype), f, staged)
    elements = math.prod(g.input_shape)
    per_element = 32 * work["warp_instructions"] / elements
    pipes = classes_per_element(work["counts"], 32 / elements)
    traffic = bytes_moved(case, g, width)
    planes, band = work["planes"], work["band"]
    taps = g.filter_rows * g.filter_cols
    # Each CTA reads its slices' staged rows (the halo rows of neighbouring bands again) and taps.
    slices = g.in_depth * g.depth_multiplier
    # The results at L2 in whole sectors: a store that writes part of a sector takes a sector's
    # transfer (the direct stores of narrow maps write 4-13 bytes of each: session 82,
    # planes_direct_store_sectors); the staged form's copy-out writes whole ones.
    result_l2 = width * elements
    if not staged:
        _, sectors, written = dw.planes_direct_store_sectors(g, dtype)
        result_l2 = result_l2 * 32 * sectors / written
    staged_reads = g.batch * slices * work["staged_rows"] * g.out_cols
    l2 = width * (staged_reads + work["ctas"] * planes * g.depth_multiplier * taps) + result_l2
    occ = _sass.occupancy(device.arch, kernel.ptxas["registers"], kernel.ptxas["shared_bytes"], dw.PLANES_THREADS)
    limits = roofline(device, elements, per_element, pipes, traffic, l2, occ["warps_per_sm"] * 32)
    with_latency_limit(limits, device, traffic, latency_limit_s(device, work["ctas"], occ, work["round_trips"]))
    return {"suite": case.suite, "label": case.label, "op": case.op, "dtype": dtype_name, "device": device.key,
            "kernel": kernel.expression, "elements": elements, "bytes": traffic, "l2_bytes": l2,
            "sass_per_element": per_element, "resident_warps_per_sm": occ["warps_per_sm"], **limits,
            "tiled": {"ctas": work["ctas"], "threads_per_cta": dw.PLANES_THREADS, "planes": planes, "band": band,
                      "store_cols": store_cols, "column_phase": phase, "load_elements": load_elements,
                      "round_trips": work["round_trips"],
                      "item_thread_instructions": f["rest"][0] + g.depth_multiplier * f["sums"][0],
                      "blocks_per_sm": occ["blocks_per_sm"]}}
