"""The autoregressive engine (LLM and VLM generation, the edgefm-llm tool and the cloud's vqa task): SmolLM2 /
SmolVLM2 generation over a static KV cache (generate), the cache and its prefix store (kv_cache), GGUF
files (gguf_loader) and EAGLE-3 style speculative decoding (speculative). Kernels through dispatch/; weight
loading and image preprocessing shared with the SmolVLA runtime; no ROS."""
