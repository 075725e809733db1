import subprocess, sys, itertools, os
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, "tests")
jobs = [(d, m, i) for d in ("float16", "bfloat16") for m in (1, 2) for i in range(11)]
env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
def run(job):
    d, m, i = job
    try:
        p = subprocess.run([sys.executable, ".gpu/diag_one.py", d, str(m), str(i)], capture_output=True, text=True,
                           timeout=40, env=env)
        out = (p.stdout + p.stderr).strip().splitlines()
        if p.returncode == 0:
            return out[-1]
        return f"FAIL rc={p.returncode} {d} m{m} case{i}:\n    " + "\n    ".join(l for l in out if "File" in l or "Error" in l or "Timeout" in l or "line" in l)[-1500:]
    except subprocess.TimeoutExpired:
        return f"KILLED {d} m{m} case{i}"
with ThreadPoolExecutor(6) as pool:
    for r in pool.map(run, jobs):
        print(r, flush=True)
