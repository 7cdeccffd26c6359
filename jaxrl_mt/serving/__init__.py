"""An OpenAI-compatible chat server on the JAX sampler (``python -m jaxrl_mt.serve``).

- ``protocol``: request validation and response bodies (no HTTP, no JAX);
- ``batcher``: gathers concurrent requests into batched sampler calls;
- ``app``: the Starlette application (routes, errors, server-sent events).
"""
