"""Only the optional native page-hash extension lives here; everything else is in pyproject.toml.

`optional=True`: where OpenSSL's headers are missing the build skips it and hicache_ops.sglang.page_keys
falls back to its pure-Python path, which computes the same keys more slowly.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "hicache_ops.sglang._pagehash",
            sources=["src/hicache_ops/sglang/_pagehash.c"],
            libraries=["crypto"],
            extra_compile_args=["-O3"],
            optional=True,
        )
    ]
)
