"""The local stack: SGLang-protocol test servers (gold replay, tiny CPU model) behind the real sglang-router."""
