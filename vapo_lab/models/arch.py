"""The embedded tiny model's shape, shared by the model builder, the base-model recipe and the
config schema (``model.arch.*``); it imports nothing, so the config can read it."""

TINY_ARCH: dict[str, int] = {
    "hidden_size": 128,
    "num_layers": 4,
    "num_heads": 4,
    "num_kv_heads": 2,
    "intermediate_size": 352,
    "max_position_embeddings": 512,
}
