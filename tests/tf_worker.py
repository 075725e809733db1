"""A TensorFlow process for calls that may crash it (tests/test_tf_parity.py's hostile soak).

TF 2.21 aborts the whole process on some invalid calls (CHECK failures); the soak sends each
call here through a pipe and starts a new worker when one dies, so a TF crash is a finding,
not the end of the test run."""
from __future__ import annotations

import multiprocessing
import os


def serve(connection):
    """Runs ``tf.raw_ops.<name>(**arguments)`` for each (name, arguments) received; answers
    ("ok", result) or ("refused", error type name, message)."""
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"  # the stock kernels, as conftest sets for the tests
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import tensorflow as tf

    while True:
        try:
            name, arguments = connection.recv()
        except EOFError:
            return
        try:
            connection.send(("ok", getattr(tf.raw_ops, name)(**arguments).numpy()))
        except Exception as error:  # noqa: BLE001 - every refusal is an answer
            connection.send(("refused", type(error).__name__, str(error)))


class TFWorker:
    """One worker process at a time; :meth:`call` answers ("crashed", reason) where it died."""

    def __init__(self, timeout_s: float = 120.0):
        self.timeout_s = timeout_s
        self._start()

    def _start(self):
        context = multiprocessing.get_context("spawn")
        self.connection, theirs = context.Pipe()
        self.process = context.Process(target=serve, args=(theirs,), daemon=True)
        self.process.start()

    def call(self, name: str, arguments: dict):
        try:
            self.connection.send((name, arguments))
            if not self.connection.poll(self.timeout_s):
                raise TimeoutError(f"no answer in {self.timeout_s} s")
            return self.connection.recv()
        except (EOFError, OSError, TimeoutError) as error:
            self.close()
            self._start()
            return ("crashed", f"{type(error).__name__}: {error}")

    def close(self):
        self.process.kill()
        self.process.join()
