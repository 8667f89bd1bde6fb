"""Stream tokens from gollm over gRPC with Triton's own Python client.

    PYTHONPATH=.deps/py python3 examples/stream_client.py "Hello, my name is" 16

GOLLM_MODEL names the model (default austen, the demo model); its tokenizer is read from
model_repository/<model>/1/tokenizer.json.

The tensors are the TensorRT-LLM backend's: input_ids, input_lengths,
request_output_len, streaming; each response carries the new output_ids.
"""
import os
import queue
import sys

import numpy as np
import tritonclient.grpc as grpcclient
from tokenizers import Tokenizer

url = os.environ.get("GOLLM_GRPC_URL", "localhost:8001")
prompt = sys.argv[1] if len(sys.argv) > 1 else "Hello, my name is"
max_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 16
model = os.environ.get("GOLLM_MODEL", "austen")
tok = Tokenizer.from_file(f"model_repository/{model}/1/tokenizer.json")
ids = np.array([tok.encode(prompt).ids], dtype=np.int32)


def tensor(name, value, dtype):
    t = grpcclient.InferInput(name, value.shape, dtype)
    t.set_data_from_numpy(value)
    return t


inputs = [
    tensor("input_ids", ids, "INT32"),
    tensor("input_lengths", np.array([[ids.shape[1]]], dtype=np.int32), "INT32"),
    tensor("request_output_len", np.array([[max_tokens]], dtype=np.int32), "INT32"),
    tensor("streaming", np.array([[True]]), "BOOL"),
]
results = queue.Queue()
client = grpcclient.InferenceServerClient(url)
client.start_stream(callback=lambda result, error: results.put((result, error)))
client.async_stream_infer(model, inputs, request_id="1", enable_empty_final_response=True)
tokens = []
while True:
    result, error = results.get(timeout=60)
    if error is not None:
        sys.exit(f"error: {error}")
    new = result.as_numpy("output_ids")
    if new is not None and new.size:
        tokens += new.flatten().tolist()
        print(new.flatten().tolist(), repr(tok.decode(tokens)))
    if result.get_response().parameters["triton_final_response"].bool_param:
        break
client.stop_stream()
