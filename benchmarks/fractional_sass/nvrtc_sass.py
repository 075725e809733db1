"""SASS of name expressions of a .cu file, compiled as gradops compiles them (NVRTC via cuda.core,
sm_90, gradops' include path and C++ standard), disassembled by cuobjdump."""
import io, subprocess, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from cuda.core import Program, ProgramOptions
from gradops.backends.cuda import _build

CUOBJDUMP = str(Path(_build.cuda_include_dirs(13)[0]).parent / "bin" / "cuobjdump")  # nvidia-cuda-cuobjdump wheel

def sass(source_dir, filename, expressions, out, arch="sm_90"):
    include = [str(source_dir)] + _build.cuda_include_dirs(13)
    options = ProgramOptions(name=filename, arch=arch, std=_build.CXX_STD, include_path=include, ptxas_options=["-v"])
    program = Program((Path(source_dir) / filename).read_text(), "c++", options)
    log = io.StringIO()
    code = program.compile("cubin", name_expressions=tuple(expressions), logs=log)
    names = {e: code._sym_map[e] if hasattr(code, "_sym_map") else None for e in expressions}
    Path(out + ".cubin").write_bytes(code.code)
    Path(out + ".log").write_text(log.getvalue())
    Path(out + ".sass").write_text(subprocess.run([CUOBJDUMP, "-sass", out + ".cubin"], capture_output=True, text=True, check=True).stdout)
    return log.getvalue()

if __name__ == "__main__":
    src, out, *exprs = sys.argv[1:]
    print(sass(src, "fractional_avg_pool_grad.cu", exprs, out))
