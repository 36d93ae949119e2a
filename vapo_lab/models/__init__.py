"""Models: the embedded tiny Qwen2 model and its locally built tokenizer, the value model, loading."""
