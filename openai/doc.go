// Package openai is gollm's OpenAI-compatible HTTP API (/v1/models, /v1/completions,
// /v1/chat/completions, /health) in front of a running tritonserver, over Triton's
// gRPC API (the kserve package): each OpenAI request becomes one or more streaming
// ModelStreamInfer requests on a gollm model's text tensors. Chat prompts are rendered
// with the chat template of the model's checkpoint (tokenizer_config.json).
package openai
