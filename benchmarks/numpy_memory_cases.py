"""Peak traced memory (tracemalloc) and times of the NumPy backend on the calls whose memory or time
session 59 bounded (cells stacked by repeated sequence entries, a 1024-column filter, one Inf in a
1000x1000 average pooling); the stacked cells also through the average forward, which sums each
cell's elements in TF's order since session 63 (time proportional to the cells' total size, as in
TF's loop: 4096 cells of 8192 elements here).  Run: PYTHONPATH=. python3 benchmarks/numpy_memory_cases.py"""
import numpy as np, gradops, tracemalloc, time, timeit
def peak(f):
    tracemalloc.start(); t=time.perf_counter(); r=f(); p=tracemalloc.get_traced_memory()[1]; tracemalloc.stop(); return r, p/2**20
n=2**13; cols=[0]*(n//2)
for shp, r, c in (((1,n,1,1),[0,n],cols), ((1,1,n,1),cols,[0,n])):
    x=np.random.default_rng(5).permutation(n).astype(np.float32).reshape(shp)
    y,p1=peak(lambda: gradops.fractional_max_pool(x,r,c,True))
    _,p2=peak(lambda: gradops.fractional_max_pool_grad(x,y,np.ones_like(y),r,c,True))
    _,p3=peak(lambda: gradops.fractional_avg_pool(x,r,c,True))
    t=min(timeit.repeat(lambda: gradops.fractional_avg_pool(x,r,c,True),number=1,repeat=3))
    print(f"max pool {shp}: forward {p1:.1f} MiB, gradient {p2:.1f} MiB; avg pool forward {p3:.1f} MiB, {t*1e3:.0f} ms")
dy=np.arange(4095,dtype=np.float32).reshape(1,1,4095,1)
_,p=peak(lambda: gradops.fractional_avg_pool_grad([1,n,1,1],dy,[0,n],[0]*4096,True)); print(f"avg grad: {p:.1f} MiB")
x=np.ones((1,1,2047,64),np.float32); d=np.ones((1,1,1024,64),np.float32)
_,p=peak(lambda: gradops.conv2d_backprop_filter(x,[1,1024,64,64],d,[1,1,1,1],"VALID")); print(f"wide filter VALID: {p:.1f} MiB")
t=min(timeit.repeat(lambda: gradops.conv2d_backprop_filter(x,[1,1024,64,64],d,[1,1,1,1],"VALID"),number=1,repeat=3)); print(f"wide filter VALID time {t:.2f} s")
rng=np.random.default_rng(0); x=rng.standard_normal((1,1000,1000,1)).astype(np.float32); x[0,5,5,0]=np.inf
rows=gradops.fractional_pooling_sequence(1000,1.44,True,1); cs=gradops.fractional_pooling_sequence(1000,1.44,True,2)
t=min(timeit.repeat(lambda: gradops.fractional_avg_pool(x,rows,cs,True),number=1,repeat=3)); print(f"avg forward 1000x1000x1 one Inf: {t*1e3:.0f} ms")
