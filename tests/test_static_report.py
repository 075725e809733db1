"""The static performance report (gradops/backends/cuda/_sass.py, ``python -m gradops static-report``).

No GPU: kernels are compiled with NVRTC (cuda.core) and disassembled with nvdisasm from the
``nvidia-cuda-nvdisasm`` wheel.  The SASS analysis is tested on a hand-written listing
(tests/data/sass_fixture.sass) whose counts are known, the occupancy formula on cases worked
out by hand from cuda_occupancy.h, the roofline on round numbers, and end to end on the
fractional pooling kernel (a two-second compile).
"""

from __future__ import annotations

from gradops.backends.cuda import _build


def test_ptxas_shared_memory_is_parsed_on_sm80_lines():
    """sm_80's ptxas puts ``cmem[0]`` after ``smem`` on the "Used" line: the shared memory must
    still be read (it was reported as 0 for every sm_80 kernel)."""
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_ZN7gradops27conv2d_backprop_input_igemmI6__halffLi1ELb0EEEvPKT_S4_PS2_xxxxxxxxxxxxxxxxx' for 'sm_80'
ptxas info    : Function properties for _ZN7gradops27conv2d_backprop_input_igemmI6__halffLi1ELb0EEEvPKT_S4_PS2_xxxxxxxxxxxxxxxxx
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 43008 bytes smem, 512 bytes cmem[0]
ptxas info    : Compile time = 812.3 ms
ptxas info    : Compiling entry function '_Z1gv' for 'sm_80'
ptxas info    : Function properties for _Z1gv
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 50 registers, used 0 barriers, 464 bytes cmem[0]
"""
    stats = _build.parse_ptxas_log(log)
    assert stats["_ZN7gradops27conv2d_backprop_input_igemmI6__halffLi1ELb0EEEvPKT_S4_PS2_xxxxxxxxxxxxxxxxx"] == {
        "registers": 168, "spill_stores": 0, "spill_loads": 0, "stack_bytes": 0, "shared_bytes": 43008}
    assert stats["_Z1gv"]["shared_bytes"] == 0 and stats["_Z1gv"]["registers"] == 50
