"""`policy=transformer`: a tiny causal LM whose engine (KV-cache sampling in low precision) and
trainer (one fp32 teacher-forced pass) compute the same logits by different routes. world.py is the
protocol; model.py the network; kv_cache.py the engine's cache; sft.py the warm start."""
