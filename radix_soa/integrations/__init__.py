"""radix_soa inside real serving systems: each module adapts the library to
one engine's or router's own interfaces and is imported only by its users
(its dependencies are optional extras). ``sglang``: a prefix cache SGLang's
scheduler takes in place of its ``RadixCache``; ``vllm``: a subscriber of
vLLM's KV-event publisher feeding a ``RouterIndex``; ``router``: the
``radix-soa router`` HTTP service over that index."""
