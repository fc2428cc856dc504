"""An experiment behind views/later.py's design (issue 39; results in bench/RESULTS.md, 2026-12-06):
does a thread that reads small device arrays (as the values thread reads a shown view's values) slow
the main thread's dispatch loop, which way of reading costs it least, and what one device-to-host
read and one small program's dispatch cost on this host. Prints per-step times for: the step alone;
the step and a small summary program; a reader thread reading each summary (np.asarray; after
block_until_ready; after copy_to_host_async); a reader holding the GIL 150 µs (pure Python); a
reader that sleeps. Run: `python bench/thread_reads.py` (JAX_PLATFORMS=cpu here, as is on a TPU host).
"""
import queue, threading, time, statistics
import numpy as np
import jax, jax.numpy as jnp
print(jax.devices())
x0 = jnp.ones((8, 128), jnp.float32) / 128
w = jnp.eye(128, dtype=jnp.float32)
step = jax.jit(lambda x, w: jnp.tanh(x @ w))
heads = jax.jit(lambda x: x.reshape(-1)[:4])
N = 1000

def loop(reader, with_heads=True):
    q = queue.SimpleQueue()
    t = None
    if reader is not None:
        def work():
            while True:
                h = q.get()
                if h is None: return
                reader(h)
        t = threading.Thread(target=work); t.start()
    x = x0
    s = time.perf_counter()
    for _ in range(N):
        x = step(x, w)
        if with_heads:
            h = heads(x)
            if reader is not None: q.put(h)
    x.block_until_ready()
    main_done = time.perf_counter() - s
    if t is not None:
        q.put(None); t.join()
    total = time.perf_counter() - s
    return main_done / N * 1e6, total / N * 1e6

def plain(h): np.asarray(h)
def bur(h): h.block_until_ready(); np.asarray(h)
def early(h): h.copy_to_host_async(); h.block_until_ready(); np.asarray(h)
def busy(h):
    e = time.perf_counter() + 150e-6
    while time.perf_counter() < e: pass
def sleepy(h): time.sleep(0.0005)

for rnd in range(2):
    rows = {
        "step only": loop(None, False),
        "step+heads, no reader": loop(None, True),
        "reader np.asarray": loop(plain),
        "reader block_until_ready+asarray": loop(bur),
        "reader copy_async+bur+asarray": loop(early),
        "reader 150us python busy": loop(busy),
        "reader sleeps 0.5ms": loop(sleepy),
    }
    for k, (m, t) in rows.items():
        print(f"{rnd} {k:36s} main {m:8.1f} us/step   until reader done {t:8.1f}")
# D2H latency alone, in the main thread
x = step(x0, w); x.block_until_ready()
lat = []
for _ in range(200):
    h = heads(x); h.block_until_ready()
    s = time.perf_counter(); np.asarray(h); lat.append(time.perf_counter() - s)
print("D2H of a ready 4-value array in main: median %.1f us" % (statistics.median(lat) * 1e6))
lat = []
for _ in range(200):
    s = time.perf_counter(); h = heads(x); lat.append(time.perf_counter() - s)
print("heads dispatch: median %.1f us" % (statistics.median(lat) * 1e6))
