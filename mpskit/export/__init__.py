"""A trained model leaving mpskit for the tools people chat with: a LoRA adapter read and merged weight by
weight, and a GGUF file (llama.cpp, LM Studio, Ollama) written a block of rows at a time from the
model's safetensors, with its architecture's metadata and its tokenizer as llama.cpp reads them.

Torch: none at module level (numpy and the gguf package).

May import: the shared modules at the bottom (mpskit/*.py), and this package.
"""
