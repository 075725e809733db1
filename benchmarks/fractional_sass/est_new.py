import sys, re
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from estimate import estimate
from walk import sass_lines
import numpy as np
NAMES = ["tb_ge_1", "nt_ge_batch", "no_slot", "j_skip", "size0", "finite0", "stop1", "finite1", "stop2", "finite2",
         "stop3", "finite3", "j_back", "slot_back", "t_back", "no_column", "no_positions", "empty",
         "first_c_le_1", "first_c_le_2", "first_extra_back", "no_more_rows", "loop_c_le_1", "loop_c_le_2",
         "loop_extra_back", "row_back", "pos_back"]
NAMES_SCALAR_F32 = None
def roles_for(sass, fn):
    L = sass_lines(sass, fn)
    b = [a for a, t in L if re.match(r"@!?U?P\d (BRA|EXIT)", t)]
    text = dict(L)
    staged = b[3]
    target = int(text[staged].split()[-1], 16)
    body = [x for x in b[4:-3] if x >= target]
    assert len(body) == len(NAMES), (fn, len(body))
    r = dict(zip(NAMES, body)); r["staged"] = staged; r["never"] = b[:3] + b[-3:]
    return r
sass = sys.argv[1]
for name, fn, dtype in (("f16", "I6__halfiLi8", np.float16), ("f32", "IfiLi4", np.float32)):
    R = roles_for(sass, fn)
    for shape in ((1, 112, 112, 64), (1, 56, 56, 256)):
        for ov in (False, True):
            per, p = estimate(sass, fn, R, shape, 1.44, ov, dtype)
            print(f"{name} {shape} {'overlapping' if ov else 'disjoint   '} {per:6.2f}  (tile {p.tile_height}x{p.tile_cols}x{p.block_vectors * p.vector}ch)")
