"""Models: the embedded tiny Qwen2 and its tokenizer, the value model, loading, the plan's sizes."""
