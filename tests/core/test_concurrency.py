"""One shared model, several threads tracing different inputs at the same time."""

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tests.core.tiny_models import image, tiny_encoder, tiny_vit

N_THREADS = 6
ROUNDS = 8


def _same(a, b):
    assert a.names == b.names and a.tokens == b.tokens
    for name in a.names:
        np.testing.assert_array_equal(a[name], b[name])


def _run_concurrently(job, inputs):
    barrier = threading.Barrier(N_THREADS)

    def worker(i):
        results = []
        for _ in range(ROUNDS):
            barrier.wait()  # every thread enters the forward pass together
            results.append(job(inputs[i]))
        return results

    with ThreadPoolExecutor(N_THREADS) as pool:
        return list(pool.map(worker, range(N_THREADS)))


def test_concurrent_text_traces_equal_sequential_ones():
    model = tiny_encoder()
    # Different lengths too, so a trace that picked up another thread's tensors would not even fit.
    inputs = [list(range(1 + i, 4 + 2 * i)) for i in range(N_THREADS)]
    sequential = [model.trace(x) for x in inputs]
    for i, results in enumerate(_run_concurrently(model.trace, inputs)):
        for trace in results:
            _same(trace, sequential[i])


def test_concurrent_image_traces_equal_sequential_ones():
    model = tiny_vit()
    inputs = [image(seed) for seed in range(N_THREADS)]
    sequential = [model.trace(x) for x in inputs]
    for i, results in enumerate(_run_concurrently(model.trace, inputs)):
        for trace in results:
            _same(trace, sequential[i])
    # The inputs really differ, so equality above is not trivially true.
    assert not np.array_equal(sequential[0].attention(1, 0), sequential[1].attention(1, 0))
