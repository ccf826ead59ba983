"""A stand-in for SGLang engines, written from SGLang's published HTTP API.

``sim`` mode models continuous batching (prefill and decode time, KV capacity, context length);
``scripted`` mode answers from a file of canned replies, for end-to-end tests of agents.
"""
