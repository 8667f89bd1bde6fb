// Package tokenizer reads Hugging Face tokenizer.json files (byte-level BPE and
// SentencePiece-style BPE with byte fallback), with the special tokens of
// tokenizer_config.json, and turns text into token ids and back, streamed or whole.
// The model loader, the backend's text path and the OpenAI server share it.
package tokenizer
