"""The LLM proxy: many processes on one port, no connection caps, in front of many SGLang engines.

It routes (session affinity, least load), guards context length, propagates aborts, stamps every
answer with the engine and weight version that produced it, and runs per-pool weight updates as
one transaction.
"""
