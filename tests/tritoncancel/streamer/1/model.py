"""Streams request_output_len responses of one token each, as gollm does (see
../config.pbtxt): the responses come from a thread, not from execute, and a cancelled
request ends with a CANCELLED error response flagged final."""

import os
import sys
import threading
import time

# The stub's embedded Python ignores PYTHONPATH: the test names numpy's folder here.
sys.path[:0] = [p for p in os.environ.get("GOLLM_PYTHONPATH", "").split(os.pathsep) if p]

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "request_output_len").as_numpy().reshape(-1)[0])
            sender = request.get_response_sender()
            t = threading.Thread(target=self.stream, args=(sender, n), daemon=True)
            t.start()
            self.threads.append(t)
        self.threads = [t for t in self.threads if t.is_alive()]
        return None

    def stream(self, sender, n):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for i in range(n):
            if sender.is_cancelled():
                err = pb_utils.TritonError("request cancelled", pb_utils.TritonError.CANCELLED)
                sender.send(pb_utils.InferenceResponse(error=err), flags=final)
                return
            out = pb_utils.Tensor("output_ids", np.array([[i % 1000]], dtype=np.int32))
            length = pb_utils.Tensor("sequence_length", np.array([1], dtype=np.int32))
            sender.send(pb_utils.InferenceResponse(output_tensors=[out, length]))
            time.sleep(0.0003)
        sender.send(flags=final)

    def finalize(self):
        for t in self.threads:
            t.join(timeout=5)
