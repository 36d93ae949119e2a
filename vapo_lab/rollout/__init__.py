"""Rollout: the built-in KV-cache sampler (and, on GPUs, vLLM)."""
