"""The embedded tiered cache (L1 device, L2 host, L3 store) that behaves like SGLang's HiCache."""
